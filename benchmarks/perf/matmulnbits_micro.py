#!/usr/bin/env python3
"""MatMulNBits GEMV throughput on the predictor's real shapes (batch 1), variants side by side.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/matmulnbits_micro.py [--layers 5] [--threads 1]

One graph = ``--layers`` x (qkv 1024x4096, o 2048x1024, gate_up 1024x6144, down 3072x1024) + a
1024x2048 head, chained x -> y through Add-free independent GEMVs (every GEMV reads the same x
slice, so the graph is pure weight streaming). Variants: bits 4/8, block 32/128, accuracy_level
0/4, fp32 MatMul, and onnxruntime's u8s8 integer path: ``dyn8`` / ``dyn8pc`` are
``quantize_dynamic`` (int8 weights per tensor / per output channel, uint8 activations quantized at
run time: DynamicQuantizeLinear + MatMulInteger, which onnxruntime fuses into
DynamicQuantizeMatMul). Reports ms per run (wall and CPU), weight GB/s (compare with
benchmarks/perf/bandwidth.py), and the SNR of every output against fp32 (random weights: the SNR
tests the arithmetic, not a real model).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SHAPES = [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]


def fp32_model(layers: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3072])
    for li in range(layers):
        for j, (k, n) in enumerate(SHAPES + ([(1024, 2048)] if li == layers - 1 else [])):
            w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
            name = f"w{li}_{j}"
            inits.append(numpy_helper.from_array(w, name))
            xs = f"xs{k}"
            if li == 0 and j == SHAPES.index((k, n)) if (k, n) in SHAPES else False:
                pass
            nodes.append(helper.make_node("MatMul", [xs, name], [f"y{li}_{j}"]))
            outs.append(helper.make_tensor_value_info(f"y{li}_{j}", TensorProto.FLOAT, [1, n]))
    for k in (1024, 2048, 3072):
        inits.append(numpy_helper.from_array(np.array([0], np.int64), f"s0_{k}"))
        inits.append(numpy_helper.from_array(np.array([k], np.int64), f"s1_{k}"))
        inits.append(numpy_helper.from_array(np.array([1], np.int64), f"ax_{k}"))
        nodes.insert(0, helper.make_node("Slice", ["x", f"s0_{k}", f"s1_{k}", f"ax_{k}"], [f"xs{k}"]))
    g = helper.make_graph(nodes, "gemv", [inp], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def quantized(model, bits: int, block: int, level: int):
    import copy

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(copy.deepcopy(model), bits=bits, block_size=block, is_symmetric=True,
                             accuracy_level=level, op_types_to_quantize=("MatMul",))
    q.process()
    return q.model.model


def dynamic(model, per_channel: bool):
    """onnxruntime.quantization.quantize_dynamic: int8 weights, uint8 dynamic activations."""
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.onnx"), os.path.join(d, "out.onnx")
        onnx.save(model, src)
        quantize_dynamic(src, dst, op_types_to_quantize=["MatMul"], per_channel=per_channel,
                         weight_type=QuantType.QInt8)
        return onnx.load(dst)


def snr(ref: list, got: list) -> float:
    r = np.concatenate([np.asarray(a, np.float64).ravel() for a in ref])
    g = np.concatenate([np.asarray(a, np.float64).ravel() for a in got])
    err = float(((r - g) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(float((r**2).sum()) / err)


def ov_callable(model, variant: str, threads: int, x):
    """OpenVINO CPU: ``ov_fp32``, ``ov_i4g128`` / ``ov_i8`` (NNCF weight compression, symmetric),
    suffix ``_dqN`` sets DYNAMIC_QUANTIZATION_GROUP_SIZE=N (int8 activations), ``_dq0`` disables it."""
    import logging

    import nncf
    import openvino as ov

    logging.getLogger("nncf").setLevel(logging.ERROR)
    core = ov.Core()
    m = core.read_model(model.SerializeToString(), b"") if False else ov.convert_model(_tmp_onnx(model))
    base, _, dq = variant.partition("_dq")
    if base == "ov_i4g128":
        m = nncf.compress_weights(m, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=128, ratio=1.0, all_layers=True)
    elif base == "ov_i8":
        m = nncf.compress_weights(m, mode=nncf.CompressWeightsMode.INT8_SYM)
    cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
           "INFERENCE_PRECISION_HINT": "f32"}
    if dq:
        cfg["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = int(dq)
    compiled = core.compile_model(m, "CPU", cfg)
    req = compiled.create_infer_request()
    return lambda: req.infer({0: x})


def _tmp_onnx(model) -> str:
    import tempfile

    import onnx

    d = tempfile.mkdtemp()
    path = os.path.join(d, "m.onnx")
    onnx.save(model, path)
    return path


def session(model, threads: int):
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    return ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--variants", default="fp32,q4b128l4,q4b32l4,q8b128l4,q8b32l4,q4b128l0,q4b128l1")
    args = ap.parse_args()
    base = fp32_model(args.layers)
    n_params = sum(int(np.prod(i.dims)) for i in base.graph.initializer if len(i.dims) == 2)
    x = np.random.default_rng(1).standard_normal((1, 3072)).astype(np.float32)
    variants, sizes = {}, {}
    import logging

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    for v in args.variants.split(","):
        if v.startswith("ov_"):
            variants[v] = ov_callable(base, v, args.threads, x)
            sizes[v] = {"ov_fp32": 4, "ov_i8": 1}.get(v.partition("_dq")[0], 0.53) * n_params
            continue
        if v == "fp32":
            m = base
        elif v.startswith("dyn8"):
            m = dynamic(base, per_channel=v == "dyn8pc")
        else:
            bits, rest = int(v[1]), v[3:]
            block, level = (int(s) for s in rest.split("l"))
            m = quantized(base, bits, block, level)
        sizes[v] = sum(len(i.raw_data) or 4 * int(np.prod(i.dims)) for i in m.graph.initializer if len(i.dims) >= 2)
        s = session(m, args.threads)
        variants[v] = lambda s=s: s.run(None, {"x": x})
    ref = session(base, args.threads).run(None, {"x": x})
    snrs = {v: snr(ref, fn()) for v, fn in variants.items() if not v.startswith("ov_")}
    res = interleaved(variants, args.rounds, inner=5)
    print(f"{args.layers} predictor layers + head = {n_params / 1e6:.1f} M params, {args.threads} threads, loadavg {loadavg()}")
    print(report(res))
    for v, r in res.items():
        print(f"  {v:<10} weight bytes {sizes[v] / 1e6:6.1f} MB -> {sizes[v] / 1e6 / np.median(r['ms']):5.1f} GB/s wall, "
              f"{sizes[v] / 1e6 / np.median(r['cpu']):5.1f} GB/s per CPU-s; {n_params / 1e6 / np.median(r['cpu']):.1f} "
              f"Gparam/CPU-s; output SNR vs fp32 {snrs.get(v, float('nan')):.1f} dB")


if __name__ == "__main__":
    main()
