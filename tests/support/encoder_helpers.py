"""Shared builders for the encoder tests: tiny official modules with random weights copied into ours."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import torch

from conftest import reference
from qtts.config import EncoderConfig, SpeakerEncoderConfig, _from_dict
from qtts.model.speaker import SpeakerEncoder
from qtts.model.speech_encoder import Encoder
from support import official

TINY = dict(
    enc_dim=32, sample_rate=24000, mel_dim=128, enc_channels=[16, 16, 16, 16, 48],
    enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=8,
    enc_res2net_scale=8, enc_se_channels=8,
)  # fmt: skip


def official_speaker_module():
    official.qwen_tts()
    from qwen_tts.core.models import modeling_qwen3_tts as m
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig

    return m, Qwen3TTSSpeakerEncoderConfig


def speaker_wav(seconds: float, seed: int, silent_tail: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * 24000)
    t = np.arange(n) / 24000
    f0 = 110 + 60 * np.sin(2 * np.pi * 0.7 * t)
    y = 0.3 * np.sin(2 * np.pi * np.cumsum(f0) / 24000) + 0.05 * rng.standard_normal(n)
    y *= 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2
    if silent_tail:
        y[-int(silent_tail * 24000) :] = 0.0
    return y.astype(np.float32)


def official_speaker_pair():
    """(official module namespace, official tiny speaker encoder, ours with the same weights)."""
    m, cfg_cls = official_speaker_module()
    torch.manual_seed(0)
    ref = m.Qwen3TTSSpeakerEncoder(cfg_cls(**TINY)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    ours = SpeakerEncoder(SpeakerEncoderConfig(**TINY)).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return m, ref, ours


def codec_wav(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * 24000)
    t = np.arange(n) / 24000
    y = 0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t) + 0.05 * rng.standard_normal(n)
    return y.astype(np.float32)


def feature_extractor():
    from transformers import EncodecFeatureExtractor

    return EncodecFeatureExtractor(
        feature_size=1, sampling_rate=24000, padding_value=0.0, return_attention_mask=True
    )


def official_tokenizer_pair(sliding_window: int = 250):
    """Official tokenizer built directly with a tiny config (here: a tiny sliding window)."""
    official.qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    path = reference("configs", "Qwen3-TTS-12Hz-0.6B-Base", "speech_tokenizer", "config.json")
    with open(path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    cfg["decoder_config"].update(
        latent_dim=16, codebook_dim=8, hidden_size=16, intermediate_size=32, head_dim=8,
        num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1, decoder_dim=16,
        vector_quantization_hidden_dimension=8,
    )  # fmt: skip
    enc = cfg["encoder_config"]
    enc.update(
        hidden_size=32, num_filters=4, intermediate_size=64, head_dim=8, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, codebook_dim=8, sliding_window=sliding_window,
        vector_quantization_hidden_dimension=8, upsample_groups=32,
    )  # fmt: skip
    ref = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**copy.deepcopy(cfg))).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in ref.encoder.named_parameters():
            if name.endswith(".scale") or "norm" in name:
                continue  # LayerScale 0.01, LayerNorm identity
            if p.dim() >= 2:  # fan-in scaled so the quantizer sees O(1) inputs (diverse codes)
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / math.sqrt(p[0].numel()))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for name, b in ref.encoder.named_buffers():
            if name.endswith("cluster_usage"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))
    ours = Encoder(_from_dict(EncoderConfig, enc, "tiny"), cfg["encoder_valid_num_quantizers"]).eval()
    prefix = "encoder."
    state = {k[len(prefix) :]: v for k, v in ref.state_dict().items() if k.startswith(prefix)}
    ours.load_state_dict(state, strict=True)
    return ref, ours
