"""Speech-tokenizer encoder codes vs the official ``Qwen3TTSTokenizerV2Model.encode`` (exact equality)."""

from __future__ import annotations

import pytest
import torch

from qtts.model.speech_encoder import nearest_code
from qtts.weights import load_checkpoint
from support.encoder_helpers import codec_wav, feature_extractor, official_tokenizer_pair

pytestmark = pytest.mark.parity

SECONDS = (1.3, 3.0, 5.1)  # none a multiple of 1920 samples


@pytest.fixture(scope="module")
def own_pair():
    return official_tokenizer_pair()


@pytest.mark.parametrize("seconds", SECONDS)
def test_codes_equal_official_single(own_pair, seconds):
    ref, ours = own_pair
    wav = codec_wav(seconds, int(seconds * 10))
    inputs = feature_extractor()(raw_audio=[wav], sampling_rate=24000, return_tensors="pt")
    expected = ref.encode(inputs["input_values"].squeeze(1), inputs["padding_mask"].squeeze(1)).audio_codes[0]
    got = ours.encode(torch.from_numpy(wav)[None])[0]
    assert got.shape == expected.shape == (-(-len(wav) // 1920), 16)
    assert got.dtype == torch.long
    assert torch.equal(got, expected)
    assert min(len(torch.unique(got[:, k])) for k in range(16)) > 3  # codes are not degenerate


def test_codes_equal_official_batched(own_pair):
    """Official batching pads with zeros to the longest item, encodes, then cuts each item."""
    ref, ours = own_pair
    wavs = [codec_wav(s, i) for i, s in enumerate(SECONDS)]
    inputs = feature_extractor()(raw_audio=wavs, sampling_rate=24000, return_tensors="pt")
    expected = ref.encode(inputs["input_values"].squeeze(1), inputs["padding_mask"].squeeze(1)).audio_codes
    got = ours.encode_list(wavs)
    assert [tuple(g.shape) for g in got] == [tuple(e.shape) for e in expected]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_snapshot_codes_equal_official_loader(tiny_snapshot, official_tts):
    """End to end through the loaders: official ``Qwen3TTSModel`` speech tokenizer vs ``load_checkpoint``.

    The generator scales the encoder weights by fan-in, so the codes vary (checked below) and
    the comparison exercises real nearest-code choices, not a constant.
    """
    path = tiny_snapshot("base", "0.6b")
    ref = official_tts(path).model.speech_tokenizer  # Qwen3TTSTokenizer (feature extractor + model)
    ours = load_checkpoint(path, components=("encoder",)).speech_tokenizer.encoder.eval()
    wavs = [codec_wav(s, i) for i, s in enumerate(SECONDS[:2])]
    for wav in wavs:
        assert torch.equal(
            ours.encode(torch.from_numpy(wav)[None])[0], ref.encode(wav, sr=24000).audio_codes[0]
        )
    for g, e in zip(ours.encode_list(wavs), ref.encode(wavs, sr=24000).audio_codes):
        assert torch.equal(g, e.cpu())
    codes = ours.encode(torch.from_numpy(wavs[-1])[None])[0]
    distinct = [len(torch.unique(codes[:, k])) for k in range(codes.shape[1])]
    assert min(distinct) >= max(3, codes.shape[0] // 4), distinct


def test_gqa_and_no_sliding_window_like_official():
    """transformers 4.57.3 Mimi encode ignores ``sliding_window`` (plain causal attention); so do we.

    A 4-frame window with 5 s of audio (125 transformer frames) would change the codes if applied.
    """
    ref, ours = official_tokenizer_pair(sliding_window=4)
    wav = codec_wav(5.1, 7)
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
    wav = torch.from_numpy(codec_wav(3.0, 9))[None]
    full = ours.encode(wav)[0]
    assert full.shape == (38, 16)  # ceil(72000 / 1920)
    prefix = ours.encode(wav[:, : 20 * 1920])[0]
    assert torch.equal(prefix, full[:20])  # causal: the future never changes past codes
