"""Random-weight Qwen3-ForcedAligner snapshots in the real layout (``qtts random-checkpoint --kind forced_aligner``).

Writes ``config.json``, ``preprocessor_config.json``, ``tokenizer_config.json``, the tokenizer
(the real Qwen2 ``vocab.json`` + ``merges.txt`` from ``tokenizer_dir``, or the byte-level stand-in
``tokenizer.json``) and ``model.safetensors`` with the key names of the official checkpoint
(``thinker.audio_tower.*``, ``thinker.model.*``, ``thinker.lm_head.weight``).

No aligner file can be downloaded here, so :func:`aligner_config_dict` is assembled from public
information; docs/timestamps.md names the source of every number. ``full`` keeps every published
dimension (0.6B: ~2.4 GB fp32); ``tiny`` shrinks widths and layers but keeps every id, the text
vocabulary (152064), the 5000 timestamp classes, the 80 ms segment, 128 mel bins and the 100-frame
conv chunk, so prompts, features and decoding are the real ones.
"""

from __future__ import annotations

import copy
import json
import os

from ..model.aligner_config import AlignerConfig

_GAIN = 1.5  # fan-in gain of the random matrices (see _edits)
# ids of config.json's published thinker_config and top level
TIMESTAMP_ID, AUDIO_START_ID, AUDIO_END_ID, AUDIO_PAD_ID = 151705, 151669, 151670, 151676

_PUBLISHED = {
    "architectures": ["Qwen3ASRForConditionalGeneration"],
    "model_type": "qwen3_asr",
    "timestamp_token_id": TIMESTAMP_ID,
    "timestamp_segment_time": 80,
    "support_languages": ["Chinese", "English", "Cantonese", "French", "German", "Italian", "Japanese",
                          "Korean", "Portuguese", "Russian", "Spanish"],  # fmt: skip
    "thinker_config": {
        "model_type": "qwen3_forced_aligner",
        "classify_num": 5000,
        "audio_token_id": AUDIO_PAD_ID,
        "audio_start_token_id": AUDIO_START_ID,
        "audio_end_token_id": AUDIO_END_ID,
        "audio_config": {
            "num_mel_bins": 128, "encoder_layers": 24, "encoder_attention_heads": 16, "encoder_ffn_dim": 4096,
            "d_model": 1024, "output_dim": 1024, "downsample_hidden_size": 480, "n_window": 50,
            "n_window_infer": 800, "max_source_positions": 1500, "scale_embedding": False,
            "activation_function": "gelu",
        },
        "text_config": {
            "vocab_size": 152064, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
            "rope_scaling": {"interleaved": True, "mrope_interleaved": True, "mrope_section": [24, 20, 20],
                             "rope_type": "default"},
        },
    },
}  # fmt: skip

_PREPROCESSOR = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "Qwen3ASRProcessor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 30,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "dither": 0.0,
}


def aligner_config_dict(size: str) -> dict:
    """``config.json`` of a random aligner: the published dimensions, or ``tiny`` ones."""
    cfg = copy.deepcopy(_PUBLISHED)
    if size == "full":
        return cfg
    if size != "tiny":
        from ..errors import InputError

        raise InputError(f"size '{size}' is not made for the aligner; use tiny (tests) or full (benchmarks)")
    thinker = cfg["thinker_config"]
    thinker["audio_config"].update(encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
                                   output_dim=32, downsample_hidden_size=8)  # fmt: skip
    thinker["text_config"].update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16)  # fmt: skip
    # mrope sections sum to head_dim / 2; with identical t/h/w positions they do not matter
    thinker["text_config"]["rope_scaling"]["mrope_section"] = [4, 2, 2]
    return cfg


def tokenizer_config_dict(base: dict) -> dict:
    """The aligner's tokenizer_config.json: Qwen3's added tokens (from ``base``, a Qwen3-TTS
    tokenizer_config) up to ``<|audio_end|>``, ``<|audio_pad|>`` and ``<timestamp>`` at their published
    ids, and reserved placeholders for the ids between them (their names are not public; the
    aligner's prompt never uses them), so every id stays where the real tokenizer puts it."""
    decoder = {k: v for k, v in base["added_tokens_decoder"].items() if int(k) <= AUDIO_END_ID}
    named = {AUDIO_PAD_ID: ("<|audio_pad|>", True), TIMESTAMP_ID: ("<timestamp>", True)}
    for idx in range(AUDIO_END_ID + 1, TIMESTAMP_ID + 1):
        content, special = named.get(idx, (f"<|qtts_reserved_{idx}|>", True))
        decoder[str(idx)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": special}  # fmt: skip
    extra = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
    keep = ("add_bos_token", "add_prefix_space", "bos_token", "clean_up_tokenization_spaces", "eos_token", "errors",
            "model_max_length", "pad_token", "split_special_tokens", "tokenizer_class", "unk_token")  # fmt: skip
    out = {k: base[k] for k in keep if k in base}
    out.update(added_tokens_decoder=decoder, extra_special_tokens=extra, **extra)
    return out


def write_aligner_files(tmp: str, size: str, seed: int, tokenizer_dir: str | None, dtype: str, base_tok: dict) -> None:
    """Fill the empty folder ``tmp`` with a random aligner snapshot (``base_tok``: a Qwen3-TTS tokenizer_config)."""
    import shutil

    from . import random_weights as rw

    cfg_dict = aligner_config_dict(size)
    tok_cfg = tokenizer_config_dict(base_tok)
    for name, data in (("config.json", cfg_dict), ("preprocessor_config.json", _PREPROCESSOR),
                       ("tokenizer_config.json", tok_cfg)):  # fmt: skip
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
    if tokenizer_dir is not None:
        for fname in ("vocab.json", "merges.txt"):
            shutil.copyfile(os.path.join(tokenizer_dir, fname), os.path.join(tmp, fname))
    else:
        from .standin_tokenizer import write_standin_tokenizer

        write_standin_tokenizer(tmp, tok_cfg)
    specs = rw.aligner_specs(AlignerConfig.from_dict(copy.deepcopy(cfg_dict)))
    std = 0.05 if size == "tiny" else 0.02
    rw.write_safetensors(os.path.join(tmp, "model.safetensors"), specs, seed, std, dtype, {}, _edits(specs, seed, std))


def _edits(specs, seed: int, std: float) -> dict:
    """Edits that keep random timestamps informative (flat N(0, std) weights make every marker's
    hidden state nearly the same vector, whatever the audio, so every marker gets the same class):

    * every matrix and conv kernel is fan-in scaled (std 1.5 / sqrt(fan_in)), so activations stay
      O(1) through the conv stack and both transformers and the audio reaches the markers;
    * token embeddings are N(0, 1), and the ``<timestamp>`` row is zero: the markers' states then
      come from their context (the audio and the words before them), not from their own embedding;
    * ``ln_post`` has no 'norm' in its name: its weight gets the near-1 values of the other norms.
    """
    import math

    import torch

    def fan_in(shape):
        def fn(w):
            return w * (_GAIN / math.sqrt(math.prod(shape[1:])) / std)

        return fn

    def embeddings(w):
        w = w / std
        w[TIMESTAMP_ID] = 0.0
        return w

    def near_one(w):
        gen = torch.Generator().manual_seed(int(seed) + 7)
        return 1.0 + 0.1 * torch.randn(w.shape, generator=gen)

    edits = {s.name: fan_in(s.shape) for s in specs if len(s.shape) >= 2}
    edits.update({s.name: near_one for s in specs if s.name.endswith("ln_post.weight")})
    edits["thinker.model.embed_tokens.weight"] = embeddings
    return edits
