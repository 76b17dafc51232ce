"""Cost of the full-size forced aligner: torch fp32, ONNX fp32 and ONNX int8 on the same prompts.

Random weights (timing only), built in memory with every published dimension, exported to a
temporary folder (or --out), then each runtime times the same prompts in one process: best of 3,
wall seconds and the CPU seconds the process used (steadier on a shared machine).

    .venv/bin/python benchmarks/aligner_cost.py [--clips 5:14,10:28] [--threads 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time


def _best(fn, repeats: int = 3) -> tuple[float, float]:
    fn()
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", default="5:14,10:28", help="seconds:words pairs (default 5:14,10:28)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="keep the exported graphs here (default: a temporary folder)")
    args = ap.parse_args()

    import onnxruntime as ort
    import torch

    from qtts.export.aligner import export_aligner, graph_inputs, quantize_aligner
    from qtts.model.aligner import ForcedAlignerModel
    from qtts.model.aligner_audio import audio_tokens
    from qtts.model.aligner_config import AlignerConfig
    from qtts.tools.random_aligner import aligner_config_dict
    from qtts.weights import empty_init

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    cfg = AlignerConfig.from_dict(aligner_config_dict("full"))
    with empty_init():
        model = ForcedAlignerModel(cfg)
    model = model.to_empty(device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    out = args.out or tempfile.mkdtemp(prefix="aligner-cost-")
    os.makedirs(out, exist_ok=True)
    fp32, int8 = os.path.join(out, "aligner.onnx"), os.path.join(out, "aligner_int8.onnx")
    t = time.perf_counter()
    export_aligner(model, fp32)
    print(f"export fp32: {time.perf_counter() - t:.0f} s, weights {os.path.getsize(fp32 + '.data') / 1e9:.2f} GB")
    shutil.copy(fp32, int8)  # reads aligner.onnx.data beside it; quantize_aligner writes aligner_int8.onnx.data
    t = time.perf_counter()
    info = quantize_aligner(int8, bits=8)
    print(f"int8: {time.perf_counter() - t:.0f} s, {info['quantized_matmuls']} MatMulNBits, "
          f"weights {os.path.getsize(int8 + '.data') / 1e9:.2f} GB")  # fmt: skip
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sessions = {"onnx fp32": ort.InferenceSession(fp32, so), "onnx int8": ort.InferenceSession(int8, so)}
    for clip in args.clips.split(","):
        seconds, words = float(clip.split(":")[0]), int(clip.split(":")[1])
        frames = int(seconds * 100)
        mel = torch.randn(cfg.audio.num_mel_bins, frames)
        ids = [cfg.audio_start_token_id] + [cfg.audio_token_id] * audio_tokens(frames, cfg.audio)
        ids = torch.tensor([ids + [cfg.audio_end_token_id] + [1000, cfg.timestamp_token_id, cfg.timestamp_token_id] * words])
        feeds = graph_inputs(ids, mel, cfg)
        with torch.inference_mode():
            rows = {"torch fp32": _best(lambda ids=ids, mel=mel: model(ids, mel))}
        rows.update({name: _best(lambda s=s, f=feeds: s.run(None, f)) for name, s in sessions.items()})
        cells = ", ".join(f"{k} {w:.2f} s wall / {c:.2f} CPU s ({c / seconds:.2f} CPU s per s)" for k, (w, c) in rows.items())
        print(f"{seconds:g} s clip, {ids.shape[1]} tokens: {cells}")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
