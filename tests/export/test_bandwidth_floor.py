"""qtts bench's generation floor: weight bytes per frame / read bandwidth, beside the measured time."""

from __future__ import annotations

from qtts.plans.plan import Plan
from qtts.tools import bandwidth


def test_floor_is_bytes_over_bandwidth(monkeypatch):
    import qtts.export.verify as verify

    monkeypatch.setattr(verify, "plan_weights", lambda plan, path: {"per_frame": {"bytes": 1.6e9, "weights": 1}})
    got = bandwidth.generation_floor(object(), 32.0, threads=2)
    assert got == {"weight_mb_per_frame": 1600.0, "bandwidth_gbs": 32.0, "threads": 2, "floor_ms": 50.0}
    lines = bandwidth.floor_lines([{"label": "fast", "floor": got, "talker_ms": 30.0, "predictor_ms": 70.0},
                                   {"label": "torch", "floor": None, "talker_ms": 1.0, "predictor_ms": 1.0}])
    assert lines[-1] == "* fast: 1600 MB/frame, floor 50.0 ms, talker + predictor 100.0 ms (2.00x the floor)"
    assert not any("torch" in line for line in lines)
    assert "on 1 to 2 threads" in lines[1]


def test_a_torch_plan_has_no_floor_and_bandwidth_is_measured():
    assert bandwidth.generation_floor(Plan(), 10.0) is None
    assert bandwidth.floor_lines([]) == []
    assert bandwidth.read_bandwidth_gbs(megabytes=8, repeats=2) > 0.1


def test_bandwidth_is_the_best_over_each_thread_count(monkeypatch):
    """A two-thread generation is measured against what two threads read, not one core's rate: every
    count from 1 to ``threads`` reads the whole buffer (split in that many slices), the best one wins."""
    seen = []

    def timed(parts):
        seen.append((len(parts), sum(p.nbytes for p in parts)))
        return {1: 0.02, 2: 0.01, 3: 0.015}[len(parts)]

    monkeypatch.setattr(bandwidth, "_timed_reads", timed)
    got = bandwidth.read_bandwidth_gbs(megabytes=8, repeats=2, threads=3)
    assert sorted(set(seen)) == [(1, 8 * 2**20), (2, 8 * 2**20), (3, 8 * 2**20)] and len(seen) == 6
    assert got == 8 * 2**20 / 0.01 / 1e9


def test_threaded_reads_run_on_real_threads():
    assert bandwidth.read_bandwidth_gbs(megabytes=8, repeats=2, threads=2) > 0.1
