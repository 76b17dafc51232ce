"""Every research script in benchmarks/perf/ still starts on the current API.

docs/performance.md cites these scripts as the way to reproduce its numbers; when an API they
import is renamed or removed, ``--help`` fails at import time. So each one runs ``--help`` in a
subprocess (PYTHONPATH=src, as the scripts' usage lines say) and must exit 0 with an argparse
usage line. ``_*.py`` files are helper modules the scripts import (checked through them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "benchmarks" / "perf"
SCRIPTS = sorted(p.name for p in PERF.glob("*.py") if not p.name.startswith("_"))


def test_perf_scripts_are_found():
    assert "profile_plan.py" in SCRIPTS and "plan_rss.py" in SCRIPTS, SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_perf_script_help_exits_0(name):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(PERF / name), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, f"benchmarks/perf/{name} --help exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.startswith("usage:"), f"benchmarks/perf/{name} --help printed no argparse usage:\n{proc.stdout[:500]}"
