"""Shared helpers of the benchmarks/perf/ measurements (a module, not a script): interleaved A/B
timing with foreign-load sampling.

Every script under benchmarks/perf/ measures variants *interleaved in one process* (the order
rotates every round), records the CPU used by other processes (/proc/stat minus this process)
around every sample, and reports medians and ratios to the first variant. CPU time of the process (user + system, all threads) is
recorded too: with spinning off it is the work done, much less sensitive to contention than wall
time (but it does not show parallel speed-up). Absolute times on the
shared 2-core VM drift; the ratios are what the findings quote.
"""

from __future__ import annotations

import os
import time

import numpy as np

from qtts.tools.bench import busy_jiffies, foreign_cores


def interleaved(variants: dict, rounds: int, inner: int = 1, warmup: int = 1) -> dict:
    """``variants``: name -> zero-arg callable. Returns name -> dict(ms=[...], foreign=[...]).

    Each round runs every variant once (order rotated by one each round); a sample is the mean
    wall time of ``inner`` consecutive calls, in ms.
    """
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    out = {n: {"ms": [], "cpu": [], "foreign": []} for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            fn = variants[name]
            j0 = busy_jiffies()
            c0 = time.process_time()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            dt = time.perf_counter() - t0
            out[name]["cpu"].append(1000.0 * (time.process_time() - c0) / inner)
            out[name]["ms"].append(1000.0 * dt / inner)
            out[name]["foreign"].append(foreign_cores(j0, busy_jiffies(), dt))
    return out


def report(results: dict, unit: str = "ms", scale: float = 1.0, base: str | None = None) -> str:
    """One line per variant: median, p25-p75, ratio to ``base`` (default: the first), foreign load."""
    names = list(results)
    base = base or names[0]
    med0 = np.median(results[base]["ms"])
    cpu0 = np.median(results[base]["cpu"]) if results[base].get("cpu") else None
    lines = []
    for n in names:
        a = np.asarray(results[n]["ms"]) * scale
        med = np.median(a)
        lines.append(
            f"  {n:<44} median {med:8.2f} {unit}  [p25 {np.percentile(a, 25):7.2f} p75 {np.percentile(a, 75):7.2f}]"
            f"  x{np.median(results[n]['ms']) / med0:5.3f} vs {base}"
            f"  foreign {np.median(results[n]['foreign']):.2f} (max {np.max(results[n]['foreign']):.2f})"
            + (f"  | CPU {np.median(results[n]['cpu']) * scale:8.2f} {unit} x{np.median(results[n]['cpu']) / cpu0:5.3f}"
               if cpu0 else "")
        )
    return "\n".join(lines)


def loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return fh.read().split()[0]
    except OSError:
        return "?"


def pages() -> str:
    """Rss and AnonHugePages of this process (Linux; numpy already advises huge pages for its own
    large arrays, onnxruntime does not for its buffers)."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as fh:
            return " ".join(" ".join(ln.split()) for ln in fh if ln.startswith(("Rss", "AnonHugePages")))
    except OSError:
        return "pages: ?"


def collapse_huge() -> None:
    """MADV_HUGEPAGE + MADV_COLLAPSE over this process's large resident anonymous mappings
    (onnxruntime's prepacked weights among them): what an onnx plan's open() does
    (qtts.backends.advise_huge_pages), here for sessions a script builds itself."""
    from qtts import backends

    os.environ.pop(backends.HUGE_PAGES_ENV, None)
    backends.advise_huge_pages()


def add_batch_arguments(p, frames: int) -> None:
    """The flags of a batched-engine probe (``--model --streams --frames --rounds --threads``)."""
    p.add_argument("--model", required=True, help="snapshot dir (a CustomVoice or Base checkpoint)")
    p.add_argument("--streams", type=int, default=1, help="streams run together (1-4; default 1)")
    p.add_argument("--frames", type=int, default=frames, help=f"frames per stream and run (default {frames})")
    p.add_argument("--rounds", type=int, default=4, help="runs of each variant, interleaved (default 4)")
    p.add_argument("--threads", type=int, default=2)


def batch_requests(parts, streams: int, frames: int) -> list:
    """``streams`` requests of exactly ``frames`` frames each (EOS blocked) for the batch loop of the
    tests' support.batch_util (the caller puts tests/ on sys.path): named speakers, else random voices."""
    from support.batch_util import request, voices

    speakers = list(parts.config.speakers or [])
    cond = [{"speaker": s} for s in speakers] if speakers else [{"voice": v} for v in voices(parts.config)]
    text = "A sentence of a medium length for the benchmark, spoken once."
    return [request(parts, f"s{i}", text, frames, min_frames=frames, **cond[i % len(cond)]) for i in range(streams)]
