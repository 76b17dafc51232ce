#!/usr/bin/env python3
"""Cost of one com.microsoft::GroupQueryAttention call at the talker / predictor decode shapes.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/gqa_micro.py [--threads 1]

q [1,1,2048] (16 heads x 128), k/v [1,1,1024] (8 kv heads), in-graph RoPE, past/present buffer of
``buffer`` slots bound in place (as the backend does), ``total`` = filled slots + 1. Compared with
the same attention written as plain batched MatMul/Softmax (no RoPE, no KV write: a lower bound).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402


def gqa_session(buffer: int, threads: int):
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    ins = [vi("q", f, [1, 1, 2048]), vi("k", f, [1, 1, 1024]), vi("v", f, [1, 1, 1024]),
           vi("past_k", f, [1, 8, buffer, 128]), vi("past_v", f, [1, 8, buffer, 128]),
           vi("seqlens_k", TensorProto.INT32, [1]), vi("total_len", TensorProto.INT32, []),
           vi("cos", f, [buffer, 64]), vi("sin", f, [buffer, 64])]
    outs = [vi("out", f, [1, 1, 2048]), vi("present_k", f, [1, 8, buffer, 128]), vi("present_v", f, [1, 8, buffer, 128])]
    node = helper.make_node("GroupQueryAttention", [i.name for i in ins], [o.name for o in outs], domain="com.microsoft",
                            num_heads=16, kv_num_heads=8, do_rotary=1, rotary_interleaved=0)
    m = helper.make_model(helper.make_graph([node], "gqa", ins, outs),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(m.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])


def plain_session(total: int, threads: int):
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    ins = [vi("q", f, [8, 2, 128]), vi("kt", f, [8, 128, total]), vi("v", f, [8, total, 128])]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    m = helper.make_model(helper.make_graph(nodes, "att", ins, [vi("out", f, [8, 2, 128])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(m.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])


def main() -> None:
    import onnxruntime as ort

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    variants = {}
    for label, buffer, filled in (("talker buf 256 pos 40", 256, 40), ("talker buf 2048 pos 40", 2048, 40),
                                  ("predictor buf 17 pos 8", 17, 8)):
        s = gqa_session(buffer, args.threads)
        io = s.io_binding()
        kv = [ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 8, buffer, 128), np.float32)) for _ in range(2)]
        feeds = {"q": rng.standard_normal((1, 1, 2048)).astype(np.float32),
                 "k": rng.standard_normal((1, 1, 1024)).astype(np.float32),
                 "v": rng.standard_normal((1, 1, 1024)).astype(np.float32),
                 "seqlens_k": np.array([filled], np.int32), "total_len": np.array(filled + 1, np.int32),
                 "cos": np.ones((buffer, 64), np.float32), "sin": np.zeros((buffer, 64), np.float32)}
        for k, v in feeds.items():
            io.bind_cpu_input(k, v)
        io.bind_ortvalue_input("past_k", kv[0]), io.bind_ortvalue_output("present_k", kv[0])
        io.bind_ortvalue_input("past_v", kv[1]), io.bind_ortvalue_output("present_v", kv[1])
        io.bind_output("out")
        variants[f"GQA {label}"] = lambda s=s, io=io: s.run_with_iobinding(io)
        p = plain_session(filled + 1, args.threads)
        pf = {"q": rng.standard_normal((8, 2, 128)).astype(np.float32),
              "kt": rng.standard_normal((8, 128, filled + 1)).astype(np.float32),
              "v": rng.standard_normal((8, filled + 1, 128)).astype(np.float32)}
        variants[f"plain MatMul/Softmax {label}"] = lambda p=p, pf=pf: p.run(None, pf)
    res = interleaved(variants, args.rounds, inner=200)
    print(f"one attention call, {args.threads} threads, loadavg {loadavg()} (ms per call)")
    print(report(res))


if __name__ == "__main__":
    main()
