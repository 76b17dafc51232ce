"""Parity at the real per-layer dimensions, in CI: ``size="mid"`` random checkpoints.

Every width of the real 0.6B and 1.7B Base checkpoints (talker hidden 1024 / 2048, head_dim 128,
16 / 8 heads, mrope sections [24, 20, 20], text hidden 2048 with the real 151936-row embedding,
predictor 1024 wide, ECAPA speaker encoder 512 / 1536 channels, Mimi encoder and vocoder at full
width) with 2 talker layers, 1 predictor layer and 2 layers per codec transformer. Compared with
the official code on the same files, at the tiny tests' tolerance (max abs error <= 1e-4 x max
|ref|, codes exactly equal): talker prefill + KV-cached decode steps, a predictor frame, the
speaker vector and the ICL codes of ``create_voice``, the vocoder waveform past its 72-frame
window, and greedy generation (x-vector on 0.6b, ICL on 1.7b) through both public APIs.

One layout at a time: its official model is dropped before the next one is loaded, and the 1.7b
snapshot (3.0 GB) is removed after its tests; the 0.6b one is conftest's ``mid_snapshot`` (2.3 GB),
written once per run for these tests and the batch invariance tests on mid.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_parity_core import _talker_then_predictor, assert_close

import qtts
from conftest import reference
from qtts.options import SynthesisOptions
from qtts.weights import load_checkpoint
from support import official
from support.encoder_helpers import speaker_wav
from support.parity_e2e import assert_same_audio, official_clone, prompt_item

pytestmark = pytest.mark.parity

REAL = {"0.6b": dict(hidden=1024, inter=3072), "1.7b": dict(hidden=2048, inter=6144)}
# the speech tokenizer is the same in both layouts (the 72-frame window slides in the tiny tests)
VOCODER_FRAMES = {"0.6b": 24, "1.7b": 4}
GREEDY_FRAMES = 8


@pytest.fixture(scope="module", params=["0.6b", "1.7b"])
def mid(request, tmp_path_factory):
    from qtts.tools.random_checkpoint import write_random_checkpoint

    layout = request.param
    if layout == "0.6b":
        path = request.getfixturevalue("mid_snapshot")  # the run's shared one: kept for its other users
    else:
        path = write_random_checkpoint(
            str(tmp_path_factory.mktemp("mid") / f"base-{layout}"), size="mid", kind="base", layout=layout,
            tokenizer_dir=reference("configs", "text-tokenizer-qwen2"),
        )  # fmt: skip
    ns = SimpleNamespace(layout=layout, path=path, tts=qtts.load(path))
    ns.official = official.qwen_tts().Qwen3TTSModel.from_pretrained(path, dtype=torch.float32)
    wav = speaker_wav(2.1, 7)
    ns.voice = ns.tts.create_voice(wav, sample_rate=24000, ref_text="The reference transcript.")
    ns.item = ns.official.create_voice_clone_prompt(ref_audio=(wav, 24000), ref_text="The reference transcript.")[0]
    yield ns
    del ns.tts, ns.official
    gc.collect()
    if layout != "0.6b":
        shutil.rmtree(path, ignore_errors=True)


def test_mid_snapshot_has_the_real_widths(mid):
    cfg = mid.tts.config
    t, p = cfg.talker, cfg.talker.code_predictor_config
    want = REAL[mid.layout]
    assert (t.hidden_size, t.intermediate_size, t.head_dim, t.num_attention_heads, t.num_key_value_heads) == (
        want["hidden"], want["inter"], 128, 16, 8)
    with open(os.path.join(mid.path, "config.json"), encoding="utf-8") as fh:
        assert json.load(fh)["talker_config"]["rope_scaling"]["mrope_section"] == [24, 20, 20]
    assert t.text_hidden_size == 2048
    assert t.text_vocab_size == 151936 and t.vocab_size == 3072
    assert (p.hidden_size, p.head_dim, p.num_hidden_layers, t.num_hidden_layers) == (1024, 128, 1, 2)
    assert cfg.speaker_encoder.enc_dim == want["hidden"]
    dec = cfg.speech_tokenizer.decoder_config
    assert (dec.latent_dim, dec.decoder_dim, dec.hidden_size, dec.num_hidden_layers) == (1024, 1536, 512, 2)


@torch.no_grad()
def test_talker_and_predictor_match_official(mid):
    ours = load_checkpoint(mid.path, components=("talker",)).model.talker
    _talker_then_predictor(ours, mid.official.model.talker, assert_close, steps=4, seed=11, code0=5,
                           code_step=97, what=f"mid {mid.layout} ")  # fmt: skip


def test_create_voice_matches_official(mid):
    ref = mid.item.ref_spk_embedding.float().numpy()
    assert ref.shape == (REAL[mid.layout]["hidden"],)
    err = np.abs(mid.voice.speaker - ref).max()
    assert err <= 1e-4 * np.abs(ref).max(), f"speaker vector: max abs err {err:.3e}"
    codes = mid.item.ref_code.numpy()
    assert mid.voice.ref_codes.shape == codes.shape == (27, 16)
    assert np.array_equal(mid.voice.ref_codes, codes), np.argwhere(mid.voice.ref_codes != codes)[:3]
    assert min(len(np.unique(codes[:, k])) for k in range(16)) > 5  # the codes vary


@torch.no_grad()
def test_vocoder_waveform_matches_official(mid):
    n = VOCODER_FRAMES[mid.layout]
    codes = torch.randint(0, 2048, (1, 16, n), generator=torch.Generator().manual_seed(4))
    ours = load_checkpoint(mid.path, components=("decoder",)).speech_tokenizer.decoder.eval()
    ref = mid.official.model.speech_tokenizer.model.decoder(codes)
    out = ours(codes)
    assert out.shape == (1, 1, n * 1920) and out.std() > 0.02  # speech-like level, not an offset
    assert_close(out, ref, f"mid vocoder, {n} frames")


def test_greedy_generation_matches_official(mid):
    """0.6b: x-vector clone; 1.7b: ICL clone; streaming text, greedy, through both public APIs."""
    icl = mid.layout == "1.7b"
    voice = qtts.Voice(mid.voice.speaker, model_size=mid.voice.model_size,  # 6 reference frames: ICL, cheap
                       ref_codes=mid.voice.ref_codes[:6] if icl else None, ref_text=mid.voice.ref_text if icl else None)
    opts = SynthesisOptions(greedy=True, max_frames=GREEDY_FRAMES, watchdog=False, split_sentences=False)
    text = "Real dimensions, few layers."
    ours = mid.tts.synthesize(text, voice=voice, language="english", options=opts)
    theirs = official_clone(mid.official, text, [prompt_item(voice)], "english", False, GREEDY_FRAMES)
    assert ours.info["frames"] == GREEDY_FRAMES and ours.finish_reason == "length"
    assert_same_audio(ours.samples, theirs, f"mid {mid.layout} {'ICL' if icl else 'x-vector'}")
