#!/usr/bin/env python3
"""Several streams' vocoder steps in one call: one by one vs stacked (torch vmap, or ONNX stacked graphs).

For each step size B of ``--sizes`` and stream count S of ``--streams`` it times the torch
vocoder's ``run_batch`` both ways on the decoder of ``--model`` and prints ms per call, ms per
frame and the largest difference from the one-by-one result (stacked steps are equal to fp32
rounding, not bitwise: oneDNN picks other convolution kernels for a batch of streams). Name the
CPU and the load next to any figure (printed).

    PYTHONPATH=src python benchmarks/perf/vocoder_stack.py --model SNAPSHOT --sizes 1,8 --streams 1,2,4
    qtts export onnx -m SNAPSHOT -o BUNDLE --components vocoder --vocoder-streams 2,4
    PYTHONPATH=src python benchmarks/perf/vocoder_stack.py --model SNAPSHOT --bundle BUNDLE --sizes 8 --streams 2,4
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def _time(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _vocoders(args):
    """(the one-by-one vocoder, the stacked one): torch on --model, or onnxruntime on --bundle."""
    if args.bundle:
        from qtts.backends import open as open_parts

        onnx = open_parts(args.model, plan=os.path.join(args.bundle, "plan.json"), threads=args.threads,
                          parts=("vocoder",)).vocoder  # fmt: skip
        return onnx, onnx
    import torch

    from qtts.backends.torch import TorchVocoder
    from qtts.weights import load_checkpoint

    torch.set_num_threads(args.threads)
    decoder = load_checkpoint(args.model, components=("decoder",)).speech_tokenizer.decoder.eval()
    return TorchVocoder(decoder, 8, threads=args.threads), TorchVocoder(decoder, 8, threads=args.threads,
                                                                          stack_streams=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="snapshot dir (its speech_tokenizer/)")
    p.add_argument("--sizes", default="1,8", help="step sizes B (default 1,8)")
    p.add_argument("--streams", default="1,2,4", help="streams S per call (default 1,2,4)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bundle", help="time the ONNX steps of this bundle instead (exported with --vocoder-streams; "
                   "sizes: its main step)")
    args = p.parse_args(argv)
    loop, stacked = _vocoders(args)
    one_by_one = super(type(stacked), stacked).run_batch  # StepVocoder.run_batch: the steps one by one
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {args.threads} threads")
    print("| B | S | one by one ms/call | ms/frame | stacked ms/call | ms/frame | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for b in (int(x) for x in args.sizes.split(",")):
        for s in (int(x) for x in args.streams.split(",")):
            codes = rng.integers(0, 2048, (s, 1, 16, b)).astype(np.int64)
            freqs = np.zeros((s, b, loop.contract.head_dim // 2), np.float32)
            valid = np.zeros((s, 1), np.float32)
            cache = np.zeros((s, loop.contract.cache_size), np.float32)
            feeds = (b, codes, freqs, valid, cache)
            t_loop = _time(lambda f=feeds: one_by_one(*f), args.repeats)
            t_stack = _time(lambda f=feeds: stacked.run_batch(*f), args.repeats)
            diff = float(np.abs(one_by_one(*feeds)[0] - stacked.run_batch(*feeds)[0]).max())
            print(f"| {b} | {s} | {1e3 * t_loop:.0f} | {1e3 * t_loop / (b * s):.1f} | {1e3 * t_stack:.0f} | "
                  f"{1e3 * t_stack / (b * s):.1f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
