"""Placement of a pipelined stream's threads on a two-CPU machine (qtts.backends.Placement).

When it applies (exactly two CPUs, onnxruntime generation, one stream per engine, QTTS_PIN not off),
which CPUs onnxruntime's workers, the generation thread and the decoding get, that one stream of the
process is placed at a time, that the caller's CPUs come back after each decode, and that the
audio of a placed stream is bit for bit the unplaced one. Speed is the benchmark's (docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import numpy as np
import pytest

import qtts.backends as pl
from qtts.backends import Placement
from qtts.plans.plan import ComponentSpec, Plan

ONNX = Plan({"talker": ComponentSpec("talker", "onnx"), "predictor": ComponentSpec("predictor", "onnx"),
             "vocoder": ComponentSpec("vocoder", "torch", options={"precision": "bf16", "threads": 1})})  # fmt: skip
CPUS = sorted(os.sched_getaffinity(0))
GEN, SHARED = CPUS[0], CPUS[-1]  # one CPU (a machine with one) is both: the checks below still hold


@pytest.fixture(autouse=True)
def _free(monkeypatch):
    monkeypatch.delenv(pl.PIN_ENV, raising=False)
    yield
    assert pl._PLACED == []  # every test gives its claim back


def test_applies_only_to_two_cpus_onnx_generation_one_stream_per_engine(monkeypatch):
    got = Placement.for_plan(ONNX, threads=2, max_batch=1, cpus=[7, 3])
    assert (got.generation, got.shared, got.pin_decode) == (3, 7, True)
    assert got.worker_affinity(2) == "8"  # onnxruntime numbers processors from 1
    assert got.worker_affinity(1) is None and got.worker_affinity(3) is None
    fp32 = Plan({**ONNX.components, "vocoder": ComponentSpec("vocoder", "onnx")})
    assert Placement.for_plan(fp32, threads=2, max_batch=1, cpus=[0, 1]).pin_decode is False  # a 2-thread vocoder
    assert Placement.for_plan(ONNX, threads=1, max_batch=1, cpus=[0, 1]) is not None
    for cpus in ([0], [0, 1, 2], [0, 1, 2, 3]):
        assert Placement.for_plan(ONNX, threads=2, max_batch=1, cpus=cpus) is None
    assert Placement.for_plan(Plan(), threads=2, max_batch=1, cpus=[0, 1]) is None  # torch generation
    assert Placement.for_plan(ONNX, threads=2, max_batch=4, cpus=[0, 1]) is None  # a batch engine
    assert Placement.for_plan(ONNX, threads=3, max_batch=1, cpus=[0, 1]) is None
    for off in ("0", "off", "No", "false"):
        monkeypatch.setenv(pl.PIN_ENV, off)
        assert Placement.for_plan(ONNX, threads=2, max_batch=1, cpus=[0, 1]) is None


def test_not_with_the_compiled_predictor_layer_nor_a_plan_of_other_threads(tmp_path):
    def plan(kernels: dict, threads: int = 2) -> Plan:
        (tmp_path / "manifest.json").write_text(json.dumps({"graphs": {"predictor": {"kernels": kernels}}}))
        main = {"main": str(tmp_path / "predictor.frame.int8.onnx")}
        return Plan({**ONNX.components, "talker": ComponentSpec("talker", "onnx", options={"threads": threads}),
                     "predictor": ComponentSpec("predictor", "onnx", artifacts=main)})  # fmt: skip

    assert Placement.for_plan(plan({}), threads=2, max_batch=1, cpus=[0, 1]) is not None
    # the DecoderLayer op starts its own threads on first use: from the placed generation thread, one CPU
    assert Placement.for_plan(plan({"qtts.kernels::DecoderLayer": 75}), threads=2, max_batch=1, cpus=[0, 1]) is None
    assert Placement.for_plan(plan({}, threads=4), threads=2, max_batch=1, cpus=[0, 1]) is None  # the plan's own


def test_onnxruntime_pins_the_worker_to_the_shared_cpu(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from qtts.backends.onnx import session_options

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    before = set(os.listdir("/proc/self/task"))
    affinity = Placement(GEN, SHARED, True).worker_affinity(2)
    so = session_options(2, affinity=affinity)
    assert so.get_session_config_entry("session.intra_op_thread_affinities") == affinity
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.ones((64, 64), np.float32)})
    for _ in range(500):  # the worker sets its CPUs when it first runs (a busy machine: later)
        new = [os.sched_getaffinity(int(tid)) for tid in set(os.listdir("/proc/self/task")) - before]
        if {SHARED} in new:
            break
        time.sleep(0.01)
    assert {SHARED} in new  # two intra-op threads: the caller and one worker, on the shared CPU


def test_one_stream_of_the_process_is_placed_at_a_time():
    a, b = Placement(GEN, SHARED, True), Placement(GEN, SHARED, True)  # two engines
    assert a.claim()
    assert not a.claim() and not b.claim()
    a.release()
    assert b.claim()
    b.release()


def test_decoding_runs_on_the_shared_cpu_and_gives_the_callers_cpus_back():
    before = os.sched_getaffinity(0)
    with Placement(GEN, SHARED, True).decoding():
        assert os.sched_getaffinity(0) == {SHARED}
    assert os.sched_getaffinity(0) == before
    with Placement(GEN, SHARED, False).decoding():  # a vocoder of two threads stays where it is
        assert os.sched_getaffinity(0) == before
    if len(CPUS) > 1:  # a caller that keeps itself off the shared CPU stays off it
        os.sched_setaffinity(0, {GEN})
        try:
            with Placement(GEN, SHARED, True).decoding():
                assert os.sched_getaffinity(0) == {GEN}
        finally:
            os.sched_setaffinity(0, before)


def test_a_placed_stream_is_the_same_audio_with_its_threads_where_placed(tiny_snapshot, tiny_bundle, monkeypatch):
    from qtts import TTS
    from qtts.backends import open as open_components
    from qtts.options import SynthesisOptions
    from qtts.tools.bench import bench_voice

    bundle = tiny_bundle("custom_voice", "--vocoder-first", "2", "--vocoder-main", "4")
    parts = open_components(tiny_snapshot(kind="custom_voice"), os.path.join(bundle, "plan.json"), threads=2)
    calls: list = []
    real = pl._pin
    monkeypatch.setattr(pl, "_pin", lambda cpus: (calls.append((threading.current_thread().name, cpus)),
                                                           real(cpus)))  # fmt: skip
    options = SynthesisOptions(max_frames=12, seed=3, pipeline=True)
    before = os.sched_getaffinity(0)

    def audio(placement):
        tts = TTS(dataclasses.replace(parts, placement=placement))
        return np.concatenate([c.samples for c in tts.stream("Hello there, placed world.", options=options,
                                                               **bench_voice(parts.config))])  # fmt: skip

    plain = audio(None)
    assert calls == []
    placed = audio(Placement(GEN, SHARED, True))
    np.testing.assert_array_equal(placed, plain)
    assert ("qtts-generation", {GEN}) in calls
    main = [cpus for name, cpus in calls if name == threading.current_thread().name]
    assert main and main[::2] == [{SHARED}] * len(main[::2]) and main[1::2] == [before] * len(main[1::2])
    assert os.sched_getaffinity(0) == before
