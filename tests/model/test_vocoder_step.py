"""The stateful VocoderStep and the streaming vocoders reproduce the offline decode (fp32 >= 100 dB)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import reference
from qtts.audio.chunk import snr_db
from qtts.backends.base import OpenContext
from qtts.backends.torch import TorchFullVocoder, TorchVocoder, open_vocoder, step_decode
from qtts.backends.vocoder_step import StepStream, StepVocoder, rope_freqs
from qtts.errors import InputError
from qtts.model.vocoder_step import CacheLayout, VocoderStep
from qtts.plans.plan import load_plan
from support.vocoder_fixtures import feed, full_decode, load_decoder, random_codes

FRAMES = 310  # > 4 windows of 72


@pytest.fixture(scope="module")
def tiny(tiny_snapshot, one_thread):
    decoder = load_decoder(tiny_snapshot())
    codes = random_codes(FRAMES, seed=11)
    steps: dict[int, VocoderStep] = {}

    def step_for(b):
        if b not in steps:
            steps[b] = VocoderStep(decoder, b).eval()
        return steps[b]

    return decoder, codes, full_decode(decoder, codes), step_for


@pytest.mark.parametrize("b", [1, 2, 4, 16, 64])
def test_fixed_step_matches_full_decode(tiny, b):
    decoder, codes, ref, step_for = tiny
    schedule = [b] * (FRAMES // b) + ([FRAMES % b] if FRAMES % b else [])
    out = step_decode(step_for, torch.from_numpy(codes.T[None].copy()), schedule)
    assert len(out) == len(ref)
    assert snr_db(ref, out) >= 100.0


def test_mixed_schedule_first_then_main_then_remainder(tiny):
    decoder, codes, ref, step_for = tiny
    schedule = [2] + [16] * 19 + [4]  # a small first step hands its cache to B=16 steps
    assert sum(schedule) == FRAMES
    out = step_decode(step_for, torch.from_numpy(codes.T[None].copy()), schedule)
    assert snr_db(ref, out) >= 100.0


def test_cache_layout_is_data_and_independent_of_b(tiny):
    decoder, _, _, step_for = tiny
    layout = CacheLayout.from_config(decoder.config)
    off = 0
    for e in layout.entries:
        assert e.offset == off and e.size == int(np.prod(e.shape)) > 0
        decoder.get_submodule(e.name.rsplit(".", 1)[0] if e.name.endswith((".k", ".v")) else e.name)
        off += e.size
    assert layout.size == off
    assert step_for(1).cache_size == step_for(64).cache_size == layout.size
    assert layout.kv_slots == decoder.config.sliding_window - 1 == 71


def test_full_size_layout():
    from qtts.config import SpeechTokenizerConfig

    path = reference("configs", "Qwen3-TTS-12Hz-0.6B-Base", "speech_tokenizer", "config.json")
    layout = CacheLayout.from_config(SpeechTokenizerConfig.from_file(path).decoder_config)
    assert layout["pre_transformer.layers.7.v"].shape == (16, 71, 64)
    assert layout["pre_conv"].shape == (512, 2)
    assert layout["decoder.1.block.1"].shape == (1536, 1)  # transposed conv k=16 s=8: one frame
    assert layout["decoder.4.block.4.conv1"].shape == (96, 54)  # k7 dilation 9
    assert "upsample.0.0" not in [e.name for e in layout.entries]  # k == stride: no history
    kv = 8 * 2 * 16 * 71 * 64
    assert layout.size == kv + sum(e.size for e in layout.entries if not e.name.endswith((".k", ".v")))


def test_phantom_slots_cannot_leak(tiny):
    """With cache_valid = 0 the KV slots are masked: garbage there changes nothing."""
    decoder, codes, _, step_for = tiny
    step = step_for(4)
    clean = step.init_cache()
    dirty = clean.clone()
    for e in step.layout.entries:
        if e.name.endswith((".k", ".v")):
            dirty[e.offset : e.offset + e.size] = torch.randn(e.size) * 3
    args = (torch.from_numpy(codes[:4].T[None].copy()), torch.from_numpy(rope_freqs(0, 4, step.inv_freq())))
    with torch.inference_mode():
        a, ca = step(*args, step.cache_valid(0), clean)
        b, cb = step(*args, step.cache_valid(0), dirty)
        c, cc = step(*args, torch.tensor([71.0]), dirty)
    conv = [e for e in step.layout.entries if not e.name.endswith((".k", ".v"))]

    def conv_state(cache):
        return torch.cat([cache[e.offset : e.offset + e.size] for e in conv])

    assert torch.equal(a, b) and torch.equal(conv_state(ca), conv_state(cb))
    # the count is what masks them: claiming 71 real slots lets the garbage in
    assert (a - c).abs().max() > 1e-7 and (conv_state(ca) - conv_state(cc)).abs().max() > 1e-4


def test_rope_freqs_reduced_and_exact():
    from qtts.model.layers import rope_inv_freq

    inv = rope_inv_freq(64, 10000.0)
    got = rope_freqs(4000, 64, inv.numpy())
    assert got.dtype == np.float32 and got.min() >= 0 and got.max() < 2 * np.pi
    raw = torch.arange(4000, 4064, dtype=torch.float32)[:, None] * inv[None, :]
    assert np.abs(np.cos(got) - raw.cos().numpy()).max() < 2e-6
    assert np.abs(np.sin(got) - raw.sin().numpy()).max() < 2e-6


def test_torch_vocoder_streams_exactly(tiny):
    decoder, codes, ref, _ = tiny
    voc = TorchVocoder(decoder, main=16)
    dec = voc.stream()
    out = feed(dec, codes, [2, 8, 16, 5, 33, 1, 8])  # any sizes; remainders get exact-size steps
    assert snr_db(ref, out) >= 100.0
    dec.reset()
    again = feed(dec, codes[:40], [40])
    assert np.array_equal(again, out[: 40 * 1920]) or snr_db(out[: 40 * 1920], again) > 110
    other = voc.stream()  # streams share the built steps, not their state
    assert np.array_equal(feed(other, codes[:40], [40]), again)


class _TorchBackedFixed(StepVocoder):
    """The compiled-artifact schedule (pad + pending) driven by torch steps."""

    def __init__(self, decoder, sizes):
        self.inner = TorchVocoder(decoder, main=max(sizes))
        self.calls: list[int] = []
        self.contract, self.sizes = self.inner.contract, sorted(sizes, reverse=True)

    def run(self, size, *args):
        self.calls.append(size)
        return self.inner.run(size, *args)


def test_fixed_sizes_pad_remainders_without_corrupting_the_cache(tiny):
    decoder, codes, ref, _ = tiny
    voc = _TorchBackedFixed(decoder, [16, 4])
    out = feed(StepStream(voc), codes[:150], [2, 8, 7, 3, 16, 1, 33, 40, 40])
    assert set(voc.calls) == {16, 4}
    assert snr_db(ref[: 150 * 1920], out) >= 100.0


def test_warm_runs_every_compiled_size_once_and_leaves_streams_alone(tiny):
    """StepVocoder.warm (TTS.warm, the servers before "ready"): one call of each size, no padded
    step, and a stream decoded after it gives the audio of a fresh vocoder's stream."""
    decoder, codes, ref, _ = tiny
    voc = _TorchBackedFixed(decoder, [16, 4])
    voc.warm()
    assert voc.calls == [16, 4]
    out = feed(StepStream(voc), codes[:20], [20])
    assert snr_db(ref[: 20 * 1920], out) >= 100.0


def test_full_decoder_streams_exactly(tiny):
    decoder, codes, ref, _ = tiny
    out = feed(TorchFullVocoder(decoder).stream(), codes[:90], [2, 8])
    assert snr_db(ref[: 90 * 1920], out) >= 100.0


def test_bfloat16_decoders(tiny):
    """The offline decoder runs in bf16 and returns float32; the fp32-state step refuses bf16 clearly."""
    import copy

    decoder, codes, ref, _ = tiny
    bf16 = copy.deepcopy(decoder).to(torch.bfloat16)
    out = feed(TorchFullVocoder(bf16).stream(), codes[:8], [2, 6])
    assert out.dtype == np.float32 and out.shape == (8 * 1920,)
    assert snr_db(ref[: 8 * 1920], out) > 10.0  # bf16 is lossy but must be the same audio
    with pytest.raises(InputError, match="float32"):
        TorchVocoder(bf16, main=4)


def test_bad_codes_are_refused_where_they_come_in(tiny, real_tts):
    """A vocoder stream decodes the engine's frames or codes checked where they came in (TTS.decode here;
    codes files: tests/audio/test_codes.py; a voice's: tests/text/test_prompt.py), never bad ones."""
    for bad, words in ((np.zeros((3, 15), dtype=np.int64), "got shape (3, 15)"),
                       (-np.ones((2, 16), dtype=np.int64), "frame 0 codebook 0 is -1")):  # fmt: skip
        with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
            real_tts.decode(bad)
    assert TorchVocoder(tiny[0], main=4).stream().decode(np.zeros((0, 16), dtype=np.int64)).shape == (0,)


def test_plan_options_reach_the_torch_vocoder(tiny, tiny_snapshot):
    decoder = tiny[0]
    ctx = OpenContext(tiny_snapshot(), config=None)
    ctx.cache[("torch", "decoder")] = decoder  # what load_part would load

    def opened(entry, **kw):
        return open_vocoder(load_plan({"vocoder": entry}).get("vocoder"), OpenContext(**{**ctx.__dict__, **kw}))

    voc = opened({"impl": "torch", "options": {"main": 8}})
    assert isinstance(voc, TorchVocoder) and voc.contract.codes_length == 8
    assert voc.threads is None
    assert opened({"impl": "torch"}, threads=1).threads == 1  # the runtime's thread count, where the plan sets none
    assert opened({"impl": "torch", "options": {"threads": 2}}, threads=1).threads == 2
    assert isinstance(opened({"impl": "torch", "options": {"mode": "full"}}), TorchFullVocoder)
    assert json.loads(voc.contract.to_json())["cache_size"] == voc.contract.cache_size
