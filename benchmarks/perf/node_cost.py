#!/usr/bin/env python3
"""What one small onnxruntime node costs: a chain of 100 (Add + SimplifiedLayerNormalization) on
``[1, 1, 1024]`` against 100 fused SkipSimplifiedLayerNormalization nodes, and 15 chained
GroupQueryAttention calls (t = 1 each, the predictor frame's way: caches growing from empty, or 17
fixed slots). CPU microseconds per pair / per GQA call, interleaved.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/node_cost.py [--threads 1] [--rounds 300]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

F, N, H = TensorProto.FLOAT, 100, 1024
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def session(nodes, inputs, output: str, inits, threads: int):
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "m", [vi(n, F, s) for n, s in inputs], [vi(output, F, None)], inits)
    model = helper.make_model(graph, opset_imports=OPSETS)
    return ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])


def norm_chain(fused: bool, threads: int):
    nodes, x, r = [], "x", "r"
    for i in range(N):
        if fused:
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [x, r, "w"], [f"y{i}", "", "", f"s{i}"],
                                          domain="com.microsoft", epsilon=1e-6))  # fmt: skip
        else:
            nodes += [helper.make_node("Add", [x, r], [f"s{i}"]),
                      helper.make_node("SimplifiedLayerNormalization", [f"s{i}", "w"], [f"y{i}"], axis=-1, epsilon=1e-6,
                                       stash_type=1)]  # fmt: skip
        x, r = f"s{i}", f"y{i}"
    w = numpy_helper.from_array(np.ones(H, np.float32), "w")
    return session(nodes, [("x", [1, 1, H]), ("r", [1, 1, H])], x, [w], threads)


def gqa_chain(slots: int, threads: int):
    from qtts.export.contrib import rope_tables

    cos, sin = (t.numpy() for t in rope_tables(17, 128, 1e6))
    arr = numpy_helper.from_array
    inits = [arr(cos, "cos"), arr(sin, "sin"), arr(np.zeros((1, 8, slots, 128), np.float32), "k"),
             arr(np.zeros((1, 8, slots, 128), np.float32), "v")]  # fmt: skip
    nodes, pk, pv = [], "k", "v"
    for j in range(15):
        inits += [arr(np.array([j], np.int32), f"sl{j}"), arr(np.array(j + 1, np.int32), f"tl{j}")]
        nodes.append(helper.make_node("GroupQueryAttention", ["q", "kn", "vn", pk, pv, f"sl{j}", f"tl{j}", "cos", "sin"],
                                      [f"o{j}", f"k{j}", f"v{j}"], domain="com.microsoft", num_heads=16, kv_num_heads=8,
                                      do_rotary=1, rotary_interleaved=0))  # fmt: skip
        pk, pv = f"k{j}", f"v{j}"
    nodes.append(helper.make_node("Sum", [f"o{j}" for j in range(15)], ["out"]))
    return session(nodes, [("q", [1, 1, 2048]), ("kn", [1, 1, 1024]), ("vn", [1, 1, 1024])], "out", inits, threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    norm_feeds = {k: rng.standard_normal((1, 1, H)).astype(np.float32) for k in ("x", "r")}
    gqa_feeds = {"q": rng.standard_normal((1, 1, 2048)).astype(np.float32),
                 "kn": rng.standard_normal((1, 1, 1024)).astype(np.float32),
                 "vn": rng.standard_normal((1, 1, 1024)).astype(np.float32)}  # fmt: skip
    norms = {"Add + SimplifiedLayerNormalization x100": norm_chain(False, args.threads),
             "SkipSimplifiedLayerNormalization x100": norm_chain(True, args.threads)}  # fmt: skip
    a, b = (s.run(None, norm_feeds)[0] for s in norms.values())
    print(f"{args.threads} threads, loadavg {loadavg()}; after 100 norms fused vs unfused differ by {np.abs(a - b).max():.2e}")
    res = interleaved({k: (lambda s=s: s.run(None, norm_feeds)) for k, s in norms.items()}, args.rounds)
    print("per pair / fused node (us):\n" + report(res, unit="us", scale=1000.0 / N))
    gqas = {"15 GQA, caches growing from empty": gqa_chain(0, args.threads),
            "15 GQA, 17 fixed slots": gqa_chain(17, args.threads)}  # fmt: skip
    res = interleaved({k: (lambda s=s: s.run(None, gqa_feeds)) for k, s in gqas.items()}, args.rounds)
    print("per GQA call (us):\n" + report(res, unit="us", scale=1000.0 / 15))


if __name__ == "__main__":
    main()
