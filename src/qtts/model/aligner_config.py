"""Configuration of a Qwen3-ForcedAligner snapshot (``config.json`` of ``Qwen/Qwen3-ForcedAligner-0.6B``).

The file nests like the official ``Qwen3ASRConfig`` (qwen-asr 0.0.6): the top level holds the
timestamp facts (``timestamp_token_id``, ``timestamp_segment_time``), ``thinker_config`` the token
ids and the 5000-way head (``classify_num``), ``thinker_config.audio_config`` the audio encoder
and ``thinker_config.text_config`` the Qwen3 decoder. One dataclass per block; defaults are the
official config classes' defaults where the published file may omit a key. docs/timestamps.md
says where every number of the published file comes from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import _from_dict, _read_json
from ..errors import ConfigError

#: the aligner's input: mono 16 kHz audio, one log-mel frame per 160 samples (10 ms)
ALIGNER_SAMPLE_RATE = 16000
ALIGNER_HOP = 160
ALIGNER_N_FFT = 400


@dataclass
class AlignerAudioConfig:
    """The audio encoder (``audio_config``): 3 stride-2 convs, a bidirectional transformer, a 2-layer projector."""

    d_model: int  # transformer width
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    output_dim: int  # projector output = the decoder's hidden size
    num_mel_bins: int = 128  # log-mel channels of the 16 kHz features
    n_window: int = 50  # the convs see chunks of 2 * n_window mel frames (1 s)
    n_window_infer: int = 800  # attention window of the flash-attention path only (see docs/timestamps.md)
    max_source_positions: int = 1500  # rows of the sinusoidal position table (per chunk)
    downsample_hidden_size: int = 480  # conv channels
    activation_function: str = "gelu"
    scale_embedding: bool = False

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window


@dataclass
class AlignerTextConfig:
    """The Qwen3 decoder (``text_config``); field names match what :class:`qtts.model.layers.DecoderLayer` reads."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    hidden_act: str = "silu"
    attention_bias: bool = False
    tie_word_embeddings: bool = False


@dataclass
class AlignerConfig:
    """Everything qtts reads from an aligner snapshot's config.json."""

    timestamp_token_id: int  # '<timestamp>': the positions whose logits are read
    timestamp_segment_time: float  # milliseconds per class of the head (80)
    classify_num: int  # classes of the head: times 0 .. (classify_num - 1) * segment
    audio_token_id: int  # '<|audio_pad|>': replaced by the audio encoder's outputs
    audio_start_token_id: int | None = None
    audio_end_token_id: int | None = None
    support_languages: list = field(default_factory=list)
    audio: AlignerAudioConfig = field(default=None, metadata={"nested": True})
    text: AlignerTextConfig = field(default=None, metadata={"nested": True})
    source_dir: str | None = field(default=None, metadata={"nested": True})

    @classmethod
    def from_dict(cls, data: dict, where: str = "config.json") -> AlignerConfig:
        thinker = data.get("thinker_config")
        if not isinstance(thinker, dict):
            raise ConfigError(f"{where}: missing 'thinker_config'; is this a Qwen3-ForcedAligner snapshot?")
        if "classify_num" not in thinker:
            raise ConfigError(
                f"{where}: thinker_config has no 'classify_num': this is a Qwen3-ASR (transcription) "
                "snapshot, not Qwen3-ForcedAligner; pass the aligner's snapshot directory"
            )
        flat = {**thinker, **{k: v for k, v in data.items() if k != "thinker_config"}}
        cfg = _from_dict(cls, flat, where)
        cfg.audio = _from_dict(AlignerAudioConfig, thinker.get("audio_config"), f"{where}: thinker_config.audio_config")
        cfg.text = _from_dict(AlignerTextConfig, thinker.get("text_config"), f"{where}: thinker_config.text_config")
        _check(cfg, where)
        return cfg

    @classmethod
    def from_dir(cls, path: str) -> AlignerConfig:
        if not os.path.isdir(path):
            raise ConfigError(f"{path}: not a directory; pass a Qwen3-ForcedAligner snapshot directory")
        cfg_path = os.path.join(path, "config.json")
        cfg = cls.from_dict(_read_json(cfg_path), cfg_path)
        cfg.source_dir = os.path.abspath(path)
        return cfg


def _check(cfg: AlignerConfig, where: str) -> None:
    a, t = cfg.audio, cfg.text
    problems = []
    if a.d_model % a.encoder_attention_heads:
        problems.append(f"audio d_model {a.d_model} is not divisible by {a.encoder_attention_heads} heads")
    if a.output_dim != t.hidden_size:
        problems.append(f"audio output_dim {a.output_dim} != text hidden_size {t.hidden_size}")
    if t.num_attention_heads % t.num_key_value_heads:
        problems.append(f"{t.num_attention_heads} attention heads are not a multiple of {t.num_key_value_heads} kv heads")
    if a.activation_function != "gelu" or t.hidden_act != "silu":
        problems.append(f"activations {a.activation_function}/{t.hidden_act} (qtts implements gelu/silu)")
    if t.attention_bias or t.tie_word_embeddings:
        problems.append("attention_bias / tie_word_embeddings (the published aligner has neither)")
    if a.scale_embedding:
        problems.append("scale_embedding (the published aligner has none)")
    if cfg.timestamp_segment_time <= 0 or cfg.classify_num <= 0:
        problems.append("timestamp_segment_time and classify_num must be positive")
    if problems:
        raise ConfigError(f"{where}: unsupported aligner config: " + "; ".join(problems))
