"""QNN HTP fp16 (x86 emulation) fidelity of the code-predictor step and the vocoder step.

    .venv/bin/qtts export qnn --model SNAPSHOT -o BUNDLE
    .venv/bin/python benchmarks/qnn_row.py --model SNAPSHOT --bundle BUNDLE [--frames 8] [--vocoder-frames 8]

Code predictor: for ``--frames`` random talker hidden states and code-0 values (fixed seed),
greedy codebooks 1-15 vs the torch fp32 backend, and every step's logit SNR vs the same plain
step in onnxruntime CPU fp32 (teacher-forced on the torch codes). Vocoder: the plan's QNN step,
streamed in chunks of 2 then 8 frames, vs the torch offline decode. Times are emulation times on
x86 (nothing about real HTP speed). ``qtts verify plan --plan BUNDLE/plan.json`` gives the
in-loop row (real talker hidden states).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import onnxruntime as ort

from qtts.audio.chunk import snr_db
from qtts.backends.qnn import (
    PlainPredictor,
    QnnOptions,
    QnnVocoder,
    qnn_session,
    session_runner,
    torch_tables,
)
from qtts.backends.torch import TorchBackend
from qtts.engine.generate import PredictorSampler
from qtts.options import SamplingParams
from qtts.plans.plan import load_plan
from qtts.weights import load_checkpoint

GREEDY = PredictorSampler(SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0))


def predictor_row(talker, path: str, opts: QnnOptions, frames: int) -> dict:
    codec, tables = torch_tables(talker)
    t0 = time.perf_counter()
    run, kv = session_runner(qnn_session(path, opts))
    session_s = time.perf_counter() - t0
    qnn = PlainPredictor(run, codec, tables, kv)
    cpu_run, _ = session_runner(ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    cpu = PlainPredictor(cpu_run, codec, tables, kv)
    ref = TorchBackend(talker, threads=1)
    rng = np.random.default_rng(0)
    hiddens = rng.standard_normal((frames, int(talker.cfg.hidden_size))).astype(np.float32)
    code0s = rng.integers(0, talker.code_predictor.cfg.vocab_size, frames)
    u = np.zeros(15)
    ref_codes, qnn_codes, snrs, t_frame = [], [], [], []
    for h, c0 in zip(hiddens, code0s):
        ref_codes.append(ref.predict_frame(h, int(c0), GREEDY, u))
        t0 = time.perf_counter()
        qnn_codes.append(qnn.predict_frame(h, int(c0), GREEDY, u))
        t_frame.append(time.perf_counter() - t0)
        a, b = cpu.frame_logits(h), qnn.frame_logits(h)
        for j, code in enumerate([int(c0)] + list(ref_codes[-1][:-1])):
            snrs.append(snr_db(a(j, code), b(j, code)))
    return {
        "codebooks_1_15_agreement": float(np.mean(np.concatenate(ref_codes) == np.concatenate(qnn_codes))),
        "logit_snr_db_min": float(min(snrs)),
        "logit_snr_db_median": float(np.median(snrs)),
        "predictor_session_s": round(session_s, 2),
        "emulated_ms_per_frame": round(1e3 * float(np.median(t_frame)), 1),
    }


def vocoder_row(decoder, spec, frames: int) -> dict:
    import torch

    codes = np.random.default_rng(1).integers(0, 2048, (frames, 16)).astype(np.int64)
    with torch.inference_mode():
        ref = decoder(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()
    dec = QnnVocoder(spec.artifacts["main"], spec.artifacts.get("first"), spec.options).stream()
    pieces, i, t0 = [], 0, time.perf_counter()
    while i < len(codes):
        n = 2 if i == 0 else 8
        pieces.append(dec.decode(codes[i : i + n]))
        i += n
    return {"vocoder_snr_db": float(snr_db(ref, np.concatenate(pieces))),
            "vocoder_emulated_s": round(time.perf_counter() - t0, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bundle", required=True, help="directory written by `qtts export qnn`")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--vocoder-frames", type=int, default=8, help="0 skips the vocoder")
    args = ap.parse_args()
    plan = load_plan(os.path.join(args.bundle, "plan.json"))
    ckpt = load_checkpoint(args.model, components=("talker", "decoder"))
    pred = plan.get("predictor")
    row = predictor_row(ckpt.model.talker.float().eval(), pred.artifacts["main"],
                        QnnOptions.from_plan(pred.options), args.frames)  # fmt: skip
    if args.vocoder_frames:
        row.update(vocoder_row(ckpt.speech_tokenizer.decoder.float().eval(), plan.get("vocoder"),
                               args.vocoder_frames))  # fmt: skip
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
