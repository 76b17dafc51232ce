"""benchmarks/capacity.py drives a real `qtts serve` subprocess with closed-loop clients over pcm, sse
and the WebSocket and reports every request (a tiny checkpoint: the mechanism, not the speed)."""

from __future__ import annotations

import importlib.util
import json
import os

from conftest import REPO_ROOT


def test_capacity_script_smoke(tiny_snapshot, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("capacity", os.path.join(REPO_ROOT, "benchmarks", "capacity.py"))
    capacity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capacity)
    out = tmp_path / "cap.json"
    # 3 clients: more WebSocket sessions than one address may hold (2), so each client needs its own address
    argv = ["--model", tiny_snapshot(kind="custom_voice"), "--max-batch", "3", "--capacity", "3", "--threads", "1",
            "--clients", "1,3", "--duration", "1", "--frames", "4", "--transport", "pcm", "--transport", "sse",
            "--transport", "ws", "--json", str(out)]  # fmt: skip
    assert capacity.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["transport"], r["clients"]) for r in rows] == [(t, k) for t in ("pcm", "sse", "ws") for k in (1, 3)]
    for r in rows:
        assert r["requests"] >= r["clients"] and r["errors"] == 0 and r["busy"] == 0
        assert r["rtf_p50"] > 0 and r["first_p95_ms"] >= r["first_p50_ms"] > 0 and r["audio_s_per_s"] > 0
    assert "| ws | 3 |" in capsys.readouterr().out
