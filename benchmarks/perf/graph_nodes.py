#!/usr/bin/env python3
"""Nodes of a predictor frame / talker step graph as exported and as onnxruntime runs them, and an
interleaved CPU-time A/B of two such graphs.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/graph_nodes.py count GRAPH.onnx [GRAPH.onnx ...]
    PYTHONPATH=src .venv/bin/python benchmarks/perf/graph_nodes.py ab A.onnx B.onnx [--talker --layers N] \
        [--threads 1] [--rounds 200]

``count``: op types of the exported proto and of the graph after onnxruntime's optimizer with the
product's session options (``optimized_model_filepath``): what actually executes. ``ab``: one
frame (predictor: greedy-free sampling with fixed uniforms) or one talker decode step at position
40 (KV bound in place, as the backend does), the two graphs alternated call by call
(benchmarks/perf/_common.interleaved), CPU ms medians and the ratio B/A.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402


def counts(path: str, threads: int = 1) -> tuple[collections.Counter, collections.Counter]:
    """(exported, optimized) op-type counts of the graph at ``path``."""
    import onnx
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    exported = onnx.load(path, load_external_data=False)
    with tempfile.TemporaryDirectory() as tmp:
        so = session_options(threads)
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath, load_external_data=False)
    return tuple(collections.Counter(n.op_type for n in m.graph.node) for m in (exported, optimized))


def frame_runner(path: str, threads: int, hidden: int):
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    rng = np.random.default_rng(0)
    feeds = {"hidden": rng.standard_normal((1, hidden)).astype(np.float32) * 0.1, "code0": np.array([5]),
             "uniforms": rng.random(15).astype(np.float32), "temperature": np.array([0.9], np.float32),
             "top_k": np.array([50]), "top_p": np.array([1.0], np.float32), "do_sample": np.array([True])}  # fmt: skip
    session = ort.InferenceSession(path, session_options(threads), providers=["CPUExecutionProvider"])
    return lambda: session.run(["codes"], feeds)


def talker_runner(path: str, threads: int, hidden: int, layers: int, kv_heads: int = 8, head_dim: int = 128):
    import onnxruntime as ort

    from qtts.backends.onnx import KVBinding, session_options
    from qtts.export.contrib import rope_tables

    cos, sin = (t.numpy() for t in rope_tables(256, head_dim, 1e6))
    session = ort.InferenceSession(path, session_options(threads), providers=["CPUExecutionProvider"])
    state = KVBinding(session, layers, (1, kv_heads, 256, head_dim), cos, sin, ["logits", "hidden"])
    x = np.random.default_rng(0).standard_normal((1, 1, hidden)).astype(np.float32) * 0.1
    return lambda: state.run(x, 40)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("count", "ab"))
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--talker", action="store_true", help="the graphs are talker step graphs")
    ap.add_argument("--layers", type=int, default=28, help="talker layers (--talker)")
    args = ap.parse_args(argv)
    if args.mode == "count":
        for path in args.graphs:
            a, b = counts(path, args.threads)
            print(f"{path}: exported {sum(a.values())} nodes, executed {sum(b.values())}")
            for op in sorted(set(a) | set(b), key=lambda o: -max(a[o], b[o])):
                print(f"    {op:<34} {a[op]:6d} {b[op]:6d}")
        return
    if len(args.graphs) != 2:
        raise SystemExit("ab needs two graphs: A.onnx B.onnx")
    make = (lambda p: talker_runner(p, args.threads, args.hidden, args.layers)) if args.talker else (
        lambda p: frame_runner(p, args.threads, args.hidden))  # fmt: skip
    variants = {f"{tag} {os.path.basename(p)}": make(p) for tag, p in zip("AB", args.graphs)}
    res = interleaved(variants, args.rounds, inner=1, warmup=3)
    print(f"{'talker step' if args.talker else 'predictor frame'}, {args.threads} threads, loadavg {loadavg()} (ms per call)")
    print(report(res))
    a, b = (np.asarray(r["cpu"]) for r in res.values())
    ratio = b / a
    print(f"  pairwise CPU B/A: median {np.median(ratio):.3f} [p25 {np.percentile(ratio, 25):.3f} p75 {np.percentile(ratio, 75):.3f}]")


if __name__ == "__main__":
    main()
