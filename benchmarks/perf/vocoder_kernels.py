#!/usr/bin/env python3
"""The vocoder step with and without the compiled SnakeBeta kernel (qtts.kernels), interleaved.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/vocoder_kernels.py --model DIR [--work DIR]
        [--b 8] [--frames 64] [--threads 2] [--rounds 7]

``--model``: a snapshot (a full-size random one: ``qtts random-checkpoint DIR --size full``; only
its speech tokenizer is read). Two vocoder-only bundles are exported into ``--work`` once (reused
when present): ``plain`` (``ExportOptions(vocoder_kernels=False)``) and ``fused`` (the default).
Variants, each a fresh stream decoding ``--frames`` random frames in ``--b``-frame steps:

* plain graph                      the export as before (Mul, Sin, Mul, Mul, Add per SnakeBeta);
* fused graph, kernels off         QTTS_KERNELS=0: onnxruntime inlines the function nodes;
* fused graph + kernel             the library registered (the default where it builds).

Reports ms and CPU ms per 80 ms frame (medians, ratios to the plain graph, foreign load) and the
SNR of each against the plain graph and against the torch offline decode. Random weights: the
SNRs test the mechanism, not the real model's audio.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402

from qtts import kernels  # noqa: E402
from qtts.audio.chunk import snr_db  # noqa: E402
from qtts.backends.onnx import OnnxVocoder  # noqa: E402


def bundles(model: str, work: str) -> dict:
    from qtts.export.onnx import ExportOptions, export_bundle

    out = {}
    for name, fused in (("plain", False), ("fused", True)):
        path = os.path.join(work, name)
        if not os.path.isfile(os.path.join(path, "plan.json")):
            export_bundle(model, path, ExportOptions(components=("vocoder",), vocoder_kernels=fused))
        out[name] = path
    return out


def vocoder(bundle: str, b: int, threads: int, use_kernels: bool) -> OnnxVocoder:
    old = os.environ.get(kernels.ENV)
    os.environ[kernels.ENV] = "1" if use_kernels else "0"
    try:
        return OnnxVocoder(os.path.join(bundle, f"vocoder.b{b}.onnx"), threads=threads)
    finally:
        if old is None:
            os.environ.pop(kernels.ENV)
        else:
            os.environ[kernels.ENV] = old


def decode(voc: OnnxVocoder, codes: np.ndarray, b: int) -> np.ndarray:
    stream = voc.stream()
    return np.concatenate([stream.decode(codes[i : i + b]) for i in range(0, len(codes), b)])


def torch_reference(model: str, codes: np.ndarray) -> np.ndarray:
    import torch

    from qtts.export.vocoder import load_decoder

    with torch.inference_mode():
        return load_decoder(model)(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", default="vocoder-kernels")
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    lib = kernels.library()
    if lib is None:
        sys.exit("the kernel library did not build (see the warning above); nothing to compare")
    paths = bundles(args.model, args.work)
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames - args.frames % args.b, 16))
    vocs = {
        "plain graph": vocoder(paths["plain"], args.b, args.threads, False),
        "fused graph, kernels off (inlined)": vocoder(paths["fused"], args.b, args.threads, False),
        f"fused graph + kernel ({kernels.isa(lib)})": vocoder(paths["fused"], args.b, args.threads, True),
    }
    outs = {name: decode(v, codes, args.b) for name, v in vocs.items()}
    ref, plain = torch_reference(args.model, codes), outs["plain graph"]
    variants = {name: (lambda v=v: decode(v, codes, args.b)) for name, v in vocs.items()}
    res = interleaved(variants, args.rounds)
    frames = len(codes)
    print(f"vocoder step B={args.b}, {frames} frames, {args.threads} threads, loadavg {loadavg()}; per 80 ms frame:")
    print(report(res, unit="ms/frame", scale=1.0 / frames))
    for name, y in outs.items():
        exact = "bit-exact" if np.array_equal(y, plain) else f"{snr_db(plain, y):.1f} dB"
        print(f"  {name:<44} vs plain graph: {exact}; vs torch offline: {snr_db(ref, y):.1f} dB")


if __name__ == "__main__":
    main()
