"""The two-thread pipeline (qtts.engine.stream): schedule, worker hand-off, cancel/error/close, and that the
pipelined TTS.stream gives exactly the serial path's chunks and audio (fakes, tiny torch, tiny ONNX)."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

from qtts.engine.stream import chunk_frames_at, run_ahead
from qtts.options import SynthesisOptions
from support.fakes import VOICE, make_tts


def _workers() -> list:
    return [t for t in threading.enumerate() if t.name == "qtts-generation"]


@pytest.mark.parametrize("first,size,want", [(1, 8, [1, 2, 4, 8, 8]), (2, 8, [2, 4, 8, 8, 8]),
                                             (3, 8, [3, 6, 8, 8, 8]), (10, 8, [10, 8, 8, 8, 8]),
                                             (1, 1, [1, 1, 1, 1, 1])])  # fmt: skip
def test_chunk_schedule_doubles_up_to_chunk_frames(first, size, want):
    assert [chunk_frames_at(i, first, size) for i in range(5)] == want
    assert chunk_frames_at(10_000, 1, 8) == 8  # no overflow far into a long stream


def test_run_ahead_keeps_order_and_ends():
    assert list(run_ahead(lambda cancel: iter(range(100)), depth=4)) == list(range(100))
    assert _workers() == []


def test_run_ahead_reraises_worker_error_after_its_items():
    def start(cancel):
        yield from (0, 1, 2)
        raise ValueError("boom in the worker")

    got = []
    with pytest.raises(ValueError, match="boom in the worker"):
        for item in run_ahead(start, depth=2):
            got.append(item)
    assert got == [0, 1, 2] and _workers() == []


def _counting(produced: list):
    def start(cancel):
        while not cancel.is_set():
            produced.append(len(produced))
            yield produced[-1]

    return start


def test_run_ahead_close_stops_and_joins_the_worker():
    produced: list = []
    it = run_ahead(_counting(produced), depth=3)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()
    assert _workers() == []
    n = len(produced)
    assert n <= 5 + 3 + 2  # taken + queue depth + the item in hand + the one being put when stopped
    assert len(produced) == n  # nothing runs after close


def test_run_ahead_caller_cancel_ends_the_stream():
    cancel = threading.Event()
    produced: list = []
    got = []
    for item in run_ahead(_counting(produced), cancel=cancel, depth=2):
        got.append(item)
        if item == 3:
            cancel.set()
    assert got[:4] == [0, 1, 2, 3] and len(got) <= 4 + 3 and _workers() == []


def _chunks(tts, text, **kw):
    return list(tts.stream(text, voice=VOICE, options=SynthesisOptions(greedy=True, watchdog=False, **kw)))


def _same(a: list, b: list) -> None:
    assert [(c.frame_start, c.num_frames, c.is_final, c.finish_reason) for c in a] == \
        [(c.frame_start, c.num_frames, c.is_final, c.finish_reason) for c in b]  # fmt: skip
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.samples, y.samples)  # bit for bit
    assert a[-1].info["finish_reasons"] == b[-1].info["finish_reasons"]
    assert a[-1].info["frames"] == b[-1].info["frames"]


@pytest.mark.parametrize("backend_kw,kw", [({}, dict(max_frames=30)),
                                           ({"eos_at": 5}, dict(max_sentence_chars=30)),
                                           ({}, dict(max_frames=9, first_chunk_frames=3, chunk_frames=4))])  # fmt: skip
def test_pipelined_stream_equals_serial_on_fakes(backend_kw, kw):
    text = "First sentence here. Second one follows! And a third?"
    serial = _chunks(make_tts(**backend_kw)[0], text, pipeline=False, **kw)
    piped = _chunks(make_tts(**backend_kw)[0], text, pipeline=True, **kw)
    _same(serial, piped)
    assert _workers() == []


def test_pipelined_cancel_gives_a_final_cancelled_chunk():
    tts, backend = make_tts()
    cancel = threading.Event()
    opts = SynthesisOptions(greedy=True, max_frames=400, watchdog=False, pipeline=True, cancel=cancel)
    chunks = []
    for chunk in tts.stream("Hello world.", voice=VOICE, options=opts):
        chunks.append(chunk)
        cancel.set()
    assert chunks[-1].is_final and chunks[-1].finish_reason == "cancelled"
    assert chunks[-1].info["frames"] < 400 and _workers() == []


def test_pipelined_close_stops_generation():
    tts, backend = make_tts()
    it = tts.stream("Hello world.", voice=VOICE, options=SynthesisOptions(greedy=True, max_frames=500))
    next(it)
    it.close()
    assert _workers() == []  # joined: nothing runs after close
    n = len(backend.events)
    talks = sum(1 for e in backend.events if e[0] == "talker")
    assert talks < 100  # stopped about a queue's depth ahead, not at the 500-frame budget
    assert len(backend.events) == n
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("pipeline", [False, True])
def test_backend_error_raises_after_the_chunks_before_it(pipeline):
    tts, backend = make_tts()
    orig = backend.predict_frame

    def failing(hidden, code0, params, uniforms):
        if sum(1 for e in backend.events if e[0] == "predict") == 7:
            raise RuntimeError("predictor exploded")
        return orig(hidden, code0, params, uniforms)

    backend.predict_frame = failing
    got = []
    with pytest.raises(RuntimeError, match="predictor exploded"):
        for chunk in tts.stream("Hello world.", voice=VOICE, options=SynthesisOptions(
                greedy=True, max_frames=30, watchdog=False, pipeline=pipeline)):  # fmt: skip
            got.append(chunk.num_frames)
    assert got == [1, 2, 4] and _workers() == []  # frames 1-7 decoded by the schedule, no final chunk


def _seeded(tts, pipeline: bool) -> list:
    voice = VOICE.__class__(np.full(tts.config.talker.hidden_size, 0.1, np.float32), model_size="0b6")
    opts = SynthesisOptions(seed=5, max_frames=20, watchdog=False, pipeline=pipeline)
    return list(tts.stream("Hello there. A second sentence.", voice=voice, options=opts))


def test_real_torch_pipelined_audio_equals_serial(real_tts):
    _same(_seeded(real_tts, False), _seeded(real_tts, True))


@pytest.fixture(scope="module")
def onnx_tts(tiny_snapshot, tmp_path_factory):
    import qtts
    from qtts.cli import main as qtts_main

    snapshot = tiny_snapshot()
    out = str(tmp_path_factory.mktemp("pipe") / "bundle")
    assert qtts_main(["export", "onnx", "-m", snapshot, "-o", out, "--components", "talker", "predictor",
                      "vocoder"]) == 0  # fmt: skip
    return qtts.load(snapshot, plan=os.path.join(out, "plan.json"), threads=1)


def test_onnx_plan_pipelined_audio_equals_serial(onnx_tts):
    assert onnx_tts.components.plan.get("vocoder").impl == "onnx"
    serial, piped = _seeded(onnx_tts, False), _seeded(onnx_tts, True)
    _same(serial, piped)
    assert [c.num_frames for c in serial][:3] == [1, 2, 4]  # the 1-frame first chunk through the B=1 step


def test_pipeline_option_default_and_replace():
    assert SynthesisOptions().first_chunk_frames == 1
    assert dataclasses.replace(SynthesisOptions(), pipeline=False).pipeline is False


def test_run_ahead_hold_pauses_the_worker_until_released():
    produced: list = []
    released = threading.Event()
    it = run_ahead(_counting(produced), depth=8, hold=(2, released))
    assert [next(it), next(it)] == [0, 1]
    for _ in range(50):  # give a worker that ignored the hold every chance to run on
        threading.Event().wait(0.002)
    assert len(produced) == 2
    released.set()
    assert [next(it) for _ in range(5)] == [2, 3, 4, 5, 6]
    it.close()
    assert _workers() == []


def test_run_ahead_close_releases_a_held_worker():
    produced: list = []
    it = run_ahead(_counting(produced), depth=8, hold=(1, threading.Event()))
    assert next(it) == 0
    it.close()  # must not hang on the held worker
    assert _workers() == [] and len(produced) == 1


def test_bench_runs_each_plan_pipelined_and_serial(tiny_snapshot, tmp_path, capsys):
    import json

    from qtts.cli import main as qtts_main

    out = tmp_path / "bench.json"
    argv = ["bench", "-m", tiny_snapshot(), "--frames", "5", "--repeats", "1", "--threads", "1",
            "--pipeline", "both", "--json", str(out)]  # fmt: skip
    assert qtts_main(argv) == 0
    text = capsys.readouterr().out
    assert "| peak RSS MB |" in text
    rows = json.loads(out.read_text())["results"]
    assert [r["pipeline"] for r in rows] == [True, False]
    assert "pipelined" in rows[0]["label"] and "serial" in rows[1]["label"]
    # components overlap when pipelined: no "other" remainder
    assert rows[0]["other_ms"] is None and rows[1]["other_ms"] is not None
    for r in rows:
        assert r["frames"] == 5 and r["plan_peak_rss_mb"] > 0 and r["vocoder_ms"] > 0 and r["ttfa_ms"] > 0


def test_bench_names_the_cpus_of_a_placed_stream(tiny_snapshot, monkeypatch):
    """qtts bench's label says where a placed pipelined stream ran (qtts.backends.Placement)."""
    import os

    from qtts.backends import Placement
    from qtts.tools.bench import BenchOptions, bench_plan

    cpus = sorted(os.sched_getaffinity(0))
    placed = Placement(cpus[0], cpus[-1], pin_decode=False)
    monkeypatch.setattr(Placement, "for_plan", classmethod(lambda cls, *a, **k: placed))
    opts = BenchOptions(frames=4, repeats=1, threads=1, pipeline=True)
    assert bench_plan(tiny_snapshot(), None, opts)["label"].endswith(f"pipelined, CPUs {cpus[0]} | {cpus[-1]})")
    serial = bench_plan(tiny_snapshot(), None, BenchOptions(frames=4, repeats=1, threads=1, pipeline=False))
    assert serial["label"].endswith("serial)")  # serial: no pipeline, so no CPUs in the label


def test_bench_warm_up_runs_every_step_size_before_the_measured_runs(tiny_snapshot):
    """A measured run pays no first call (a bf16 step size's first call costs 0.25-0.4 s more on the Zen 4
    VM: a 64-frame run's RTF +0.1 or more): qtts bench's warm-up runs every step size the runs use, as a
    server's TTS.warm does before it reports ready."""
    from qtts.backends import open as open_components
    from qtts.backends.torch import TorchVocoder
    from qtts.tools.bench import BenchOptions, one_run, warm_up

    parts = open_components(tiny_snapshot(), plan=None, threads=1)
    vocoder = TorchVocoder(parts.vocoder.decoder, 8, threads=1, precision="bf16")
    sizes: list[int] = []
    run = vocoder.run
    vocoder.run = lambda size, *args: sizes.append(size) or run(size, *args)
    parts = dataclasses.replace(parts, vocoder=vocoder)
    opts = BenchOptions(frames=23, repeats=1, threads=1, pipeline=False)
    warm_up(parts, opts)
    warmed = set(sizes)
    sizes.clear()
    one_run(parts, 23, opts)  # chunks 1, 2, 4, 8, 8: steps of 8, 4, 2 and 1 frames
    assert set(sizes) == {1, 2, 4, 8} and set(sizes) <= warmed
