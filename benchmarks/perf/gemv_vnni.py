#!/usr/bin/env python3
"""Our AVX-512 VNNI GEMV (benchmarks/perf/gemv/q8vnni.c) against onnxruntime's MatMulNBits, same weights.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/gemv_vnni.py [--layers 5] [--threads 1] [--rounds 7]

Builds matmulnbits_micro.py's graph (``--layers`` predictor layers + head, the real shapes), quantizes
it with onnxruntime's MatMulNBitsQuantizer (bits 8 and 4, block 128, accuracy_level 4, symmetric),
and runs the very same packed B / scales through the C kernel (compiled here with the system gcc,
ctypes, OpenMP with a passive wait policy). Timing is interleaved in one process (CPU ms and wall
ms per pass of all GEMVs); outputs are checked against float64 with the fp32 weights (SNR) and
against MatMulNBits' own output. Random weights test the arithmetic, not a real model.

``--huge``: after the sessions are made, every large anonymous mapping of the process (onnxruntime's
weight buffers, our copies of B) is advised MADV_HUGEPAGE and collapsed into 2 MB pages
(MADV_COLLAPSE, Linux >= 6.1), so both kernels stream from transparent huge pages; the line
"AnonHugePages" says how much of the process it reached. Compare runs with and without it (the
hardware prefetcher stops at every 4 KB page boundary; a 2 MB page lets it run on).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import collapse_huge, interleaved, loadavg, pages, report  # noqa: E402
from matmulnbits_micro import fp32_model, quantized, session, snr  # noqa: E402
from onnx import numpy_helper  # noqa: E402

SRC = os.path.join(os.path.dirname(__file__), "gemv", "q8vnni.c")


def build(cflags: str = "") -> ctypes.CDLL:
    out = os.path.join(tempfile.mkdtemp(), "libq8vnni.so")
    subprocess.run(["gcc", "-O3", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-mfma", "-fopenmp", "-shared",
                    "-fPIC", *cflags.split(), SRC, "-o", out, "-lm"], check=True)
    lib = ctypes.CDLL(out)
    p = ctypes.c_void_p
    lib.qgemv.argtypes = [p, ctypes.c_int, ctypes.c_int, p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


def gemvs(model) -> list:
    """(input name, K, N, B uint8 contiguous, scales fp32, bits, block) per MatMulNBits node."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        att = {a.name: a.i for a in node.attribute}
        if len(node.input) > 3 and node.input[3]:
            raise SystemExit("the quantizer wrote zero points; the prototype assumes the default 2^(bits-1)")
        b = np.ascontiguousarray(inits[node.input[1]], np.uint8)
        s = np.ascontiguousarray(inits[node.input[2]], np.float32).reshape(att["N"], -1)
        out.append((node.input[0], att["K"], att["N"], b, s, att["bits"], att["block_size"], node.output[0]))
    return out


def ours(lib, nodes, x: np.ndarray, threads: int):
    xs = {k: np.ascontiguousarray(x[0, :k]) for k in (1024, 2048, 3072)}
    ys = [np.empty(n, np.float32) for _, _, n, *_ in nodes]
    calls = [(xs[k].ctypes.data, k, n, b.ctypes.data, s.ctypes.data, y.ctypes.data, bits, blk)
             for (_, k, n, b, s, bits, blk, _), y in zip(nodes, ys)]

    def run():
        for c in calls:
            if lib.qgemv(*c, threads):
                raise SystemExit("qgemv refused the shape")
        return ys

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--bits", default="8,4")
    ap.add_argument("--cflags", default="", help="extra gcc flags for q8vnni.c, e.g. -DROWS=4")
    ap.add_argument("--huge", action="store_true", help="weights on 2 MB transparent huge pages (Linux)")
    args = ap.parse_args()
    import logging

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    lib = build(args.cflags)
    base = fp32_model(args.layers)
    x = np.random.default_rng(1).standard_normal((1, 3072)).astype(np.float32)
    w64 = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in base.graph.initializer if len(i.dims) == 2}
    ref = [x[0, : w.shape[0]].astype(np.float64) @ w for w in w64.values()]
    variants, info = {}, {}
    for bits in (int(b) for b in args.bits.split(",")):
        m = quantized(base, bits, 128, 4)
        s = session(m, args.threads)
        nodes = gemvs(m)
        mine = ours(lib, nodes, x, args.threads)
        theirs = s.run([nd[-1] for nd in nodes], {"x": x})
        got = [y.copy() for y in mine()]
        nbytes = sum(b.nbytes + sc.nbytes for _, _, _, b, sc, *_ in nodes)
        info[bits] = (nbytes, snr(ref, theirs), snr(ref, got), snr(theirs, got))
        outs = [nd[-1] for nd in nodes]
        variants[f"MatMulNBits q{bits}b128l4"] = lambda s=s, outs=outs: s.run(outs, {"x": x})
        variants[f"vnni q{bits}b128"] = mine
    if args.huge:
        collapse_huge()
    res = interleaved(variants, args.rounds, inner=5)
    print(f"{args.layers} predictor layers + head, {args.threads} threads, loadavg {loadavg()}; huge {args.huge}: {pages()}")
    print(report(res))
    for name, r in res.items():
        bits = int(name.split(" q")[1][0])
        nbytes, s_ort, s_ours, s_vs = info[bits]
        print(f"  {name:<22} {nbytes / 1e6:5.1f} MB -> {nbytes / 1e6 / np.median(r['cpu']):5.1f} GB/s per CPU-s, "
              f"{nbytes / 1e6 / np.median(r['ms']):5.1f} GB/s wall")
    for bits, (_, s_ort, s_ours, s_vs) in info.items():
        print(f"  q{bits}: SNR vs float64: MatMulNBits {s_ort:.1f} dB, ours {s_ours:.1f} dB; ours vs MatMulNBits {s_vs:.1f} dB")
    for bits in info:
        a, b = f"MatMulNBits q{bits}b128l4", f"vnni q{bits}b128"
        print(f"  q{bits}: CPU ratio MatMulNBits / ours = {np.median(res[a]['cpu']) / np.median(res[b]['cpu']):.3f}, "
              f"wall {np.median(res[a]['ms']) / np.median(res[b]['ms']):.3f}")


if __name__ == "__main__":
    main()
