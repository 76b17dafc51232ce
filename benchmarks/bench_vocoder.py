#!/usr/bin/env python3
"""Decode speed of the speech decoder, side by side in one run (ms per 80 ms frame).

    .venv/bin/python benchmarks/bench_vocoder.py --model DIR [--frames 96] [--b 16] [--threads 2] [--rounds 3] [--profile]

Rows: torch offline decode, torch stateful step (B frames per call), the bf16 step (what ``fast``
runs where the CPU has bf16 instructions: ``qtts.model.vocoder_step_bf16``), onnxruntime fp32 step
(B; the ``fast`` bundle's vocoder). Wall and CPU time per frame (CPU time of this process: the
same-run ratio to the onnxruntime step holds on a noisy machine), SNR against the offline decode. ``--profile`` adds an
onnxruntime profile of the ONNX step (kernel time per op type, convolution GFLOP from the graph's
shapes) and the cost of a few unary ops on a [1, 96, 15360] tensor (the last decoder stage).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

from qtts.audio.chunk import snr_db
from qtts.backends.onnx import OnnxVocoder
from qtts.backends.torch import TorchVocoder
from qtts.errors import InputError, QttsError
from qtts.export.vocoder import export_vocoder_onnx, load_decoder


def timed(fn, reps: int = 3):
    """(best wall s, best CPU s of this process, the last output) over ``reps`` runs."""
    best, cpu, out = float("inf"), float("inf"), None
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return best, cpu, out


def interleaved(runs: list, rounds: int, ref) -> list:
    """(name, best wall s, best CPU s, SNR vs ``ref``) per run, the runs alternated ``rounds`` times
    (a machine that slows down mid-run slows every row alike)."""
    best = {name: [float("inf"), float("inf"), None] for name, _ in runs}
    for _ in range(rounds):
        for name, fn in runs:
            t, c, out = timed(fn, reps=1)
            row = best[name]
            row[0], row[1], row[2] = min(row[0], t), min(row[1], c), out
    return [(name, t, c, snr_db(ref, out)) for name, (t, c, out) in best.items()]


def profile_step(path: str, threads: int, codes: np.ndarray, b: int) -> None:
    """Kernel time per op type of the ONNX step, its convolution GFLOP, and unary-op costs."""
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    with tempfile.TemporaryDirectory() as tmp:
        def factory(p):
            so = session_options(threads)
            so.enable_profiling, so.profile_file_prefix = True, os.path.join(tmp, "prof")
            return ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])

        voc = OnnxVocoder(path, session_factory=factory)
        dec = voc.stream()
        for i in range(0, len(codes) - len(codes) % b, b):
            dec.decode(codes[i : i + b])
        (sess,) = voc.sessions.values()
        with open(sess.end_profiling(), encoding="utf-8") as fh:
            events = json.load(fh)
    per_op, runs = collections.Counter(), sum(e.get("name") == "model_run" for e in events)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"] / 1000.0 / runs
    total = sum(per_op.values())
    print(f"ONNX step B={b}: {total:.1f} ms of kernels per call ({total / b:.1f} ms per frame)")
    for op, ms in per_op.most_common(6):
        print(f"  {op:<14} {ms:7.1f} ms  {100 * ms / total:4.1f} %")
    gflop = conv_gflop(path)
    conv_ms = per_op["Conv"] + per_op["ConvTranspose"]
    print(f"  convolutions: {gflop:.1f} GFLOP per call, {gflop / conv_ms * 1000:.0f} GFLOP/s")
    unary_op_costs(threads)


def conv_gflop(path: str) -> float:
    """Multiply-add GFLOP of the Conv / ConvTranspose nodes (static shapes of the step graph)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False))
    g = model.graph
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(g.value_info) + list(g.input) + list(g.output)}  # fmt: skip
    weights = {w.name: list(w.dims) for w in g.initializer}
    flop = 0
    for n in g.node:
        if n.op_type in ("Conv", "ConvTranspose") and n.input[1] in weights:
            side = n.output[0] if n.op_type == "Conv" else n.input[0]  # output (Conv) / input (transposed)
            flop += 2 * int(np.prod(dims[side])) * int(np.prod(weights[n.input[1]][1:]))
    return flop / 1e9


def unary_op_costs(threads: int) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from qtts.backends.onnx import session_options

    x = np.random.default_rng(0).standard_normal((1, 96, 15360)).astype(np.float32)
    for op in ("Sin", "Tanh", "Mul"):
        node = helper.make_node(op, ["x", "x"] if op == "Mul" else ["x"], ["y"])
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n in ("x", "y")]
        model = helper.make_model(helper.make_graph([node], op, io[:1], io[1:]),
                                  opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
        sess = ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                    providers=["CPUExecutionProvider"])  # fmt: skip
        t, _, _ = timed(lambda sess=sess: sess.run(None, {"x": x}), reps=10)
        print(f"  onnxruntime {op} on [1, 96, 15360]: {1000 * t:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--frames", type=int, default=96)
    ap.add_argument("--b", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="each row this many times, alternated; best of")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="profile the ONNX step (op types, GFLOP)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    decoder = load_decoder(args.model)
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames, 16))
    tcodes = torch.from_numpy(codes.T[None].copy())

    def full():
        with torch.inference_mode():
            return decoder(tcodes).reshape(-1).numpy()

    def stream(voc):
        dec = voc.stream()
        return np.concatenate([dec.decode(codes[i : i + args.b]) for i in range(0, args.frames, args.b)])

    ref = full()
    runs = [("torch offline decode", full)]
    for name, voc in ((f"torch step B={args.b}", TorchVocoder(decoder, main=args.b)),
                      (f"torch bf16 step B={args.b}", TorchVocoder(decoder, main=args.b, precision="bf16"))):  # fmt: skip
        runs.append((name, lambda voc=voc: stream(voc)))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"voc{args.b}.onnx")
        export_vocoder_onnx(decoder, args.b, path)
        ort_dec = OnnxVocoder(path, threads=args.threads)
        runs.append((f"onnxruntime step B={args.b}", lambda: stream(ort_dec)))
        rows = interleaved(runs, args.rounds, ref)
        if args.profile:
            profile_step(path, args.threads, codes, args.b)
    audio_s = args.frames * 0.08
    ort_cpu = rows[-1][2]
    print(f"{args.frames} frames ({audio_s:.2f} s audio), {args.threads} threads")
    for name, t, c, snr in rows:
        print(f"  {name:<26} {1000 * t / args.frames:7.1f} ms/frame  CPU {1000 * c / args.frames:7.1f} ms/frame "
              f"({c / ort_cpu:4.2f}x onnxruntime)  RTF {t / audio_s:5.2f}  SNR vs offline {snr:6.1f} dB")


if __name__ == "__main__":
    try:
        main()
    except (InputError, QttsError) as exc:
        sys.exit(f"bench_vocoder: {exc}")
