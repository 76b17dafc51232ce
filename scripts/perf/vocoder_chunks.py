#!/usr/bin/env python3
"""Vocoder cost per frame against the step size B (frames per call), interleaved in one process.

    PYTHONPATH=src .venv/bin/python scripts/perf/vocoder_chunks.py [--bs 1,2,4,8,16] [--threads 1] \
        [--variant base] [--frames 16] [--rounds 3]

Each sample decodes the same ``--frames`` frames (a multiple of every B) with steps of one size.
Reports wall and CPU ms per frame (CPU = work; wall/CPU > 1 at 2 threads = parallel speed-up).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from common import interleaved, loadavg, report  # noqa: E402
from vocoder_variants import make_factory, variant_path  # noqa: E402

from qtts.decoders import OnnxStepDecoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/ckpt/full06")
    ap.add_argument("--bs", default="1,2,4,8,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variant", default="base")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames, 16))
    runs, outs = {}, {}
    for b in (int(x) for x in args.bs.split(",")):
        dec = OnnxStepDecoder(variant_path(args.model, b, args.variant),
                              session_factory=make_factory(args.threads, "custom" in args.variant))

        def run(dec=dec, b=b):
            dec.reset()
            return np.concatenate([dec.decode(codes[i : i + b]) for i in range(0, args.frames, b)])

        outs[b] = run()
        runs[f"B={b}"] = run
    first = next(iter(outs.values()))
    for b, o in outs.items():
        print(f"  B={b}: max abs diff vs B={next(iter(outs))}: {np.abs(o - first).max():.2e}")
    res = interleaved(runs, args.rounds)
    print(f"vocoder {args.variant}, {args.threads} threads, {args.frames} frames/sample, loadavg {loadavg()}")
    print(report(res, unit="ms/frame", scale=1.0 / args.frames))


if __name__ == "__main__":
    main()
