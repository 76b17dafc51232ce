"""The generation loop on a numpy fake backend: determinism, stop reasons, text feeding, closing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qtts.engine.generate import Watchdog, generate, pick_code0
from qtts.options import (
    BUDGET_BASE,
    BUDGET_PER_TOKEN,
    LoopParams,
    SamplingParams,
    WatchdogParams,
    frame_budget,
)
from support.fakes import EOS, FakeBackend, simple_prompt

GREEDY = SamplingParams(do_sample=False, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
SAMPLE = dataclasses.replace(GREEDY, do_sample=True)


def params(max_frames=30, sample=False, seed=None, watchdog=None, **kw) -> LoopParams:
    sp = SAMPLE if sample else GREEDY
    return LoopParams(talker=sp, predictor=sp, max_frames=max_frames, tts_pad_id=151671, seed=seed,
                      watchdog=watchdog, **kw)


def run(backend, lp, prompt=None):
    g = generate(backend, prompt or simple_prompt(), lp)
    frames = list(g)
    return np.array(frames).reshape(-1, 16), g


def test_greedy_is_deterministic_and_codes_in_range():
    a, ga = run(FakeBackend(), params())
    b, _ = run(FakeBackend(), params())
    assert np.array_equal(a, b)
    assert a.dtype == np.int64 and a.shape == (30, 16)
    assert (a >= 0).all() and (a < 2048).all()  # control ids and EOS never reach a frame
    assert ga.finish_reason == "length"


def test_sampling_is_seeded():
    a, _ = run(FakeBackend(), params(sample=True, seed=7))
    b, _ = run(FakeBackend(), params(sample=True, seed=7))
    c, _ = run(FakeBackend(), params(sample=True, seed=8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_eos_stops_and_is_dropped():
    codes, g = run(FakeBackend(eos_at=5), params())
    assert g.finish_reason == "eos"
    assert len(codes) == 5 and g.num_frames == 5
    assert EOS not in codes[:, 0]


def test_eos_blocked_for_first_two_frames():
    codes, g = run(FakeBackend(eos_at=0), params())
    assert g.finish_reason == "eos"
    assert len(codes) == 2


def test_max_frames_gives_length():
    for n in (0, 1, 13):
        codes, g = run(FakeBackend(), params(max_frames=n))
        assert len(codes) == n and g.finish_reason == "length"


def test_watchdog_stuck_code():
    wd = WatchdogParams(max_repeat=10, window=None)
    codes, g = run(FakeBackend(stuck_code=77), params(max_frames=500, watchdog=wd))
    assert g.finish_reason == "runaway"
    assert len(codes) == 10 and (codes[:, 0] == 77).all()


def test_watchdog_cycle():
    wd = WatchdogParams(max_repeat=None, window=20, max_period=4)
    codes, g = run(FakeBackend(cycle=(5, 9, 11)), params(max_frames=500, watchdog=wd))
    assert g.finish_reason == "runaway"
    assert len(codes) <= 20 + 4 + 3


def test_watchdog_quiet_on_varied_codes():
    rng = np.random.default_rng(0)
    w = Watchdog(WatchdogParams())
    assert not any(w.update(int(c)) for c in rng.integers(0, 2048, 2000))


def test_trailing_text_then_tts_pad():
    be = FakeBackend()
    prompt = simple_prompt(n_trailing=3)  # trailing = 3 tokens + tts_eos
    codes, _ = run(be, params(max_frames=8), prompt)
    steps = be.talker_inputs[1:]  # after the prefill, one vector per frame
    assert len(steps) == 8  # the last step tells EOS from length
    trailing = be.text_embeds(np.array(prompt.trailing_text_ids))
    pad = be.text_embeds(np.array([151671]))[0]
    for s, x in enumerate(steps):
        text = trailing[s] if s < len(trailing) else pad
        expect = be.frame_embeds(codes[s : s + 1])[0] + text
        np.testing.assert_allclose(x[0], expect, rtol=1e-6, atol=1e-6)


def test_positions_and_state_size():
    be = FakeBackend()
    prompt = simple_prompt()
    run(be, params(max_frames=6), prompt)
    talks = [e for e in be.events if e[0] == "talker"]
    assert talks[0] == ("talker", 0, len(prompt.text_ids))
    assert [e[1] for e in talks[1:]] == list(range(len(prompt.text_ids), len(prompt.text_ids) + 6))


def test_close_stops_within_one_frame():
    be = FakeBackend()
    it = iter(generate(be, simple_prompt(), params(max_frames=100)))
    next(it)
    next(it)
    calls = len(be.events)
    it.close()
    assert len(be.events) == calls
    with pytest.raises(StopIteration):
        next(it)


def test_cancel_event_stops_within_one_frame():
    import threading

    cancel = threading.Event()
    be = FakeBackend()
    g = generate(be, simple_prompt(), params(max_frames=100, cancel=cancel))
    got = []
    for codes in g:
        got.append(codes)
        if len(got) == 3:
            cancel.set()  # another thread would do this; the loop checks before every frame
    assert len(got) == 3 and g.finish_reason == "cancelled"


def test_pick_code0_suppresses_control_ids():
    rng = np.random.default_rng(1)
    lp = params(sample=True)
    for step in range(5):
        logits = rng.standard_normal(3072).astype(np.float32)
        logits[2048:] += 20.0  # control ids would win if not suppressed
        for _ in range(20):
            c = pick_code0(logits, [], step, lp, float(rng.random()))
            assert c < 2048 or (c == EOS and step >= 2)


def test_repetition_penalty_changes_greedy_choice():
    logits = np.zeros(3072, np.float32)
    logits[10], logits[11] = 1.0, 0.99
    lp = params()
    assert pick_code0(logits, [], 3, lp, 0.5) == 10
    assert pick_code0(logits, [10], 3, lp, 0.5) == 11


def test_frame_budget_formula():
    assert frame_budget(0) == BUDGET_BASE
    assert frame_budget(10) == BUDGET_BASE + 10 * BUDGET_PER_TOKEN
    assert frame_budget(10_000, cap=500) == 500
