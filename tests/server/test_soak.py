"""A short run of benchmarks/soak.py: 8 concurrent streams on a tiny checkpoint, no errors, bounded RSS."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from conftest import REPO_ROOT


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", os.path.join(REPO_ROOT, "benchmarks", "soak.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_soak(tiny_snapshot, tmp_path):
    soak = _soak_module()
    out = tmp_path / "soak.json"
    # a fixed count (the mix is deterministic: 4 disconnects, 3 unknown voices, 17 full streams)
    # with a generous time cap, so a slow machine changes only the duration
    rc = soak.main(["--model", tiny_snapshot(kind="custom_voice"), "--max-requests", "24", "--duration", "120",
                    "--streams", "8",
                    "--max-frames", "4", "--workers", "2", "--sample-every", "1", "--warmup", "0.3",
                    "--rss-bound-mb", "100", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, report
    assert report["requests"] == 24 and report["errors"] == 0
    assert (report["ok"], report["disconnected"], report["rejected_as_expected"]) == (17, 4, 3)
    assert len(report["rss_mb"]) >= 2


def test_quick_soak_one_batched_engine(tiny_snapshot, tmp_path):
    """The same mix through one engine that batches 4 streams: no errors, no RSS growth."""
    soak = _soak_module()
    out = tmp_path / "soak.json"
    rc = soak.main(["--model", tiny_snapshot(kind="custom_voice"), "--max-requests", "24", "--duration", "120",
                    "--streams", "8", "--max-frames", "4", "--max-batch", "4", "--sample-every", "1",
                    "--warmup", "0.3", "--rss-bound-mb", "100", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, report
    assert report["requests"] == 24 and report["errors"] == 0
    assert (report["ok"], report["disconnected"], report["rejected_as_expected"]) == (17, 4, 3)


def test_soak_reports_both_phases(tiny_snapshot, tmp_path):
    """--baseline: the good clients' figures without and with the last phase, and the bound check
    (a huge factor here: the mechanism, not a speed)."""
    soak = _soak_module()
    out = tmp_path / "soak.json"
    rc = soak.main(["--model", tiny_snapshot(kind="custom_voice"), "--baseline", "2", "--duration", "2",
                    "--streams", "2", "--max-frames", "4", "--workers", "1", "--capacity", "1", "--sample-every", "1",
                    "--bound-factor", "1000", "--ttfa-bound", "1000", "--rtf-bound", "1000", "--rss-bound-mb", "100",
                    "--tracemalloc", "5", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["errors"] == 0, report
    held = report["tracemalloc_growth"]  # --tracemalloc: what is still held once every client has gone
    assert 0 < len(held) <= 5 and all(":" in line and "KiB" in line for line in held), held
    for key in ("baseline_ttfa_s_p95", "baseline_rtf_p95", "ttfa_s_p95", "rtf_p95"):
        assert report[key] > 0, key
    assert report["bounds"] == {"ttfa_s": True, "rtf": True}
    assert report["absolute_bounds"] == {"ttfa_s": True, "rtf": True}
    assert report["rss_phase_growth_mb"] is not None


def test_soak_refuses_remote_hosts():
    soak = _soak_module()
    for url in ("http://10.0.0.5:8000", "http://example.com", "http://0.0.0.0:8000"):
        with pytest.raises(SystemExit, match="non-loopback"):
            soak.check_loopback(url)
    assert soak.check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"


def test_absolute_bounds_check_the_last_phase_p95():
    """--ttfa-bound / --rtf-bound: issue 25's row as a fixed limit on the last phase's p95."""
    soak = _soak_module()
    report = {"ttfa_s_p95": 0.25, "rtf_p95": 0.95, "baseline_rtf_p95": 0.5}
    assert soak._absolute_bounds(report, {"ttfa_s": 0.3, "rtf": 0.9}) == {"ttfa_s": True, "rtf": False}
    assert soak._absolute_bounds(report, {"ttfa_s": None, "rtf": None}) == {}
