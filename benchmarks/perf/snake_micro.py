#!/usr/bin/env python3
"""SnakeBeta on one [1, C, T] activation: the exported op chain vs the cos identity vs the custom op.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/snake_micro.py [--lib LIB] [--shape 96x15360]

Chain (as exported): Mul(x, a) -> Sin -> Mul(s, s) -> Mul(inv_b) -> Add(x); cos identity:
(x + c) - c * cos(2a x); custom: qtts.kernels::SnakeBeta (src/qtts/kernels, built by
``qtts kernels build``; ``--lib`` another build of it). 1 and 2 threads.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def chain_model(kind: str, c: int, t: int, a, ib):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, t])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, t])
    inits = [numpy_helper.from_array(a, "a"), numpy_helper.from_array(ib, "b"),
             numpy_helper.from_array(2 * a, "a2"), numpy_helper.from_array(ib / 2, "c")]
    mk = helper.make_node
    if kind == "chain":
        nodes = [mk("Mul", ["x", "a"], ["t0"]), mk("Sin", ["t0"], ["t1"]), mk("Mul", ["t1", "t1"], ["t2"]),
                 mk("Mul", ["t2", "b"], ["t3"]), mk("Add", ["x", "t3"], ["y"])]
    elif kind == "cos":
        nodes = [mk("Mul", ["x", "a2"], ["t0"]), mk("Cos", ["t0"], ["t1"]), mk("Mul", ["t1", "c"], ["t2"]),
                 mk("Add", ["x", "c"], ["t3"]), mk("Sub", ["t3", "t2"], ["y"])]
    else:
        nodes = [mk("SnakeBeta", ["x", "a", "b"], ["y"], domain="qtts.kernels")]
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("qtts.kernels", 1)]
    return helper.make_model(helper.make_graph(nodes, kind, [x], [y], inits), opset_imports=ops)


def main() -> None:
    import onnxruntime as ort

    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=None, help="the kernel library (default: qtts.kernels.library())")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--shape", default="96x15360")
    args = ap.parse_args()
    if args.lib is None:
        from qtts import kernels

        args.lib = kernels.library() or sys.exit("the kernel library did not build (see above)")
    c, t = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, c, t)) * 2).astype(np.float32)
    a = np.exp(rng.standard_normal((1, c, 1)) * 0.3).astype(np.float32)
    ib = (1 / (np.exp(rng.standard_normal((1, c, 1)) * 0.3) + 1e-9)).astype(np.float32)
    variants, outs = {}, {}
    for kind in ("chain", "cos", "custom"):
        for threads in (1, 2):
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if kind == "custom":
                so.register_custom_ops_library(args.lib)
            s = ort.InferenceSession(chain_model(kind, c, t, a, ib).SerializeToString(), so,
                                     providers=["CPUExecutionProvider"])
            variants[f"{kind} {threads}T"] = lambda s=s: s.run(None, {"x": x})
            outs[kind] = s.run(None, {"x": x})[0]
    ref = x.astype(np.float64) + ib * np.sin(x * a).astype(np.float64) ** 2
    for kind, y in outs.items():
        err = ((y - ref) ** 2).sum()
        print(f"{kind}: SNR vs float64 reference {10 * np.log10((ref ** 2).sum() / max(err, 1e-30)):.1f} dB")
    res = interleaved(variants, args.rounds, inner=5)
    print(f"SnakeBeta on [1, {c}, {t}], loadavg {loadavg()}")
    print(report(res))


if __name__ == "__main__":
    main()
