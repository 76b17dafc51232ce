"""How far generation is from its memory floor: weight bytes a frame streams / measured read bandwidth.

A quantized talker and predictor read every weight once per frame, so ``bytes per frame /
bandwidth`` is the time no kernel can beat on that machine (issue 36). :func:`read_bandwidth_gbs`
measures the read bandwidth in-process (a float32 dot product over a buffer far larger than any
cache: it reads each byte once, on the BLAS threads); :func:`generation_floor` puts the plan's
streamed weight bytes (:func:`qtts.export.verify.plan_weights`) beside it.
"""

from __future__ import annotations

import time

import numpy as np


def read_bandwidth_gbs(megabytes: int = 256, repeats: int = 5) -> float:
    """Best of ``repeats`` reads of a ``megabytes`` float32 buffer, in GB/s (1e9 bytes)."""
    a = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    float(np.dot(a, a))  # faults the pages in
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        float(np.dot(a, a))
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def generation_floor(plan, bandwidth_gbs: float) -> dict | None:
    """Weight bytes per frame of the plan's ONNX talker + predictor and the time reading them takes
    at ``bandwidth_gbs``; None for a plan without ONNX generation graphs (torch)."""
    from ..export.verify import plan_weights

    weights = plan_weights(plan, None)
    if not weights:
        return None
    nbytes = weights["per_frame"]["bytes"]
    return {"weight_mb_per_frame": nbytes / 1e6, "bandwidth_gbs": bandwidth_gbs,
            "floor_ms": 1000.0 * nbytes / (bandwidth_gbs * 1e9)}  # fmt: skip


def floor_lines(results: list) -> list[str]:
    """Markdown lines: per plan, generation time per frame beside its weight-streaming floor."""
    rows = [r for r in results if r.get("floor")]
    if not rows:
        return []
    bw = rows[0]["floor"]["bandwidth_gbs"]
    lines = ["", f"Generation vs its floor (weight bytes per frame / {bw:.1f} GB/s read bandwidth measured "
             "in this process: a float32 dot over 256 MB, best of 5):", ""]  # fmt: skip
    for r in rows:
        f, gen = r["floor"], r["talker_ms"] + r["predictor_ms"]
        lines.append(f"* {r['label']}: {f['weight_mb_per_frame']:.0f} MB/frame, floor {f['floor_ms']:.1f} ms, "
                     f"talker + predictor {gen:.1f} ms ({gen / f['floor_ms']:.2f}x the floor)")
    return lines
