"""Our speech-tokenizer decoder == the official Qwen3TTSTokenizerV2Decoder on the same weights."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch

from conftest import reference
from support import official
from support.vocoder_fixtures import load_decoder, randomize

pytestmark = pytest.mark.parity


def _official_classes():
    official.qwen_tts()
    from qwen_tts.core.tokenizer_12hz import configuration_qwen3_tts_tokenizer_v2 as c
    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as m

    return c.Qwen3TTSTokenizerV2DecoderConfig, m.Qwen3TTSTokenizerV2Decoder, m.Qwen3TTSTokenizerV2Model


def _assert_close(ref: torch.Tensor, ours: torch.Tensor) -> None:
    assert ref.shape == ours.shape
    err = (ref - ours).abs().max().item()
    assert err <= 1e-4 * ref.abs().max().item(), f"max abs err {err} vs ref max {ref.abs().max().item()}"


def test_full_decode_matches_official(tiny_snapshot, one_thread):
    path = tiny_snapshot()
    _, _, Model = _official_classes()
    ref_model = Model.from_pretrained(os.path.join(path, "speech_tokenizer"), dtype=torch.float32).eval()
    ours = load_decoder(path)
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 2048, (2, 16, 110), generator=g)  # > 72: the window slides
    with torch.inference_mode():
        ref = ref_model.decoder(codes)
        out = ours(codes)
    assert out.shape == (2, 1, 110 * 1920)
    assert out.abs().max() > 1e-3  # non-degenerate audio
    _assert_close(ref, out)
    # the official public decode (chunked, <= 300 frames == one full decode, trims padding -1 frames)
    padded = codes.transpose(1, 2).clone()
    padded[1, 100:] = -1
    with torch.inference_mode():
        wavs = ref_model.decode(padded, return_dict=False)[0]
        short = ours(codes[1:, :, :100])
    assert len(wavs[1]) == 100 * 1920
    _assert_close(wavs[1], short.reshape(-1))


def test_gqa_short_window_matches_official(one_thread):
    """num_key_value_heads < heads and a window of 8 frames, so 40 frames wrap it 5 times."""
    from qtts.config import DecoderConfig, _from_dict
    from qtts.model.vocoder import Decoder

    Cfg, OfficialDecoder, _ = _official_classes()
    with open(
        reference("configs", "Qwen3-TTS-12Hz-0.6B-Base", "speech_tokenizer", "config.json")
    ) as fh:
        d = json.load(fh)["decoder_config"]
    d.update(latent_dim=24, codebook_dim=16, hidden_size=32, intermediate_size=48, head_dim=8,
             num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, decoder_dim=32,
             sliding_window=8)  # fmt: skip
    cfg = Cfg(**copy.deepcopy(d))
    cfg._attn_implementation = "eager"
    ref_dec = OfficialDecoder(cfg).eval()
    randomize(ref_dec, seed=5)
    ours = Decoder(_from_dict(DecoderConfig, d, "tiny decoder_config")).eval()
    ours.load_state_dict(ref_dec.state_dict(), strict=True)
    codes = torch.from_numpy(np.random.default_rng(1).integers(0, 2048, (1, 16, 40)))
    with torch.inference_mode():
        _assert_close(ref_dec(codes), ours(codes))
