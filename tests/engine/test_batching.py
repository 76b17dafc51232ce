"""Continuous batching: every stream of a batch gets exactly the codes it gets alone.

Torch fp32 and ONNX fp32, mixed modes (x-vector, ICL, speaker, instruct) and prompt lengths, greedy
and seeded sampling, streams joining and leaving mid-way, a cancelled stream, a stream that is not
ready for some steps, a row limit, and failures that stay inside their stream.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import qtts.engine.batching as batching
from qtts.backends import open as open_parts
from support.batch_util import TEXTS, alone, request, run_batch, voices


@pytest.fixture(scope="module")
def base_parts(tiny_snapshot):
    import torch

    torch.set_num_threads(1)
    return open_parts(tiny_snapshot(), threads=1)


@pytest.fixture(scope="module")
def onnx_plan(tiny_snapshot, run_shared) -> str:
    """The tiny Base checkpoint exported fp32 (talker + predictor, one-stream and batch graphs): the
    ``faithful`` preset's, the same bundle as tests/engine/test_batch_invariance.py's (one export)."""
    from support.batch_invariance import generation_bundle

    return generation_bundle(run_shared, tiny_snapshot(), "faithful")


@pytest.fixture(scope="module")
def onnx_parts(tiny_snapshot, onnx_plan):
    """(one-stream Components, batched Components) of the fp32 export."""
    plan = onnx_plan
    return open_parts(tiny_snapshot(), plan=plan, threads=1), open_parts(tiny_snapshot(), plan=plan, threads=1,
                                                                          max_batch=4)  # fmt: skip


def base_requests(parts) -> list:
    """Five streams: x-vector and ICL voices, five prompt lengths, greedy and seeded sampling, five budgets."""
    xv, icl = voices(parts.config)
    return [
        request(parts, "a", TEXTS[0], 16, voice=xv),
        request(parts, "b", TEXTS[1], 26, voice=icl),
        request(parts, "c", TEXTS[2], 10, voice=xv, greedy=False, seed=3),
        request(parts, "d", TEXTS[3], 20, voice=icl, greedy=False, seed=4),
        request(parts, "e", TEXTS[4], 12, voice=xv, greedy=False, seed=5),
    ]


#: a joins first, b and c after two steps, d and e after five (e waits for a free row: max_batch 4)
SCHEDULE = {0: [0], 2: [1, 2], 5: [3, 4]}


def check_same_as_alone(reference_backend, batch_backend, reqs, schedule=SCHEDULE, **kw):
    ref = {r.name: alone(reference_backend, r) for r in reqs}
    sinks, stats = run_batch(batch_backend, {k: [reqs[i] for i in v] for k, v in schedule.items()}, **kw)
    for r in reqs:
        codes, reason = ref[r.name]
        sink = sinks[r.name]
        assert sink.error is None, f"{r.name}: {sink.error!r}"
        assert sink.end == reason, f"{r.name}: finish {sink.end} vs {reason} alone"
        assert sink.codes.shape == codes.shape, f"{r.name}: {len(sink.codes)} frames vs {len(codes)} alone"
        np.testing.assert_array_equal(sink.codes, codes, err_msg=f"stream {r.name}")
    return sinks, stats


def test_torch_batch_equals_alone_join_and_leave(base_parts):
    _, stats = check_same_as_alone(base_parts.backend, base_parts.backend, base_requests(base_parts))
    sizes = [s.rows for s in stats]
    assert max(sizes) == 4 and 1 in sizes and 3 in sizes  # joined, filled up, drained
    assert sum(s.predicted for s in stats) == 16 + 26 + 10 + 20 + 12


def test_onnx_fp32_batch_equals_alone_join_and_leave(onnx_parts):
    single, batched = onnx_parts
    assert type(batched.backend).__name__ == "OnnxBatchBackend"
    check_same_as_alone(single.backend, batched.backend, base_requests(batched))


def test_onnx_fp32_rows_are_bitwise_those_of_one_stream(onnx_parts):
    """Stronger than equal codes: every batched row's logits and hidden state equal the one-stream
    graph's bit for bit (MLAS GEMM rows do not depend on M; GQA attends per row), also when a row
    steps alone while lower rows are idle."""
    from qtts.engine.generate import prefill, release

    single, batched = onnx_parts
    reqs = base_requests(batched)[:3]
    one = [prefill(single.backend, r.prompt, r.params, r.speaker) for r in reqs]
    many = [prefill(batched.backend, r.prompt, r.params, r.speaker) for r in reqs]
    try:
        _step_side_by_side(single.backend, batched.backend, reqs, one, many)
    finally:
        for state in many:
            release(batched.backend, state)


def _step_side_by_side(single, batched, reqs, one, many) -> None:
    from qtts.engine.batching import advance_rows, predict_rows
    from qtts.engine.generate import advance, next_code0, predict

    for step in range(8):
        picks = [next_code0(s, r.params) for s, r in zip(one, reqs)]
        frames = [predict(single, s, c, r.params, u) for s, (c, u), r in zip(one, picks, reqs)]
        picks = [next_code0(s, r.params) for s, r in zip(many, reqs)]
        rows = predict_rows(batched, many, [c for c, _ in picks], [r.params for r in reqs], [u for _, u in picks])
        for s, f in zip(one, frames):
            advance(single, s, f)
        groups = [[2], [0, 1]] if step % 3 == 0 else [[0, 1, 2]]  # row 2 alone above idle rows 0-1
        for g in groups:
            advance_rows(batched, [many[i] for i in g], [rows[i] for i in g])
        for a, b in zip(one, many):
            assert np.array_equal(a.logits, b.logits) and np.array_equal(a.hidden, b.hidden), f"step {step}"


def test_custom_voice_modes_batch_equals_alone(tiny_snapshot):
    """Speakers, languages and instruct (1.7B layout: talker wider than the predictor) in one batch."""
    parts = open_parts(tiny_snapshot("custom_voice", "1.7b"), threads=1)
    speakers = parts.config.speakers
    reqs = [
        request(parts, "a", TEXTS[0], 14, speaker=speakers[0]),
        request(parts, "b", TEXTS[1], 18, speaker=speakers[1], instruct="Speak slowly and warmly."),
        request(parts, "c", TEXTS[2], 10, speaker=speakers[0], language=parts.config.languages[0], greedy=False,
                seed=11),
    ]  # fmt: skip
    check_same_as_alone(parts.backend, parts.backend, reqs, schedule={0: [0], 3: [1], 4: [2]})


def test_cancelled_stream_leaves_others_exact(base_parts):
    reqs = base_requests(base_parts)[:3]
    ref = {r.name: alone(base_parts.backend, r) for r in reqs}
    sinks, _ = run_batch(base_parts.backend, {0: reqs}, cancel_at={5: ["b"]})
    assert sinks["b"].end == "cancelled"
    np.testing.assert_array_equal(sinks["b"].codes, ref["b"][0][: len(sinks["b"].codes)])
    assert 0 < len(sinks["b"].codes) <= 5
    for name in ("a", "c"):
        np.testing.assert_array_equal(sinks[name].codes, ref[name][0])


@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_stream_not_ready_is_skipped_then_resumes_exactly(base_parts, onnx_parts, monkeypatch, engine):
    """A stream that is not ready keeps its frame, takes no talker step (on ONNX its row gets the
    dropped write) and continues with exactly its alone codes once ready."""
    ref_parts, parts = (base_parts, base_parts) if engine == "torch" else onnx_parts
    reqs = base_requests(parts)[:3]
    held = {"steps": 0}
    real_ready = batching.ready

    def ready(state):
        if state is target[0] and 3 <= state.frames <= 5 and held["steps"] < 4:
            held["steps"] += 1
            return False
        return real_ready(state)

    target = [None]
    monkeypatch.setattr(batching, "ready", ready)
    original_prefill = batching.prefill

    def tag(backend, prompt, params, speaker, text=None):
        state = original_prefill(backend, prompt, params, speaker, text=text)
        if prompt is reqs[0].prompt:  # hold the lowest row, so higher rows step above it
            target[0] = state
        return state

    monkeypatch.setattr(batching, "prefill", tag)
    check_same_as_alone(ref_parts.backend, parts.backend, reqs, schedule={0: [0, 1, 2]})
    assert held["steps"] == 4


def test_a_held_stream_waits_for_its_first_audio_and_others_step_on(base_parts):
    """``hold = (1, event)`` (what TTS.stream passes on a batched engine): after its first frame the
    stream takes no talker step until its first chunk is decoded (the event), so that decode gets the
    cores; the other stream steps on meanwhile, and both get exactly their alone codes."""
    import threading

    from support.batch_util import Sink

    reqs = base_requests(base_parts)[:2]
    ref = {r.name: alone(base_parts.backend, r) for r in reqs}
    loop, first_audio = batching.BatchLoop(base_parts.backend, max_batch=4), threading.Event()
    sinks = {r.name: Sink() for r in reqs}
    loop.add(reqs[0].prompt, reqs[0].params, reqs[0].speaker, sinks["a"], hold=(1, first_audio))
    loop.add(reqs[1].prompt, reqs[1].params, reqs[1].speaker, sinks["b"])
    for _ in range(5):
        loop.step()
    assert len(sinks["a"].codes) == 1 and len(sinks["b"].codes) == 4  # b admitted one step later
    first_audio.set()
    while loop.busy:
        loop.step()
    for r in reqs:
        np.testing.assert_array_equal(sinks[r.name].codes, ref[r.name][0], err_msg=r.name)


def test_first_audio_event_wakes_the_engine(base_parts):
    """BatchEngine.first_audio(): setting it wakes the engine thread (a lone held stream resumes at once)."""
    engine = batching.BatchEngine(base_parts.backend, max_batch=2)
    try:
        event = engine.first_audio()
        engine._wake.clear()
        event.set()
        assert event.is_set() and engine._wake.is_set()
    finally:
        engine.close()


def test_row_limit_and_fifo_admission(base_parts):
    reqs = base_requests(base_parts)
    _, stats = check_same_as_alone(base_parts.backend, base_parts.backend, reqs, schedule={0: [0, 1, 2, 3, 4]},
                                   max_batch=2)  # fmt: skip
    assert max(s.rows for s in stats) == 2 and stats[0].waiting == 4


class _Hidden:
    """A backend without the batched methods (steps streams one by one) and with a poisoned prompt."""

    def __init__(self, inner, poison=None):
        self._inner, self._poison = inner, poison

    def __getattr__(self, name):
        if name in ("talker_rows", "predict_frames"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def talker(self, embeds, pos, state):
        if self._poison is not None and len(embeds) == self._poison:
            raise RuntimeError("poisoned prefill")
        return self._inner.talker(embeds, pos, state)


def test_backend_without_batched_methods_still_exact(base_parts):
    check_same_as_alone(base_parts.backend, _Hidden(base_parts.backend), base_requests(base_parts)[:3],
                        schedule={0: [0], 2: [1, 2]})


def test_prefill_failure_reaches_only_its_stream(base_parts):
    reqs = base_requests(base_parts)[:3]
    bad_len = len(reqs[1].prompt.text_ids)
    assert bad_len not in (len(reqs[0].prompt.text_ids), len(reqs[2].prompt.text_ids))
    ref = {r.name: alone(base_parts.backend, r) for r in reqs}
    sinks, _ = run_batch(_Hidden(base_parts.backend, poison=bad_len), {0: reqs})
    assert isinstance(sinks["b"].error, RuntimeError) and sinks["b"].end is None
    for name in ("a", "c"):
        np.testing.assert_array_equal(sinks[name].codes, ref[name][0])


def test_batched_step_failure_reaches_its_streams_only(base_parts, monkeypatch):
    reqs = base_requests(base_parts)[:2]
    calls = {"n": 0}
    real = batching.advance_rows

    def flaky(backend, states, frames):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("step failed")
        return real(backend, states, frames)

    monkeypatch.setattr(batching, "advance_rows", flaky)
    sinks, _ = run_batch(base_parts.backend, {0: reqs[:1], 5: reqs[1:]})
    assert isinstance(sinks["a"].error, RuntimeError) and len(sinks["a"].codes) == 3
    np.testing.assert_array_equal(sinks["b"].codes, alone(base_parts.backend, reqs[1])[0])


def test_batch_rows_script_says_fp32_rows_are_bitwise(tiny_snapshot, onnx_plan, capsys):
    """benchmarks/batch_rows.py (the check docs/history/batching.md runs on full-size quantized plans)."""
    import importlib.util

    from conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("batch_rows", os.path.join(REPO_ROOT, "benchmarks", "batch_rows.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--model", tiny_snapshot(), "--plan", onnx_plan, "--threads", "1", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("codes equal [True, True, True]") == 2 and out.rstrip().endswith("bitwise equal")
