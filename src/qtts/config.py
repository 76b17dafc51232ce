"""Model configuration read from a checkpoint snapshot.

One dataclass per config block of the official files:

* ``config.json`` -> :class:`ModelConfig` (top level), :class:`TalkerConfig` (``talker_config``),
  :class:`PredictorConfig` (``talker_config.code_predictor_config``),
  :class:`SpeakerEncoderConfig` (``speaker_encoder_config``, Base checkpoints only);
* ``generation_config.json`` -> :class:`GenerationConfig`;
* ``speech_tokenizer/config.json`` -> :class:`SpeechTokenizerConfig` with
  :class:`DecoderConfig` (``decoder_config``) and :class:`EncoderConfig` (``encoder_config``).

Unknown keys are ignored (the official files carry many transformers bookkeeping keys);
a missing required key raises :class:`~qtts.errors.ConfigError` naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

#: Frame facts shared by every Qwen3-TTS-12Hz checkpoint (the one place they are written down):
#: 24 kHz mono audio, one codec frame = 1920 samples = 80 ms (12.5 frames per second), each frame
#: 16 codebooks (code 0 from the talker, 1..15 from the predictor) of 2048 entries.
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME
NUM_CODEBOOKS = 16
CODEBOOK_SIZE = 2048
PREDICTOR_STEPS = NUM_CODEBOOKS - 1

_MISSING = dataclasses.MISSING


def _from_dict(cls, data: Any, where: str):
    """Build dataclass ``cls`` from ``data``; ``where`` is 'file: block' for error messages."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("nested"):
            continue
        if f.name in data and data[f.name] is not None:
            kwargs[f.name] = data[f.name]
        elif f.default is _MISSING and f.default_factory is _MISSING:
            raise ConfigError(
                f"{where}: missing required key '{f.name}'; "
                "is this an official Qwen3-TTS-12Hz snapshot file?"
            )
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: file not found; a Qwen3-TTS snapshot directory must contain it")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc


@dataclass
class PredictorConfig:
    """The code predictor ("sub-talker"): 5 Qwen3 layers predicting codebooks 1..15."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    vocab_size: int = 2048
    num_code_groups: int = 16


@dataclass
class TalkerConfig:
    """The talker: a Qwen3 decoder over text+codec embeddings predicting codebook 0."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    text_hidden_size: int
    codec_eos_token_id: int
    codec_pad_id: int
    codec_bos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    vocab_size: int = 3072
    text_vocab_size: int = 151936
    num_code_groups: int = 16
    max_position_embeddings: int = 32768
    codec_language_id: dict = field(default_factory=dict)
    spk_id: dict = field(default_factory=dict)
    spk_is_dialect: dict = field(default_factory=dict)
    code_predictor_config: PredictorConfig = field(default=None, metadata={"nested": True})

    @property
    def predictor(self) -> PredictorConfig:
        return self.code_predictor_config

    def speaker_token(self, name: str) -> int:
        """Codec id of a CustomVoice speaker (config values may be ints or 1-element lists)."""
        value = self.spk_id[name]
        return int(value[0] if isinstance(value, (list, tuple)) else value)


@dataclass
class SpeakerEncoderConfig:
    """ECAPA-TDNN x-vector encoder; only enc_dim/sample_rate are in real files, rest are class defaults."""

    enc_dim: int
    sample_rate: int = 24000
    mel_dim: int = 128
    enc_channels: list = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128


@dataclass
class GenerationConfig:
    """Sampling defaults from generation_config.json (official values as fallbacks)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 8192


@dataclass
class DecoderConfig:
    """Speech-tokenizer decoder (codes -> 24 kHz waveform)."""

    latent_dim: int
    codebook_dim: int
    codebook_size: int
    decoder_dim: int
    hidden_size: int
    intermediate_size: int
    head_dim: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    upsample_rates: list
    upsampling_ratios: list
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    vector_quantization_hidden_dimension: int = 512
    semantic_codebook_size: int = 4096  # present in the files, unused by the official code

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in list(self.upsample_rates) + list(self.upsampling_ratios):
            n *= int(r)
        return n


@dataclass
class EncoderConfig:
    """Speech-tokenizer encoder (Mimi-based; 24 kHz audio -> 16 codebooks at 12.5 Hz)."""

    hidden_size: int
    num_filters: int
    intermediate_size: int
    head_dim: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    codebook_dim: int
    codebook_size: int
    upsampling_ratios: list
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    vector_quantization_hidden_dimension: int = 256
    audio_channels: int = 1
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    num_residual_layers: int = 1
    compress: int = 2
    use_conv_shortcut: bool = False
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    upsample_groups: int = 512
    sampling_rate: int = 24000
    _frame_rate: float = 12.5

    @property
    def frame_rate(self) -> float:
        return float(self._frame_rate)


@dataclass
class SpeechTokenizerConfig:
    decoder_config: DecoderConfig = field(metadata={"nested": True})
    encoder_config: EncoderConfig = field(metadata={"nested": True})
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @classmethod
    def from_file(cls, path: str) -> SpeechTokenizerConfig:
        data = _read_json(path)
        dec = _from_dict(DecoderConfig, data.get("decoder_config"), f"{path}: decoder_config")
        enc = _from_dict(EncoderConfig, data.get("encoder_config"), f"{path}: encoder_config")
        top = {k: v for k, v in data.items() if k not in ("decoder_config", "encoder_config")}
        kwargs = {
            f.name: top[f.name]
            for f in dataclasses.fields(cls)
            if not f.metadata.get("nested") and f.name in top
        }
        return cls(decoder_config=dec, encoder_config=enc, **kwargs)


MODEL_TYPES = ("base", "custom_voice", "voice_design")


@dataclass
class ModelConfig:
    """Everything qtts reads from a snapshot directory."""

    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    tts_model_type: str
    tts_model_size: str
    assistant_token_id: int = 77091
    talker_config: TalkerConfig = field(default=None, metadata={"nested": True})
    speaker_encoder_config: SpeakerEncoderConfig | None = field(default=None, metadata={"nested": True})
    generation: GenerationConfig = field(default_factory=GenerationConfig, metadata={"nested": True})
    speech_tokenizer: SpeechTokenizerConfig | None = field(default=None, metadata={"nested": True})
    source_dir: str | None = field(default=None, metadata={"nested": True})

    @property
    def talker(self) -> TalkerConfig:
        return self.talker_config

    @property
    def predictor(self) -> PredictorConfig:
        return self.talker_config.code_predictor_config

    @property
    def speaker_encoder(self) -> SpeakerEncoderConfig | None:
        return self.speaker_encoder_config

    @classmethod
    def from_dict(cls, data: dict, where: str = "config.json") -> ModelConfig:
        cfg = _from_dict(cls, data, where)
        if cfg.tts_model_type not in MODEL_TYPES:
            raise ConfigError(
                f"{where}: tts_model_type '{cfg.tts_model_type}' is not one of {', '.join(MODEL_TYPES)}"
            )
        talker = data.get("talker_config")
        if talker is None:
            raise ConfigError(f"{where}: missing required key 'talker_config'")
        cfg.talker_config = _from_dict(TalkerConfig, talker, f"{where}: talker_config")
        cfg.talker_config.code_predictor_config = _from_dict(
            PredictorConfig,
            talker.get("code_predictor_config"),
            f"{where}: talker_config.code_predictor_config",
        )
        spk = data.get("speaker_encoder_config")
        if spk:
            cfg.speaker_encoder_config = _from_dict(
                SpeakerEncoderConfig, spk, f"{where}: speaker_encoder_config"
            )
        return cfg

    @classmethod
    def from_dir(cls, path: str, *, speech_tokenizer: bool = True) -> ModelConfig:
        """Read config.json, generation_config.json (optional) and speech_tokenizer/config.json."""
        if not os.path.isdir(path):
            raise ConfigError(f"{path}: not a directory; pass a Qwen3-TTS snapshot directory")
        cfg_path = os.path.join(path, "config.json")
        cfg = cls.from_dict(_read_json(cfg_path), cfg_path)
        gen_path = os.path.join(path, "generation_config.json")
        if os.path.isfile(gen_path):
            cfg.generation = _from_dict(GenerationConfig, _read_json(gen_path), gen_path)
        if speech_tokenizer:
            st_path = os.path.join(path, "speech_tokenizer", "config.json")
            cfg.speech_tokenizer = SpeechTokenizerConfig.from_file(st_path)
        cfg.source_dir = os.path.abspath(path)
        return cfg

    @property
    def languages(self) -> list[str]:
        """Language names the checkpoint accepts ('auto' plus codec_language_id keys)."""
        return ["auto"] + sorted(self.talker_config.codec_language_id)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.talker_config.spk_id)
