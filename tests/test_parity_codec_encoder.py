"""Speech-tokenizer encoder codes vs the official ``Qwen3TTSTokenizerV2Model.encode`` (exact equality)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

import official
from conftest import shared_reference
from qtts.config import EncoderConfig, _from_dict
from qtts.model.codec_encoder import Encoder, nearest_code
from qtts.weights import load_checkpoint

pytestmark = pytest.mark.parity

SECONDS = (1.3, 3.0, 5.1)  # none a multiple of 1920 samples


def _wav(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * 24000)
    t = np.arange(n) / 24000
    y = 0.3 * np.sin(2 * np.pi * (150 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t) + 0.05 * rng.standard_normal(n)
    return y.astype(np.float32)


@pytest.fixture(scope="module")
def own_pair():
    return _own_pair(sliding_window=250)


@pytest.mark.parametrize("seconds", SECONDS)
def test_codes_equal_official_single(own_pair, seconds):
    ref, ours = own_pair
    wav = _wav(seconds, int(seconds * 10))
    inputs = _feature_extractor()(raw_audio=[wav], sampling_rate=24000, return_tensors="pt")
    expected = ref.encode(inputs["input_values"].squeeze(1), inputs["padding_mask"].squeeze(1)).audio_codes[0]
    got = ours.encode(torch.from_numpy(wav)[None])[0]
    assert got.shape == expected.shape == (-(-len(wav) // 1920), 16)
    assert got.dtype == torch.long
    assert torch.equal(got, expected)
    assert min(len(torch.unique(got[:, k])) for k in range(16)) > 3  # codes are not degenerate


def test_codes_equal_official_batched(own_pair):
    """Official batching pads with zeros to the longest item, encodes, then cuts each item."""
    ref, ours = own_pair
    wavs = [_wav(s, i) for i, s in enumerate(SECONDS)]
    inputs = _feature_extractor()(raw_audio=wavs, sampling_rate=24000, return_tensors="pt")
    expected = ref.encode(inputs["input_values"].squeeze(1), inputs["padding_mask"].squeeze(1)).audio_codes
    got = ours.encode_list(wavs)
    assert [tuple(g.shape) for g in got] == [tuple(e.shape) for e in expected]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_snapshot_codes_equal_official_loader(tiny_snapshot, official_tts):
    """End to end through the loaders: official ``Qwen3TTSModel`` speech tokenizer vs ``load_checkpoint``.

    (The generator's small init makes this snapshot's codes nearly constant, so the numerics are
    covered by the tests above; this one checks loading, the feature extractor and the cut.)
    """
    path = tiny_snapshot("base", "0.6b")
    ref = official_tts(path).model.speech_tokenizer  # Qwen3TTSTokenizer (feature extractor + model)
    ours = load_checkpoint(path, components=("encoder",)).speech_tokenizer.encoder.eval()
    wavs = [_wav(s, i) for i, s in enumerate(SECONDS[:2])]
    for wav in wavs:
        assert torch.equal(
            ours.encode(torch.from_numpy(wav)[None])[0], ref.encode(wav, sr=24000).audio_codes[0]
        )
    for g, e in zip(ours.encode_list(wavs), ref.encode(wavs, sr=24000).audio_codes):
        assert torch.equal(g, e.cpu())


def _feature_extractor():
    from transformers import EncodecFeatureExtractor

    return EncodecFeatureExtractor(
        feature_size=1, sampling_rate=24000, padding_value=0.0, return_attention_mask=True
    )


def _own_pair(sliding_window: int):
    """Official tokenizer built directly with a tiny config (here: a tiny sliding window)."""
    official.qwen_tts()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    path = shared_reference("configs", "Qwen3-TTS-12Hz-0.6B-Base", "speech_tokenizer", "config.json")
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


def test_gqa_and_no_sliding_window_like_official():
    """transformers 4.57.3 Mimi encode ignores ``sliding_window`` (plain causal attention); so do we.

    A 4-frame window with 5 s of audio (125 transformer frames) would change the codes if applied.
    """
    ref, ours = _own_pair(sliding_window=4)
    wav = _wav(5.1, 7)
    x = torch.from_numpy(wav)[None]
    expected = ref.encode(x, torch.ones_like(x, dtype=torch.long)).audio_codes[0]
    assert torch.equal(ours.encode(x)[0], expected)


def test_nearest_code_equals_cdist_argmin():
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(300, 16, generator=g), torch.randn(2048, 16, generator=g) * 1.3
    ref = torch.cdist(x[None], e[None], p=2)[0].argmin(-1)
    assert torch.equal(nearest_code(x, e), ref)


def test_causal_prefix_and_frame_count(own_pair):
    _, ours = own_pair
    wav = torch.from_numpy(_wav(3.0, 9))[None]
    full = ours.encode(wav)[0]
    assert full.shape == (38, 16)  # ceil(72000 / 1920)
    prefix = ours.encode(wav[:, : 20 * 1920])[0]
    assert torch.equal(prefix, full[:20])  # causal: the future never changes past codes
