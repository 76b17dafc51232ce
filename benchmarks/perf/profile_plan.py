#!/usr/bin/env python3
"""Per-frame profile of a plan: talker / predictor / vocoder wall and CPU ms, node counts, weight
bytes and effective GB/s.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/profile_plan.py --model /work/ckpt/full06 \
        --plan /work/ckpt/full06-int4/plan.json [--threads 1] [--frames 32] [--repeats 2]

The run is serial (one thread of control; the product's pipeline overlaps the vocoder with
generation, see docs/performance.md) and decodes in the product's chunk schedule
(``--first-chunk``, then doubling up to ``--chunk``: qtts.engine.stream.Chunker). CPU ms (process
user+system time while inside the component) is the work done and is far less sensitive to the
foreign load of a shared VM than wall ms. Weight bytes = the initializers a graph reads per call
(MatMulNBits packed weights + scales; fp32 MatMul/Gather weights counted only where a MatMul
reads them); printed for ONNX talker / predictor entries only. Per-op kernel time of the talker
step and predictor frame: benchmarks/perf/graph_profile.py.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import loadavg, pages  # noqa: E402

from qtts.backends import open as open_components  # noqa: E402
from qtts.tools.bench import BenchOptions, one_run  # noqa: E402

#: timed method -> the column it is reported in
COLUMNS = {"talker": "talker", "predict_frame": "predictor", "decode": "vocoder"}


def weight_bytes(path: str) -> dict:
    import onnx

    m = onnx.load(path, load_external_data=False)
    sizes = {}
    for init in m.graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        sizes[init.name] = n * {1: 4, 2: 1, 3: 1, 7: 8, 10: 2, 6: 4}.get(init.data_type, 4)
    per_op, per_call = collections.Counter(), 0
    seen = set()
    for node in m.graph.node:
        if node.op_type in ("MatMulNBits", "MatMul", "Gemm"):
            for i in node.input[1:]:
                if i in sizes:
                    per_call += sizes[i]  # every execution of the node reads its weights once
                    if i not in seen:
                        seen.add(i)
                        per_op[node.op_type] += sizes[i]
    ops = collections.Counter(n.op_type for n in m.graph.node)
    return {"weights": dict(per_op), "per_call": per_call, "nodes": len(m.graph.node), "ops": dict(ops.most_common(12)),
            "all_initializers": sum(sizes.values())}


def print_run(r: dict) -> None:
    n = max(r["frames"], 1)
    backend, stream = r["timed"]
    cols = []
    for method, label in COLUMNS.items():
        src = stream if method == "decode" else backend
        cols.append(f"{label} {1000 * src.times.get(method, 0) / n:.1f} wall / {1000 * src.cpu.get(method, 0) / n:.1f} CPU")
    print(f"  run ({r['frames']} frames): wall {1000 * r['total_s'] / n:.1f} ms/frame, CPU {1000 * r['cpu_s'] / n:.1f} "
          f"ms/frame, foreign {r['foreign_cores']:.2f}; " + ", ".join(cols)
          + f"; prefill {1000 * backend.times.get('prefill', 0):.0f} ms")


def print_weights(parts, rows: list, threads: int) -> None:
    """Weights each ONNX generation graph reads per frame and the bandwidth that implies."""
    for comp, method in (("talker", "talker"), ("predictor", "predict_frame")):
        spec = parts.plan.get(comp)
        if spec.impl != "onnx":
            print(f"  {comp}: impl {spec.impl} (weight bytes only for onnx entries)")
            continue
        info = weight_bytes(spec.artifacts["main"])
        wb = sum(info["weights"].values())
        print(f"  {comp}: {info['nodes']} nodes, weights read by matmuls {wb / 1e6:.1f} MB ({info['weights']}),"
              f" all initializers {info['all_initializers'] / 1e6:.1f} MB; ops {info['ops']}")
        if not wb:
            continue
        reads = info["per_call"] / wb  # the fused predictor frame reads its layer weights 15 times
        per_frame = [1000 * r["timed"][0].cpu[method] / max(r["frames"], 1) for r in rows]
        walls = [1000 * r["timed"][0].times[method] / max(r["frames"], 1) for r in rows]
        print(f"    effective: {reads:.1f} x weights per frame -> {reads * wb / 1e6 / np.median(walls):.1f} GB/s (wall),"
              f" {reads * wb / 1e6 / np.median(per_frame) * threads:.1f} GB/s per {threads} CPU-s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--plan", default=None, help="plan.json (default: torch fp32 for every part)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every part")
    ap.add_argument("--frames", type=int, default=32, help="frames per measured run (EOS blocked)")
    ap.add_argument("--repeats", type=int, default=2, help="measured runs after one 4-frame warm-up")
    ap.add_argument("--first-chunk", type=int, default=BenchOptions.first_chunk, help="frames of the first chunk")
    ap.add_argument("--chunk", type=int, default=BenchOptions.chunk, help="largest chunk (frames)")
    ap.add_argument("--no-huge", action="store_true", help="keep the weights on 4 KB pages (QTTS_HUGE_PAGES=0; "
                    "by default an onnx plan's open() collapses them into 2 MB pages: an A/B of the page size)")
    args = ap.parse_args(argv)
    if args.no_huge:
        os.environ["QTTS_HUGE_PAGES"] = "0"
    opts = BenchOptions(threads=args.threads, first_chunk=args.first_chunk, chunk=args.chunk, pipeline=False)
    parts = open_components(args.model, plan=args.plan, threads=args.threads)
    one_run(parts, 4, opts)  # warm-up
    rows = [one_run(parts, args.frames, opts) for _ in range(args.repeats)]
    print(f"{args.plan or 'torch'}: {args.threads} threads, {args.frames} frames, chunks {args.first_chunk}..{args.chunk},"
          f" loadavg {loadavg()}; huge pages {not args.no_huge}: {pages()}")
    for r in rows:
        print_run(r)
    print_weights(parts, rows, args.threads)


if __name__ == "__main__":
    main()
