#!/usr/bin/env python3
"""Decode speed of the speech decoder, side by side in one run (ms per 80 ms frame).

    .venv/bin/python scripts/bench_vocoder.py --model DIR [--frames 96] [--b 16] [--threads 2]

Rows: torch offline decode, torch stateful step (B frames per call), onnxruntime step (B).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from qtts.audio import snr_db
from qtts.decoders import OnnxStepDecoder, TorchStepDecoder
from qtts.export.vocoder import export_vocoder_onnx, load_decoder


def timed(fn, reps: int = 3):
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--frames", type=int, default=96)
    ap.add_argument("--b", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    decoder = load_decoder(args.model)
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames, 16))
    tcodes = torch.from_numpy(codes.T[None].copy())

    def full():
        with torch.inference_mode():
            return decoder(tcodes).reshape(-1).numpy()

    def stream(dec):
        dec.reset()
        return np.concatenate([dec.decode(codes[i : i + args.b]) for i in range(0, args.frames, args.b)])

    t_full, ref = timed(full)
    rows = [("torch offline decode", t_full, float("inf"))]
    t, out = timed(lambda: stream(TorchStepDecoder(decoder, main=args.b)))
    rows.append((f"torch step B={args.b}", t, snr_db(ref, out)))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"voc{args.b}.onnx")
        export_vocoder_onnx(decoder, args.b, path)
        ort_dec = OnnxStepDecoder(path, threads=args.threads)
        t, out = timed(lambda: stream(ort_dec))
        rows.append((f"onnxruntime step B={args.b}", t, snr_db(ref, out)))
    audio_s = args.frames * 0.08
    print(f"{args.frames} frames ({audio_s:.2f} s audio), {args.threads} threads")
    for name, t, snr in rows:
        print(
            f"  {name:<26} {1000 * t / args.frames:7.1f} ms/frame  RTF {t / audio_s:5.2f}  SNR vs offline {snr:6.1f} dB"
        )


if __name__ == "__main__":
    main()
