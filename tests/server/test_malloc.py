"""The server caps glibc's malloc arenas (qtts.server.malloc): threads share 2 arenas instead of
one each, which kept the full-size soak's RSS growing under connection churn."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = r"""
import ctypes, sys, threading
from qtts.server.malloc import limit_arenas
print("cap", limit_arenas(), flush=True)
keep, barrier = [], threading.Barrier(8)
def work():
    keep.append([bytearray(5000) for _ in range(50)])  # C malloc (not pymalloc, not mmap) per thread
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
sys.stderr.flush()
ctypes.CDLL("libc.so.6").malloc_stats()
"""


def _arenas(cap: bool, env_arenas: str | None = None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if env_arenas:
        env["MALLOC_ARENA_MAX"] = env_arenas
    code = PROBE if cap else PROBE.replace('print("cap", limit_arenas(), flush=True)', 'print("cap none")')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         check=True)
    return out.stdout.split()[1], sum(line.startswith("Arena ") for line in out.stderr.splitlines())


def test_eight_threads_share_two_arenas():
    cap, arenas = _arenas(cap=False)
    assert cap == "none" and arenas > 2  # glibc's own: one per thread (9 here), up to 8 per core
    assert _arenas(cap=True) == ("2", 2)


def test_the_environment_wins():
    assert _arenas(cap=True, env_arenas="4") == ("None", 4)
