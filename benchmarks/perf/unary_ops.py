#!/usr/bin/env python3
"""Cost of single onnxruntime element-wise ops on the vocoder's largest activation ([1, 96, 15360]).

    PYTHONPATH=src .venv/bin/python benchmarks/perf/unary_ops.py [--threads 2] [--rounds 15]

Answers: is ORT's Sin/Cos vectorised and threaded? What do Mul/Add/Tanh/Sigmoid/Erf/Round cost
for comparison (one memory pass each)?
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402


def session(op: str, shape, threads: int, n_inputs: int = 1, domain: str = ""):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    ins = ["x"] * n_inputs
    node = helper.make_node(op, ins, ["y"], domain=domain)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], op, io[:1], io[1:]), opset_imports=opsets)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    shape = (1, 96, 15360)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    variants = {}
    for op, n, dom in (("Mul", 2, ""), ("Sin", 1, ""), ("Cos", 1, ""), ("Tanh", 1, ""), ("Sigmoid", 1, ""),
                       ("Erf", 1, ""), ("Round", 1, ""), ("Exp", 1, ""), ("Gelu", 1, "com.microsoft")):
        for t in sorted({1, args.threads}):
            s = session(op, shape, t, n, dom)
            variants[f"{op} {t}T"] = (lambda s=s: s.run(None, {"x": x}))
    res = interleaved(variants, args.rounds, inner=5)
    print(f"single ops on {shape} ({x.size / 1e6:.2f} M elements), loadavg {loadavg()}")
    print(report(res))


if __name__ == "__main__":
    main()
