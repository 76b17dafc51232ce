#!/usr/bin/env python3
"""Per-frame profile of a plan: talker / predictor / vocoder wall and CPU ms, op-type kernel time,
node counts, weight bytes and effective GB/s.

    PYTHONPATH=src .venv/bin/python scripts/perf/profile_plan.py --model /work/ckpt/full06 \
        --plan /work/ckpt/full06-int4/plan.json [--threads 2] [--frames 32] [--ort-profile]

CPU ms (process user+system time while inside the component) is the work done and is far less
sensitive to the foreign load of this shared VM than wall ms. Weight bytes = the initializers a
graph reads per call (MatMulNBits packed weights + scales; fp32 MatMul/Gather weights counted
only where a MatMul reads them).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from common import loadavg  # noqa: E402

from qtts.bench import BenchOptions, _busy_jiffies, _loop_params, foreign_cores  # noqa: E402
from qtts.generate import generate  # noqa: E402
from qtts.runtime import Runtime  # noqa: E402
from qtts.verify import _prompt  # noqa: E402


class Timed:
    def __init__(self, inner, names):
        self._inner, self._names = inner, names
        self.wall, self.cpu, self.calls = collections.Counter(), collections.Counter(), collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self._names:
            return attr

        def timed(*a, **k):
            c0, t0 = time.process_time(), time.perf_counter()
            out = attr(*a, **k)
            key = "prefill" if name == "talker" and np.asarray(a[0]).shape[0] > 1 else name
            self.wall[key] += time.perf_counter() - t0
            self.cpu[key] += time.process_time() - c0
            self.calls[key] += 1
            return out

        return timed


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


def ort_profile(sess_factory_path: str, threads: int, feed_fn, runs: int = 8) -> dict:
    """Op-type kernel ms per run of a session (fresh session with profiling on)."""
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    with tempfile.TemporaryDirectory() as tmp:
        so = session_options(threads)
        so.enable_profiling, so.profile_file_prefix = True, os.path.join(tmp, "p")
        s = ort.InferenceSession(sess_factory_path, so, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            feed_fn(s)
        with open(s.end_profiling(), encoding="utf-8") as fh:
            ev = json.load(fh)
    per = collections.Counter()
    n_runs = sum(e.get("name") == "model_run" for e in ev)
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["args"]["op_name"]] += e["dur"] / 1000.0 / n_runs
    return dict(per)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/ckpt/full06")
    ap.add_argument("--plan", default="/work/ckpt/full06-int4/plan.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ort-profile", action="store_true")
    args = ap.parse_args()
    opts = BenchOptions(threads=args.threads)
    rt = Runtime.open(args.model, plan=args.plan, threads=args.threads)
    prompt, speaker = _prompt(rt, opts.text)
    rows = []
    for r in range(args.repeats + 1):
        backend = Timed(rt.backend, ("talker", "predict_frame"))
        dec = Timed(rt.new_decoder(), ("decode",))
        lp = _loop_params(rt, args.frames if r else 4, opts.seed)
        pending, n = [], 0
        j0, c0, t0 = _busy_jiffies(), time.process_time(), time.perf_counter()
        for codes in generate(backend, prompt, lp, speaker):
            pending.append(codes)
            n += 1
            if len(pending) >= (2 if n <= 2 else 8):
                dec.decode(np.asarray(pending))
                pending = []
        if pending:
            dec.decode(np.asarray(pending))
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        if r:
            rows.append((n, total, cpu, foreign_cores(j0, _busy_jiffies(), total), backend, dec))
    print(f"{args.plan}: {args.threads} threads, {args.frames} frames, loadavg {loadavg()}")
    for n, total, cpu, foreign, b, d in rows:
        parts = [(k, b.wall[k], b.cpu[k]) for k in ("talker", "predict_frame")] + [("vocoder", d.wall["decode"], d.cpu["decode"])]
        print(f"  run: wall {1000 * total / n:.1f} ms/frame, CPU {1000 * cpu / n:.1f} ms/frame, foreign {foreign:.2f}; "
              + ", ".join(f"{k} {1000 * w / n:.1f} wall / {1000 * c / n:.1f} CPU" for k, w, c in parts)
              + f"; prefill {1000 * b.wall['prefill']:.0f} ms")
    bundle = os.path.dirname(os.path.abspath(args.plan))
    plan = json.load(open(args.plan))
    for comp in ("talker", "code_predictor"):
        path = os.path.join(bundle, plan[comp]["artifacts"]["main"])
        info = weight_bytes(path)
        wb = sum(info["weights"].values())
        key = "talker" if comp == "talker" else "predict_frame"
        reads = info["per_call"] / wb  # the fused predictor frame reads its layer weights 15 times
        per_frame = [1000 * b.cpu[key] / n for n, _, _, _, b, _ in rows]
        walls = [1000 * b.wall[key] / n for n, _, _, _, b, _ in rows]
        print(f"  {comp}: {info['nodes']} nodes, weights read by matmuls {wb / 1e6:.1f} MB ({info['weights']}),"
              f" all initializers {info['all_initializers'] / 1e6:.1f} MB; ops {info['ops']}")
        print(f"    effective: {reads:.1f} x weights per frame -> {reads * wb / 1e6 / np.median(walls):.1f} GB/s (wall),"
              f" {reads * wb / 1e6 / np.median(per_frame) * args.threads:.1f} GB/s per {args.threads} CPU-s")


if __name__ == "__main__":
    main()
