"""Fidelity of an execution plan against the torch fp32 reference on the same checkpoint.

Metrics (reusable): :func:`token_agreement`, :func:`first_divergence`, :func:`qtts.audio.snr_db`.
:func:`verify_plan` measures, for one prompt and ``frames`` frames:

* **greedy free-running**: both backends generate greedily through :mod:`qtts.engine.generate`; the
  rate of identical frames (all 16 codes) and the first divergent frame;
* **teacher-forced codebook 0**: the talker of each backend is fed the reference frames; top-1
  agreement of the greedy code-0 pick and the SNR of the talker logits;
* **codebooks 1-15**: each backend's ``predict_frame`` (greedy) gets the *reference* talker
  hidden state and code 0 of every frame, so the predictor is measured on its own; where the
  backend reports its predictor logits (torch, ONNX frame graphs) also their SNR, teacher-forced:
  per frame over the heads whose inputs were still equal (up to and including the first head whose
  greedy code differs), min / median over frames;
* **vocoder**: the plan's streaming vocoder (chunks of 2 then 8 frames) against the torch offline
  decode of the reference codes, SNR in dB.

Gates (:data:`GATES`): a plan whose components are all fp32 must reproduce the greedy codes
exactly and decode at >= 80 dB. Quantized plans are reported, not gated.
Random weights test the mechanism, not the real model's sensitivity to quantization.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import replace

import numpy as np

from ..audio.chunk import snr_db
from ..config import NUM_CODEBOOKS, PREDICTOR_STEPS
from ..engine.generate import PredictorSampler
from .vocoder_bar import stream_decode

log = logging.getLogger(__name__)

GATES = {"greedy_equal_rate": 1.0, "vocoder_snr_db": 80.0}
#: the fidelity half of the rule that picks the default preset (docs/fidelity.md): both logit SNRs,
#: min over teacher-forced frames, at full size
DEFAULT_GATE_DB = 25.0


def token_agreement(ref: np.ndarray, test: np.ndarray) -> float:
    """Fraction of equal entries over the common leading length (1.0 for two empty arrays)."""
    n = min(len(ref), len(test))
    if n == 0:
        return 1.0 if len(ref) == len(test) else 0.0
    return float(np.mean(np.asarray(ref[:n]) == np.asarray(test[:n])))


def first_divergence(ref: np.ndarray, test: np.ndarray) -> int | None:
    """Index of the first frame (row) that differs, the shorter length if one is a prefix, else None."""
    ref, test = np.asarray(ref), np.asarray(test)
    n = min(len(ref), len(test))
    for i in range(n):
        if not np.array_equal(ref[i], test[i]):
            return i
    return None if len(ref) == len(test) else n


# ---------------------------------------------------------------------------- setup


def reference_prompt(parts, text: str):
    """(prompt, speaker vector or None): a named speaker if the checkpoint has one, else an x-vector."""
    from ..text.prompt import Mode, build_prompt

    cfg = parts.config
    if cfg.speakers:
        return build_prompt(cfg, parts.tokenizer, text, Mode("custom_voice", speaker=cfg.speakers[0])), None
    dim = cfg.speaker_encoder.enc_dim if cfg.speaker_encoder is not None else cfg.talker.hidden_size
    speaker = np.random.default_rng(1234).standard_normal(dim).astype(np.float32) * 0.05
    return build_prompt(cfg, parts.tokenizer, text, Mode("xvector", xvector=speaker)), speaker


def greedy_params(config, frames: int, **kw):
    from ..options import LoopParams, SamplingParams

    greedy = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.05)
    return LoopParams.for_config(config, greedy, replace(greedy, repetition_penalty=1.0), frames, seed=0,
                                 watchdog=None, **kw)  # fmt: skip


def generate_codes(backend, prompt, lp, speaker) -> np.ndarray:
    from ..engine.generate import generate

    frames = list(generate(backend, prompt, lp, speaker))
    return np.asarray(frames, dtype=np.int64).reshape(-1, NUM_CODEBOOKS)


# ---------------------------------------------------------------------------- measurements


def _forced_run(be, prompt, lp, speaker, codes: np.ndarray) -> list:
    """(logits, hidden) before each reference frame, feeding the reference frames to the talker."""
    from ..engine.generate import advance, prefill

    state = prefill(be, prompt, lp, speaker)
    out = []
    for frame in codes:
        out.append((np.asarray(state.logits, np.float32).copy(), np.asarray(state.hidden, np.float32).copy()))
        state.history.append(int(frame[0]))
        advance(be, state, frame)
    return out


def _teacher_forced(ref_be, test_be, prompt, lp, speaker, codes: np.ndarray) -> dict:
    """Feed the reference frames to both talkers; compare code-0 picks, logits and the predictor."""
    from ..engine.generate import pick_code0

    lp = replace(lp, max_frames=max(lp.max_frames, len(codes)))
    runs = [_forced_run(be, prompt, lp, speaker, codes) for be in (ref_be, test_be)]
    code0_ref, code0_test, snrs, cb_ref, cb_test, psnrs = [], [], [], [], [], []
    u = np.zeros(PREDICTOR_STEPS)
    for s, ((lr, hr), (lt, _ht)) in enumerate(zip(*runs)):
        history = [int(c) for c in codes[:s, 0]]
        code0_ref.append(pick_code0(lr, history, s, lp, 0.0))
        code0_test.append(pick_code0(lt, history, s, lp, 0.0))
        snrs.append(snr_db(lr, lt))
        sampler = PredictorSampler(lp.predictor)
        ref, test = (_predictor(be, hr, int(codes[s, 0]), sampler, u) for be in (ref_be, test_be))
        cb_ref.append(ref[0])
        cb_test.append(test[0])
        if ref[1] is not None and test[1] is not None:
            psnrs.append(_forced_heads_snr(ref, test))
    return {
        "code0_top1_agreement": token_agreement(np.array(code0_ref), np.array(code0_test)),
        "codebooks_1_15_agreement": token_agreement(np.concatenate(cb_ref), np.concatenate(cb_test)),
        **_snr_stats("talker_logit_snr_db", snrs),
        **_snr_stats("predictor_logit_snr_db", psnrs if len(psnrs) == len(snrs) else None),
    }


def _predictor(backend, hidden, code0: int, sampler, u):
    """(codes, logits [15, vocab] or None) of one frame from the reference hidden state and code 0."""
    probe = getattr(backend, "predictor_logits", None)
    out = probe(hidden, code0, sampler, u) if probe is not None else None
    return out if out is not None else (backend.predict_frame(hidden, code0, sampler, u), None)


def _forced_heads_snr(ref, test) -> float:
    """SNR of the predictor heads whose inputs were still the same in both runs: every head up to
    and including the first one whose greedy code differs (the later heads see other codes)."""
    diff = np.nonzero(np.asarray(ref[0]) != np.asarray(test[0]))[0]
    n = int(diff[0]) + 1 if len(diff) else len(ref[0])
    return snr_db(np.asarray(ref[1])[:n], np.asarray(test[1])[:n])


def _snr_stats(name: str, snrs) -> dict:
    """``name``_min / _median over frames (None when not measured: a runtime without logits)."""
    if snrs is None:
        return {f"{name}_min": None, f"{name}_median": None}
    finite = [x for x in snrs if math.isfinite(x)]
    return {f"{name}_min": min(snrs) if snrs else float("inf"),
            f"{name}_median": float(np.median(finite)) if finite else float("inf")}  # fmt: skip


def _vocoder_snr(parts, checkpoint, codes: np.ndarray) -> float | None:
    import torch

    if len(codes) == 0:
        return None
    test = stream_decode(parts.vocoder.stream(), codes, first=2)
    with torch.inference_mode():
        ref = checkpoint.speech_tokenizer.decoder(torch.from_numpy(codes.T[None].copy()))
    return snr_db(ref.reshape(-1).float().numpy(), test)


def _vocoder_bar(parts, checkpoint, frames: int) -> dict:
    """``vocoder_bar``: the plan's vocoder and bf16 over ``frames`` random-code frames
    (:func:`qtts.export.vocoder_bar.vocoder_fidelity`); {} when ``frames`` is 0."""
    from .vocoder_bar import vocoder_fidelity

    if not frames:
        return {}
    return {"vocoder_bar": vocoder_fidelity(parts.vocoder, checkpoint.speech_tokenizer.decoder.float(), frames)}


# ---------------------------------------------------------------------------- entry point


def plan_precisions(plan, dtype: str = "float32") -> dict:
    torch_precision = {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype)
    out = {}
    for name in ("talker", "predictor", "vocoder"):
        spec = plan.get(name)
        precision = torch_precision if spec.impl == "torch" and name != "vocoder" else spec.precision
        out[name] = f"{spec.impl}/{precision or 'fp32'}"
    return out


def verify_plan(
    model: str,
    plan_path: str | None,
    frames: int = 32,
    text: str | None = None,
    threads: int | None = None,
    dtype: str = "float32",
    vocoder_frames: int = 0,
):
    """Run every measurement; returns the report dict (``passed`` is None when no gate applies).
    ``vocoder_frames`` > 0: also the vocoder against the bf16 bar over that many frames."""
    from ..backends import open as open_components
    from ..backends.torch import TorchBackend
    from ..weights import load_checkpoint

    text = text or "The quick brown fox jumps over the lazy dog, then rests by the river."
    t0 = time.perf_counter()
    parts = open_components(model, plan=plan_path, threads=threads, dtype=dtype)
    checkpoint = load_checkpoint(model, components=("talker", "decoder"))
    ref_be = TorchBackend(checkpoint.model.talker, threads=threads)
    prompt, speaker = reference_prompt(parts, text)
    lp = greedy_params(parts.config, frames)
    ref_codes = generate_codes(ref_be, prompt, lp, speaker)
    test_codes = generate_codes(parts.backend, prompt, lp, speaker)
    n = max(len(ref_codes), len(test_codes))
    equal = sum(1 for a, b in zip(ref_codes, test_codes) if np.array_equal(a, b))
    report = {
        "model": os.path.abspath(checkpoint.path),
        "plan": os.path.abspath(plan_path) if plan_path and plan_path != "torch" else f"torch {dtype}",
        "components": plan_precisions(parts.plan, dtype),
        "frames": int(frames),
        "greedy_frames": [len(ref_codes), len(test_codes)],
        "greedy_equal_rate": equal / n if n else 1.0,
        "greedy_first_divergent_frame": first_divergence(ref_codes, test_codes),
    }
    report.update(_teacher_forced(ref_be, parts.backend, prompt, lp, speaker, ref_codes))
    report["vocoder_snr_db"] = _vocoder_snr(parts, checkpoint, ref_codes)
    report.update(_vocoder_bar(parts, checkpoint, vocoder_frames))
    report["weights"] = plan_weights(parts.plan, plan_path)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["gated"] = all(p.endswith("/fp32") for p in report["components"].values())
    report["default_gate"] = _default_gate(report)
    report["passed"] = _gates_pass(report) if report["gated"] else None
    return {k: _plain(v) for k, v in report.items()}


def plan_weights(plan, plan_path: str | None) -> dict | None:
    """Bits per streamed weight of the plan's ONNX talker and predictor graphs, from their actual
    weights (:func:`qtts.export.quantize.streamed_weights`; a frame runs each graph once), and the
    bundle's weight recipe; None for a plan without them."""
    from ..errors import InputError
    from ..plans.plan import read_manifest
    from .quantize import streamed_weights

    out = {}
    for name in ("talker", "predictor"):
        spec = plan.get(name)
        if spec.impl == "onnx" and spec.artifact("main"):
            out[name] = streamed_weights(spec.artifact("main"))
    if not out:
        return None
    n, b = sum(v["weights"] for v in out.values()), sum(v["bytes"] for v in out.values())
    out["per_frame"] = {"weights": n, "bytes": b, "bits_per_weight": 8 * b / n if n else None}
    try:
        out["recipe"] = read_manifest(os.path.dirname(os.path.abspath(plan_path)))["options"].get("recipe")
    except (InputError, KeyError, TypeError):
        out["recipe"] = None
    return out


def _plain(value):
    """numpy scalars -> python (JSON-friendly); containers recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _gates_pass(report: dict) -> bool:
    voc = report["vocoder_snr_db"]
    return bool(
        report["greedy_equal_rate"] >= GATES["greedy_equal_rate"]
        and (voc is None or voc >= GATES["vocoder_snr_db"])
    )


def _default_gate(report: dict):
    """True / False: both logit SNR minima >= :data:`DEFAULT_GATE_DB`; None: the predictor's were not measured."""
    low = [report["talker_logit_snr_db_min"], report["predictor_logit_snr_db_min"]]
    return None if None in low else bool(min(low) >= DEFAULT_GATE_DB)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def report_markdown(report: dict) -> str:
    comps = ", ".join(f"{k} {v}" for k, v in report["components"].items())
    rows = [
        ("greedy frames identical (rate)", report["greedy_equal_rate"]),
        ("greedy first divergent frame", report["greedy_first_divergent_frame"]),
        ("teacher-forced codebook 0 top-1 agreement", report["code0_top1_agreement"]),
        ("codebooks 1-15 agreement (reference hidden)", report["codebooks_1_15_agreement"]),
        ("talker logit SNR dB (min / median)",
         f"{_fmt(report['talker_logit_snr_db_min'])} / {_fmt(report['talker_logit_snr_db_median'])}"),
        ("predictor logit SNR dB (min / median; reference hidden and code 0)",
         f"{_fmt(report.get('predictor_logit_snr_db_min'))} / {_fmt(report.get('predictor_logit_snr_db_median'))}"),
        ("vocoder SNR dB (stream vs torch offline)", report["vocoder_snr_db"]),
    ]  # fmt: skip
    weights = report.get("weights") or {}
    for name in ("talker", "predictor", "per_frame"):
        if name in weights:
            w = weights[name]
            rows.append((f"{name.replace('_', ' ')} bits per streamed weight ({w['bytes'] / 1e6:.1f} MB)", w["bits_per_weight"]))
    if weights.get("recipe"):
        rows.append(("weight recipe", _recipe_text(weights["recipe"])))
    verdict = {True: "PASS", False: "FAIL", None: "reported (no gate for quantized plans)"}[report["passed"]]
    lines = [f"# qtts verify plan: {report['plan']}", "", f"Components: {comps}  ",
             f"Frames: {report['frames']} (greedy, reference {report['greedy_frames'][0]}, "
             f"test {report['greedy_frames'][1]})", "", "| metric | value |", "|---|---|"]  # fmt: skip
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows]
    lines += _bar_lines(report.get("vocoder_bar"))
    lines += ["", f"Gates (fp32 plans): greedy codes 100 % equal, vocoder >= {GATES['vocoder_snr_db']:.0f} dB: "
              f"**{verdict}**", ""]  # fmt: skip
    gate = {True: "PASS", False: "FAIL", None: "not measured (no predictor logits)"}[report.get("default_gate")]
    lines += [f"Default-preset gate (talker and predictor logit SNR min >= {DEFAULT_GATE_DB:g} dB, at full size): "
              f"**{gate}**", ""]  # fmt: skip
    return "\n".join(lines)


def _bar_lines(bar: dict | None) -> list[str]:
    if not bar:
        return []
    head = f"| vocoder over {bar['frames']} random-code frames vs fp32 offline | plan (streamed 1 + 8) | bf16 bar (offline) |"
    rows = [f"| {name} | {_fmt(bar['plan'][key])} | {_fmt(bar['bf16_bar'][key])} |" for key, name in
            (("snr_db", "waveform SNR dB"), ("worst_segment_snr_db", "worst 170 ms segment SNR dB"),
             ("lsd_db", "log-spectral distance dB (lower is closer)"))]  # fmt: skip
    verdict = "**meets** the bf16 bar" if bar["meets_bar"] else "**below** the bf16 bar"
    return ["", head, "|---|---|---|", *rows, "", f"Vocoder: {verdict} (all three metrics)"]


def _recipe_text(recipe: dict) -> str:
    out = f"talker {recipe.get('talker')}, predictor {recipe.get('predictor')}"
    if recipe.get("mix"):
        out += "; mix " + ",".join(recipe["mix"])
    return out + ("; repair " + ",".join(recipe["repair"]) if recipe.get("repair") else "")


def write_report(report: dict, path: str) -> None:
    """``path``.md gets the Markdown table, the same stem .json the raw numbers."""
    stem = path[:-3] if path.endswith(".md") else path
    for suffix, text in (
        (".md", report_markdown(report)),
        (".json", json.dumps(report, indent=2, default=str)),
    ):
        tmp = stem + suffix + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.replace(tmp, stem + suffix)
