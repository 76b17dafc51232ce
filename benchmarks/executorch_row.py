"""ExecuTorch (XNNPACK) fidelity row and 1-thread speed for the code predictor and the vocoder step.

Run in the ExecuTorch environment (not in CI; ~1-2 min on a tiny checkpoint)::

    bash scripts/setup_executorch_env.sh
    .venv-et/bin/qtts random-checkpoint --size tiny /tmp/tiny
    .venv-et/bin/python benchmarks/executorch_row.py --model /tmp/tiny [--frames 16] [--codes-length 4]
    .venv-et/bin/python benchmarks/executorch_row.py --model /tmp/tiny --bundle et-int4   # a bundle's .pte files

With ``--bundle`` (a ``qtts export executorch`` folder) nothing is exported: the bundle's predictor
and vocoder steps are measured (any ``--weights``), and its talker step's ms per position too.

Code predictor: the plain fixed-shape step (``qtts.export.qnn``) lowered to XNNPACK; for
``--frames`` random talker hidden states and code-0 values (fixed seed), greedy codebooks 1-15
vs the torch fp32 backend (``TorchBackend.predict_frame``), and the SNR of every step's logits vs
the same step in eager torch. Vocoder: the B-frame step lowered to XNNPACK, streamed (chunks of
2 then 8 frames) vs the torch offline decode. Speeds are medians at 1 thread, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from qtts.audio.chunk import snr_db
from qtts.backends.executorch import EtVocoder, load_method, method_runner, read_contract
from qtts.backends.plain import PlainPredictor
from qtts.backends.qnn import torch_tables
from qtts.backends.torch import TorchBackend, TorchVocoder
from qtts.engine.generate import PredictorSampler
from qtts.export.executorch import export_predictor_pte, export_vocoder_pte
from qtts.export.qnn import plain_step
from qtts.options import SamplingParams
from qtts.weights import load_checkpoint

GREEDY = PredictorSampler(SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0))


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def predictor_row(talker, pte: str, frames: int) -> dict:
    codec, tables = torch_tables(talker)
    eager = plain_step(talker.code_predictor.float().eval())

    def eager_run(*arrays):
        with torch.inference_mode():
            return [t.numpy() for t in eager(*(torch.from_numpy(a) for a in arrays))]

    cfg = talker.code_predictor.cfg
    kv_shape = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, 17, cfg.head_dim)
    et = PlainPredictor(method_runner(load_method(pte, 1)), codec, tables, kv_shape)
    ref_plain = PlainPredictor(eager_run, codec, tables, kv_shape)
    ref = TorchBackend(talker, threads=1)
    rng = np.random.default_rng(0)
    hiddens = rng.standard_normal((frames, int(talker.cfg.hidden_size))).astype(np.float32)
    code0s = rng.integers(0, cfg.vocab_size, frames)
    u = np.zeros(15)
    ref_codes, et_codes, snrs = [], [], []
    for h, c0 in zip(hiddens, code0s):
        ref_codes.append(ref.predict_frame(h, int(c0), GREEDY, u))
        et_codes.append(et.predict_frame(h, int(c0), GREEDY, u))
        a, b = ref_plain.frame_logits(h), et.frame_logits(h)
        for j, code in enumerate([int(c0)] + list(ref_codes[-1][:-1])):  # teacher-forced on torch codes
            snrs.append(snr_db(a(j, code), b(j, code)))
    h0, c00 = hiddens[0], int(code0s[0])
    return {
        "codebooks_1_15_agreement": float(np.mean(np.concatenate(ref_codes) == np.concatenate(et_codes))),
        "logit_snr_db_min": float(min(snrs)),
        "logit_snr_db_median": float(np.median(snrs)),
        "ms_per_frame_executorch": _median_ms(lambda: et.predict_frame(h0, c00, GREEDY, u), 20),
        "ms_per_frame_torch": _median_ms(lambda: ref.predict_frame(h0, c00, GREEDY, u), 20),
    }


def vocoder_row(decoder, pte: str, contract, frames: int) -> dict:
    codes = np.random.default_rng(1).integers(0, 2048, (frames, contract.num_quantizers)).astype(np.int64)
    with torch.inference_mode():
        ref = decoder(torch.from_numpy(codes.T[None].copy())).reshape(-1).numpy()
    et = EtVocoder(pte, contract, threads=1).stream()
    pieces, i = [], 0
    while i < len(codes):
        n = 2 if i == 0 else 8
        pieces.append(et.decode(codes[i : i + n]))
        i += n
    b = contract.codes_length
    block = codes[:b]
    tdec = TorchVocoder(decoder, main=b, threads=1).stream()

    def et_step():
        et.reset()
        et.decode(block)

    def torch_step():
        tdec.reset()
        tdec.decode(block)

    return {
        "vocoder_snr_db": float(snr_db(ref, np.concatenate(pieces))),
        "ms_per_step_executorch": _median_ms(et_step, 10),
        "ms_per_step_torch": _median_ms(torch_step, 10),
        "codes_length": b,
    }


def talker_row(talker, pte: str, max_len: int) -> dict:
    """ms per talker position at mid-context: the bundle's talker step vs the torch talker."""
    cfg = talker.cfg
    run = method_runner(load_method(pte, 1))
    kv = np.zeros((cfg.num_hidden_layers, 2, cfg.num_key_value_heads, max_len, cfg.head_dim), np.float32)
    x = np.random.default_rng(2).standard_normal((1, 1, cfg.hidden_size)).astype(np.float32)
    pos = np.array([max_len // 2], np.int64)
    cache = talker.new_cache(max_len)
    xt = torch.from_numpy(x)

    def torch_step():
        with torch.inference_mode():
            talker(xt, max_len // 2, cache)

    return {"ms_per_position_executorch": _median_ms(lambda: run(x, pos, kv), 20),
            "ms_per_position_torch": _median_ms(torch_step, 20), "talker_slots": max_len}  # fmt: skip


def _bundle_steps(bundle: str) -> tuple[dict, dict, tuple]:
    with open(os.path.join(bundle, "manifest.json")) as fh:
        graphs = json.load(fh)["graphs"]
    pred = {**graphs["predictor"], "path": os.path.join(bundle, graphs["predictor"]["file"])}
    voc = {**graphs["vocoder"], "path": os.path.join(bundle, graphs["vocoder"]["file"])}
    voc["contract"] = read_contract(voc["path"])
    return pred, voc, (os.path.join(bundle, graphs["talker"]["file"]), int(graphs["talker"]["max_len"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="snapshot directory")
    ap.add_argument("--frames", type=int, default=16, help="frames for both checks (default 16)")
    ap.add_argument("--codes-length", type=int, default=4, help="vocoder frames per step (default 4)")
    ap.add_argument("--out", help="directory for the .pte files (default: a temp dir)")
    ap.add_argument("--bundle", help="measure this `qtts export executorch` bundle instead of exporting")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = args.out or tempfile.mkdtemp(prefix="qtts-et-")
    ckpt = load_checkpoint(args.model, components=("talker", "decoder"))
    talker = ckpt.model.talker.float().eval()
    decoder = ckpt.speech_tokenizer.decoder.float().eval()
    t0 = time.perf_counter()
    if args.bundle:
        pred, voc, talker_pte = _bundle_steps(args.bundle)
    else:
        pred = export_predictor_pte(talker, os.path.join(out, "predictor_step.pte"))
        voc = export_vocoder_pte(
            decoder, args.codes_length, os.path.join(out, f"vocoder_step{args.codes_length}.pte")
        )
    export_s = time.perf_counter() - t0
    row = {"model": os.path.abspath(args.model), "export_s": round(export_s, 1)}
    row["predictor_pte"] = {k: v for k, v in pred.items() if k != "path"}
    row["vocoder_pte"] = {k: v for k, v in voc.items() if k not in ("path", "contract")}
    row.update(predictor_row(talker, pred["path"], args.frames))
    b = voc["contract"].codes_length
    row.update(vocoder_row(decoder, voc["path"], voc["contract"], max(args.frames, 2 * b)))
    if args.bundle:
        row.update(talker_row(talker, *talker_pte))
    print(json.dumps(row, indent=2))
    label = f"bundle {os.path.basename(os.path.normpath(args.bundle))}" if args.bundle else "fp32"
    print(
        f"| ExecuTorch XNNPACK {label} (predictor + vocoder step) | codebooks 1-15 "
        f"{row['codebooks_1_15_agreement']:.4f} | logit SNR min/median {row['logit_snr_db_min']:.1f} / "
        f"{row['logit_snr_db_median']:.1f} dB | vocoder {row['vocoder_snr_db']:.1f} dB | predictor "
        f"{row['ms_per_frame_executorch']:.2f} ms/frame vs torch {row['ms_per_frame_torch']:.2f} | vocoder "
        f"{row['ms_per_step_executorch']:.2f} ms/step vs torch {row['ms_per_step_torch']:.2f} (B={row['codes_length']}) |"
    )


if __name__ == "__main__":
    main()
