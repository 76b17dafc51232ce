"""How far generation is from its memory floor: weight bytes a frame streams / measured read bandwidth.

A quantized talker and predictor read every weight once per frame, so ``bytes per frame /
bandwidth`` is the time no kernel can beat on that machine (issue 36). :func:`read_bandwidth_gbs`
measures the read bandwidth in-process (float32 sums over a buffer far larger than any cache,
one slice per thread, as many threads as generation runs on: one core alone does not reach
the memory's bandwidth, 16 against 29-33 GB/s with two threads on a 2-core Intel Xeon VM, so a
one-thread figure would put a two-thread generation at its floor when it is not);
:func:`generation_floor` puts the plan's streamed weight bytes
(:func:`qtts.export.verify.plan_weights`) beside it.
"""

from __future__ import annotations

import threading
import time

import numpy as np


def read_bandwidth_gbs(megabytes: int = 256, repeats: int = 5, threads: int = 1) -> float:
    """The best read bandwidth of a ``megabytes`` float32 buffer in GB/s (1e9 bytes): best of ``repeats``
    reads with each thread count from 1 to ``threads`` (each thread sums its own slice: numpy releases
    the GIL there and, unlike a BLAS dot, starts no threads of its own)."""
    a = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    float(np.add.reduce(a))  # faults the pages in
    best = float("inf")
    for n in range(1, max(1, int(threads)) + 1):
        parts = np.array_split(a, n)
        for _ in range(repeats):
            best = min(best, _timed_reads(parts))
    return a.nbytes / best / 1e9


def _timed_reads(parts: list) -> float:
    """Seconds for one thread per part to read its part once (one part: this thread)."""
    if len(parts) == 1:
        t = time.perf_counter()
        float(np.add.reduce(parts[0]))
        return time.perf_counter() - t
    workers = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
    t = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t


def generation_floor(plan, bandwidth_gbs: float, threads: int = 1) -> dict | None:
    """Weight bytes per frame of the plan's ONNX talker + predictor and the time reading them takes
    at ``bandwidth_gbs``; None for a plan without ONNX generation graphs (torch)."""
    from ..export.verify import plan_weights

    weights = plan_weights(plan, None)
    if not weights:
        return None
    nbytes = weights["per_frame"]["bytes"]
    return {"weight_mb_per_frame": nbytes / 1e6, "bandwidth_gbs": bandwidth_gbs, "threads": threads,
            "floor_ms": 1000.0 * nbytes / (bandwidth_gbs * 1e9)}  # fmt: skip


def floor_lines(results: list) -> list[str]:
    """Markdown lines: per plan, generation time per frame beside its weight-streaming floor."""
    rows = [r for r in results if r.get("floor")]
    if not rows:
        return []
    bw = rows[0]["floor"]["bandwidth_gbs"]
    threads = rows[0]["floor"].get("threads", 1)
    lines = ["", f"Generation vs its floor (weight bytes per frame / {bw:.1f} GB/s read bandwidth measured "
             f"in this process: float32 sums over 256 MB on 1 to {threads} threads, best of 5 each):", ""]  # fmt: skip
    for r in rows:
        f, gen = r["floor"], r["talker_ms"] + r["predictor_ms"]
        lines.append(f"* {r['label']}: {f['weight_mb_per_frame']:.0f} MB/frame, floor {f['floor_ms']:.1f} ms, "
                     f"talker + predictor {gen:.1f} ms ({gen / f['floor_ms']:.2f}x the floor)")
    return lines
