"""The runaway watchdog leaves long legitimate pauses alone (docs/usage.md, "finish reasons").

A pause in speech is a stretch of "silence" frames whose code 0 is one code, or alternates
between a few. The default rules trip on 36 identical code-0 frames in a row (2.88 s) or on an
exact cycle of period p (2..8) over the last 60 + p frames (a 2-code alternation: 4.96 s). Read speech pauses last 0.2-1.5 s
(sentence breaks, commas, a dramatic pause at most ~2 s), text is split into sentences that are
generated one by one, and a model that has finished its text says EOS; so the stretches the
watchdog stops are runaways, not pauses. These tests drive the real loop (numpy fake backend
forced to a scripted code-0 stream) through pauses just under each limit, and show where it trips.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from qtts.engine.generate import generate
from qtts.options import LoopParams, SamplingParams, WatchdogParams
from support.fakes import FakeBackend, simple_prompt

GREEDY = SamplingParams(do_sample=False, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
FRAME_S = 0.08  # one codec frame at 12.5 Hz


def speech(n: int, seed: int) -> list[int]:
    """Varied code 0s, as in speech (never the same twice in a row)."""
    rng = np.random.default_rng(seed)
    return [int(c) for c in rng.permutation(2048)[:n]]


DEFAULT = WatchdogParams()


def run(script: list[int], watchdog=DEFAULT):
    """Generate len(script) frames with code 0 forced to ``script`` (watchdog on)."""
    lp = LoopParams(talker=GREEDY, predictor=GREEDY, max_frames=len(script), tts_pad_id=151671, watchdog=watchdog)
    backend = FakeBackend(cycle=tuple(script))  # the prefill gives frame 0, step k frame k
    g = generate(backend, simple_prompt(), lp)
    codes = np.array(list(g)).reshape(-1, 16)
    return codes, g.finish_reason


def test_script_is_followed():
    script = speech(30, 0)
    codes, reason = run(script)
    assert codes[:, 0].tolist() == script and reason == "length"


def test_pause_of_one_code_under_the_repeat_limit_passes():
    limit = WatchdogParams().max_repeat
    pause = [7] * (limit - 1)  # 35 frames = 2.8 s of one silence code
    script = speech(40, 1) + pause + speech(30, 2) + pause + speech(20, 3)
    codes, reason = run(script)
    assert reason == "length" and len(codes) == len(script)
    assert (limit - 1) * FRAME_S >= 2.8


def test_alternating_pause_under_the_cycle_window_passes():
    p = WatchdogParams()
    pause = ([7, 9] * p.window)[: p.window + 1]  # 61 frames = 4.88 s of a 2-code silence (trips at 62)
    script = speech(40, 4) + pause + speech(30, 5)
    codes, reason = run(script)
    assert reason == "length" and len(codes) == len(script)


def test_runaways_trip_at_the_documented_lengths():
    p = WatchdogParams()
    codes, reason = run(speech(20, 6) + [7] * 200)
    assert reason == "runaway" and len(codes) == 20 + p.max_repeat  # 2.88 s of one code
    codes, reason = run(speech(20, 7) + [7, 9, 11] * 80)
    assert reason == "runaway" and len(codes) == 20 + p.window + 3  # period p: window + p frames (5.04 s)
    codes, reason = run(speech(20, 8) + [7, 9] * 80)
    assert reason == "runaway" and len(codes) == 20 + p.window + 2  # 4.96 s of a 2-code alternation


def test_watchdog_off_never_trips():
    codes, reason = run(speech(10, 8) + [7] * 100, watchdog=None)
    assert reason == "length" and len(codes) == 110


def test_repetition_penalty_does_not_hide_a_scripted_pause():
    """The fake forces its code with a logit of 100: the 1.05 penalty (divide by 1.05) cannot move it,
    so these tests measure the watchdog, not the penalty."""
    codes, _ = run([7] * 30, watchdog=dataclasses.replace(WatchdogParams(), max_repeat=None, window=None))
    assert (codes[:, 0] == 7).all()
