#!/usr/bin/env python3
"""The vocoder step in OpenVINO vs onnxruntime (same exported ONNX step, same codes), interleaved.

    PYTHONPATH=src .venv/bin/python scripts/perf/vocoder_openvino.py [--b 8] [--threads 1] [--frames 16]

OpenVINO CPU plugin, f32 inference precision (and ``--bf16`` to add a bf16 row where the CPU has
it). Reports wall and CPU ms per frame and the SNR of each against the torch fp32 offline decode.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from common import interleaved, loadavg, report  # noqa: E402
from vocoder_variants import make_factory, reference, variant_path  # noqa: E402

from qtts.audio import snr_db  # noqa: E402
from qtts.decoders import FixedStepDecoder, OnnxStepDecoder, read_onnx_contract  # noqa: E402


class OvStepDecoder(FixedStepDecoder):
    def __init__(self, path: str, threads: int, precision: str = "f32"):
        import openvino as ov

        contract = read_onnx_contract(path)
        core = ov.Core()
        cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
               "INFERENCE_PRECISION_HINT": precision}
        self._req = core.compile_model(core.read_model(path), "CPU", cfg).create_infer_request()
        super().__init__(contract, [contract.codes_length])

    def _run(self, size, codes, freqs, valid, cache):
        out = self._req.infer([codes, freqs, valid, cache])
        return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/ckpt/full06")
    ap.add_argument("--b", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", default="base")
    args = ap.parse_args()
    codes = np.random.default_rng(0).integers(0, 2048, (64, 16))
    ref = reference(args.model, codes)
    path = variant_path(args.model, args.b, args.variant)
    decs = {"onnxruntime": OnnxStepDecoder(path, session_factory=make_factory(args.threads, False)),
            "openvino f32": OvStepDecoder(path, args.threads)}
    runs = {}
    for name, dec in decs.items():
        dec.reset()
        full = np.concatenate([dec.decode(codes[i : i + args.b]) for i in range(0, 64, args.b)])
        print(f"  {name}: SNR vs torch fp32 offline decode {snr_db(ref, full):.1f} dB", flush=True)

        def run(dec=dec):
            dec.reset()
            for i in range(0, args.frames, args.b):
                dec.decode(codes[i : i + args.b])

        runs[name] = run
    res = interleaved(runs, args.rounds)
    print(f"vocoder step B={args.b}, {args.threads} threads, {args.frames} frames/sample, loadavg {loadavg()}")
    print(report(res, unit="ms/frame", scale=1.0 / args.frames))


if __name__ == "__main__":
    main()
