"""The batch invariance tests, shared by the modules that run them on each (checkpoint size, plan):
tests/engine/test_batch_invariance.py (tiny: every plan), test_batch_invariance_mid_fp32.py (mid:
``torch``, ``faithful``) and test_batch_invariance_mid_int.py (mid: ``fast``, ``fastest``). What
they check and why is in test_batch_invariance.py's docstring. The cases are split over modules
so that pytest-xdist's ``--dist loadfile`` runs them on both CI workers (one module took ~4 min).

A module defines ``preset_parts = preset_parts_fixture(cases)`` and imports the two tests; pytest
collects the imported tests in that module, with that module's fixture. The mid checkpoint is
conftest's ``mid_snapshot`` (written once per run, shared with tests/parity/test_parity_realdims.py).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from qtts.backends import open as open_parts
from qtts.engine.batching import advance_rows, predict_rows
from qtts.engine.generate import next_code0, prefill, release
from qtts.plans.cache import PRESETS
from support.batch_util import TEXTS, request, run_batch, voices


def _export(snapshot: str, out: str, preset: str) -> str:
    from qtts.export.onnx import ExportOptions, export_bundle

    p = PRESETS[preset]
    options = ExportOptions(talker=p.talker, predictor=p.predictor, block_size=p.block_size, tables=p.tables,
                            repair=p.repair, components=("talker", "predictor"), vocoder_main=0)  # fmt: skip
    export_bundle(snapshot, out, options)
    return os.path.join(out, "plan.json")


def generation_bundle(run_shared, snapshot: str, preset: str) -> str:
    """plan.json of ``preset``'s talker + predictor export of a tiny ``snapshot``, exported once per run
    (conftest's ``run_shared``): tests/engine/test_batching.py's fp32 ONNX case is ``faithful``'s."""
    name = f"bundle-{os.path.basename(snapshot)}-{preset}-generation"
    return os.path.join(run_shared(name, lambda out: _export(snapshot, out, preset)), "plan.json")


def preset_parts_fixture(cases: list):
    """The module fixture ``preset_parts`` parametrized over ``cases``, (size, plan) pairs."""

    @pytest.fixture(scope="module", params=cases, ids=[f"{size}-{plan}" for size, plan in cases])
    def preset_parts(request, tiny_snapshot, tmp_path_factory):
        """Two batched engines (4 rows) of a Base checkpoint on a plan: one runs each stream alone, the
        other runs them together (on torch one engine does both: its backend holds no batch state)."""
        size, preset = request.param
        snap = tiny_snapshot() if size == "tiny" else request.getfixturevalue("mid_snapshot")
        if preset == "torch":
            parts = open_parts(snap, plan="torch", threads=1, max_batch=4)
            yield parts, parts
            return
        if size == "tiny":
            plan = generation_bundle(request.getfixturevalue("run_shared"), snap, preset)
            yield tuple(open_parts(snap, plan=plan, threads=1, max_batch=4) for _ in range(2))
            return
        root = tmp_path_factory.mktemp(f"inv-{size}-{preset}")  # a mid bundle: 0.6 GB (int8) to 2 GB (fp32),
        plan = _export(snap, str(root / "bundle"), preset)  # this module's alone: removed after it
        solo, batched = (open_parts(snap, plan=plan, threads=1, max_batch=4) for _ in range(2))
        yield solo, batched
        shutil.rmtree(root, ignore_errors=True)

    return preset_parts


def _requests(parts) -> list:
    """Five streams: x-vector and ICL voices, five prompt lengths and budgets, greedy and seeded."""
    xv, icl = voices(parts.config)
    return [
        request(parts, "a", TEXTS[0], 16, voice=xv),
        request(parts, "b", TEXTS[1], 22, voice=icl, greedy=False, seed=7),
        request(parts, "c", TEXTS[2], 10, voice=xv, greedy=False, seed=3),
        request(parts, "d", TEXTS[3], 18, voice=icl),
        request(parts, "e", TEXTS[4], 12, voice=xv, greedy=False, seed=5),
    ]


def _solo_run(be, reqs, step: int) -> list:
    """Stream ``i`` alone on a batched engine for ``step`` frames: per frame (codes, talker logits after it)."""
    out = []
    for r in reqs:
        state, frames = prefill(be, r.prompt, r.params, r.speaker), []
        try:
            for _ in range(step):
                code0, u = next_code0(state, r.params)
                codes = predict_rows(be, [state], [code0], [r.params], [u])[0]
                advance_rows(be, [state], [codes])
                frames.append((codes, state.logits.copy()))
        finally:
            release(be, state)
        out.append(frames)
    return out


def test_rows_are_bitwise_alone_in_batches_of_one_to_four(preset_parts):
    """Every row's codes and talker logits in a batch equal the same stream's alone on the engine,
    bit for bit, whatever the batch: 1, 2, 3 and 4 rows, a row stepping alone above idle rows."""
    solo, batched = preset_parts
    reqs = _requests(batched)[:4]
    ref = _solo_run(solo.backend, reqs, 8)
    many = [prefill(batched.backend, r.prompt, r.params, r.speaker) for r in reqs]
    try:
        for step in range(8):
            groups = ([[0, 1, 2, 3]], [[3], [0, 1, 2]], [[0, 1], [2], [3]], [[1, 2, 3], [0]])[step % 4]
            for g in groups:
                picks = [next_code0(many[i], reqs[i].params) for i in g]
                rows = predict_rows(batched.backend, [many[i] for i in g], [c for c, _ in picks],
                                    [reqs[i].params for i in g], [u for _, u in picks])  # fmt: skip
                for i, r in zip(g, rows):
                    np.testing.assert_array_equal(r, ref[i][step][0], err_msg=f"step {step}: stream {i}, rows {g}")
                advance_rows(batched.backend, [many[i] for i in g], [ref[i][step][0] for i in g])
            for i, state in enumerate(many):
                assert np.array_equal(state.logits, ref[i][step][1]), f"step {step}: talker logits of stream {i}"
    finally:
        for state in many:
            release(batched.backend, state)


def test_streams_equal_alone_with_arrivals_and_a_cancellation(preset_parts):
    """Whole streams through the batch loop: a joins alone, b and c after two steps, d and e after
    five (e waits for a row), c is cancelled mid-stream; each equals its run alone on the engine."""
    solo, batched = preset_parts
    reqs = _requests(batched)
    ref = {}
    for r in reqs:
        sink = run_batch(solo.backend, {0: [r]})[0][r.name]
        ref[r.name] = (sink.codes, sink.end)
    sinks, stats = run_batch(batched.backend, {0: [reqs[0]], 2: reqs[1:3], 5: reqs[3:]}, cancel_at={7: ["c"]})
    assert max(s.rows for s in stats) == 4 and 1 in [s.rows for s in stats]
    assert sinks["c"].end == "cancelled" and 0 < len(sinks["c"].codes) < len(ref["c"][0])
    np.testing.assert_array_equal(sinks["c"].codes, ref["c"][0][: len(sinks["c"].codes)])
    for r in reqs:
        if r.name == "c":
            continue
        assert sinks[r.name].error is None and sinks[r.name].end == ref[r.name][1], r.name
        np.testing.assert_array_equal(sinks[r.name].codes, ref[r.name][0], err_msg=f"stream {r.name}")
