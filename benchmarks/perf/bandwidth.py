#!/usr/bin/env python3
"""Memory-bandwidth floor of this machine: streaming reads of a large buffer (GB/s).

    PYTHONPATH=src .venv/bin/python benchmarks/perf/bandwidth.py [--mb 512] [--rounds 15]

Variants (interleaved): numpy sum (1 thread), torch sum at 1 and 2 threads, onnxruntime
ReduceSum over a constant initializer (the way MatMulNBits reads its weights) at 1 and 2
threads, and the same for an int8 buffer (torch sum of uint8 viewed as int32 words).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402


def ort_reduce(arr: np.ndarray, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(arr, "w")
    node = helper.make_node("ReduceSum", ["w"], ["y"], keepdims=0)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    dummy = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    g = helper.make_graph([node, helper.make_node("Identity", ["x"], ["x2"])], "bw", [dummy],
                          [out, helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    import tempfile

    tmp = tempfile.mkdtemp()
    import onnx

    path = os.path.join(tmp, "bw.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location="bw.data")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.zeros(1, np.float32)
    return lambda: sess.run(["y"], {"x": x})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    n = args.mb * (1 << 20) // 4
    a = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    t = torch.from_numpy(a)
    gb = a.nbytes / 1e9

    def torch_sum(threads):
        def f():
            torch.set_num_threads(threads)
            t.sum()
        return f

    small = a[: 4 << 20]  # 16 MB: beyond L3 (8 MB) but small
    variants = {
        "numpy sum 1T": lambda: a.sum(),
        "torch sum 1T": torch_sum(1),
        "torch sum 2T": torch_sum(2),
        "ort ReduceSum initializer 1T": ort_reduce(a, 1),
        "ort ReduceSum initializer 2T": ort_reduce(a, 2),
    }
    res = interleaved(variants, args.rounds)
    print(f"streaming read of {args.mb} MB fp32, loadavg {loadavg()}; GB/s = {gb:.3f} GB / time")
    for name, r in res.items():
        ms = np.asarray(r["ms"])
        print(f"  {name:<32} median {gb / np.median(ms) * 1000:6.1f} GB/s  best {gb / ms.min() * 1000:6.1f} GB/s"
              f"  foreign {np.median(r['foreign']):.2f}")
    print(report(res))
    del small


if __name__ == "__main__":
    main()
