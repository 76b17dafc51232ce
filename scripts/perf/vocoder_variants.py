#!/usr/bin/env python3
"""Vocoder step variants side by side (interleaved, one process): ms per frame and SNR vs torch fp32.

    PYTHONPATH=src .venv/bin/python scripts/perf/vocoder_variants.py --model /work/ckpt/full06 \
        [--b 8] [--threads 2] [--frames 64] [--rounds 5] [--variants base,cos,custom,conv2d,custom+conv2d]

Variants are graph rewrites of the exported step (scripts/perf/onnx_rewrite.py): ``base`` (as
exported by qtts.export.vocoder), ``cos`` (SnakeBeta via the cos identity), ``custom`` (fused
qtts.perf::SnakeBeta custom op, scripts/perf/snake_op), ``conv2d`` (1-D convs as 2-D so ORT's
NCHWc kernels apply), combinations joined by '+'. ``--profile`` prints per-op-type kernel time
of every variant. The reference is the torch offline decode of the same random codes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx_rewrite  # noqa: E402
from common import interleaved, loadavg, report  # noqa: E402

CACHE = os.environ.get("QTTS_PERF_CACHE", "/work/perf")
LIB = os.path.join(CACHE, "libqtts_snake.so")


def base_path(model: str, b: int) -> str:
    path = os.path.join(CACHE, f"voc_b{b}.onnx")
    if not os.path.exists(path):
        from qtts.export.vocoder import export_vocoder_onnx

        export_vocoder_onnx(model, b, path)
    return path


def variant_path(model: str, b: int, variant: str) -> str:
    if variant == "base":
        return base_path(model, b)
    path = os.path.join(CACHE, f"voc_b{b}.{variant}.onnx")
    if os.path.exists(path):
        return path
    parts = variant.split("+")
    src = base_path(model, b)
    dq = [p for p in parts if p.startswith("dq8")]
    if dq:  # dynamic int8 (ConvInteger) for a subset of the residual-unit convs, first
        src = dynamic_int8(src, dq[0], path + ".dq.tmp")
        parts = [p for p in parts if p not in dq]
    m = onnx.load(src)
    if dq:
        os.remove(src)
    for part in parts:
        if part == "cos":
            n = onnx_rewrite.snake_cos(m)
        elif part == "custom":
            n = onnx_rewrite.snake_to_custom(m)
        elif part == "conv2d":
            n = onnx_rewrite.conv1d_to_2d(m)
        else:
            raise SystemExit(f"unknown variant part {part!r}")
        print(f"  {variant}: {part} rewrote {n} places", flush=True)
    tmp = path + ".tmp"
    onnx.save(m, tmp)
    os.replace(tmp, path)
    return path


ORT_CONFIG: dict = {}  # extra session config entries for every vocoder session (--ort-config)


def dynamic_int8(src: str, which: str, out: str) -> str:
    """``dq8res``: every residual-unit conv (conv1 k=7 and conv2 1x1, blocks 1-4) as ConvInteger
    with int8 activations quantized per call; ``dq8c1``: only the k=7 conv1s; ``dq8mid``: the
    residual units of blocks 2 and 3 only."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    g = onnx.load(src, load_external_data=False).graph
    import re

    pat = {"dq8res": r"decoder\.decoder\.[1-4]\.block\.[2-4]\.conv[12]\.",
           "dq8c1": r"decoder\.decoder\.[1-4]\.block\.[2-4]\.conv1\.",
           "dq8mid": r"decoder\.decoder\.[23]\.block\.[2-4]\.conv[12]\."}[which]
    nodes = [n.name for n in g.node if n.op_type == "Conv" and re.search(pat, n.input[1])]
    quantize_dynamic(src, out, op_types_to_quantize=["Conv"], nodes_to_quantize=nodes,
                     weight_type=QuantType.QUInt8, per_channel=False)
    print(f"  {which}: {len(nodes)} convs -> dynamic int8", flush=True)
    return out


def make_factory(threads: int, custom: bool, profile_dir: str | None = None, opt_dump: str | None = None,
                 config: dict | None = None):
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    def factory(path):
        so = session_options(threads)
        for k, v in {**ORT_CONFIG, **(config or {})}.items():
            so.add_session_config_entry(k, v)
        if custom:
            so.register_custom_ops_library(LIB)
        if profile_dir:
            so.enable_profiling, so.profile_file_prefix = True, os.path.join(profile_dir, "prof")
        if opt_dump:
            so.optimized_model_filepath = opt_dump
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    return factory


def reference(model: str, codes: np.ndarray) -> np.ndarray:
    path = os.path.join(CACHE, f"ref_{len(codes)}.npy")
    if os.path.exists(path):
        return np.load(path)
    import torch

    from qtts.export.vocoder import load_decoder

    dec = load_decoder(model)
    with torch.inference_mode():
        ref = dec(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()
    np.save(path, ref)
    return ref


def profile(path: str, threads: int, custom: bool, codes: np.ndarray, b: int) -> dict:
    from qtts.decoders import OnnxStepDecoder

    with tempfile.TemporaryDirectory() as tmp:
        dec = OnnxStepDecoder(path, session_factory=make_factory(threads, custom, tmp))
        for i in range(0, len(codes) - len(codes) % b, b):
            dec.decode(codes[i : i + b])
        (sess,) = dec._sessions.values()
        with open(sess.end_profiling(), encoding="utf-8") as fh:
            events = json.load(fh)
    per_op, runs = collections.Counter(), sum(e.get("name") == "model_run" for e in events)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"] / 1000.0 / runs
    return dict(per_op)


def main() -> None:
    from qtts.audio import snr_db
    from qtts.decoders import OnnxStepDecoder

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/ckpt/full06")
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="base,cos,custom,conv2d,custom+conv2d")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    names = args.variants.split(",")
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames, 16))
    ref = reference(args.model, codes)
    decs, snrs = {}, {}
    for name in names:
        graph, _, flag = name.partition("@")  # "@noprepack": session.disable_prepacking=1
        cfg = {"session.disable_prepacking": "1"} if flag == "noprepack" else {}
        path = variant_path(args.model, args.b, graph)
        dec = OnnxStepDecoder(path, session_factory=make_factory(args.threads, "custom" in name, config=cfg))
        decs[name] = dec

        def run(dec=dec):
            dec.reset()
            return np.concatenate([dec.decode(codes[i : i + args.b]) for i in range(0, args.frames, args.b)])

        snrs[name] = snr_db(ref, run())
        decs[name] = run
    res = interleaved(decs, args.rounds)
    print(f"vocoder step B={args.b}, {args.threads} threads, {args.frames} frames/sample, loadavg {loadavg()}")
    print(report(res, unit="ms/frame", scale=1.0 / args.frames))
    for name in names:
        print(f"  {name:<20} SNR vs torch fp32 offline decode {snrs[name]:6.1f} dB")
    if args.profile:
        for name in names:
            per = profile(variant_path(args.model, args.b, name.partition("@")[0]), args.threads, "custom" in name, codes, args.b)
            total = sum(per.values())
            top = ", ".join(f"{k} {v / args.b:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:9])
            print(f"  profile {name}: {total / args.b:.1f} ms/frame of kernels: {top}")


if __name__ == "__main__":
    main()
