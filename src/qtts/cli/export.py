"""``qtts export onnx|vocoder|qnn|executorch|rknn``, ``qtts verify plan|vocoder`` and ``qtts bench``."""

from __future__ import annotations

import argparse
import json
import os
import time

from ..errors import InputError
from ..plans.plan import COMPONENTS, LEGACY_NAMES
from ..plans.plan import STORAGES as TABLE_STORAGES
from .bench import register as register_bench
from .common import add_model, check_file, check_folder, cli_plan, command, group, hidden_alias, number
from .export_et import register_et

DEFAULT_SCHEDULES = ("1", "2", "4", "16", "64", "2,16")
# The choices below mirror qtts.export.onnx.PRECISIONS / PREDICTOR_MODES, quantize.DEFAULT_BLOCK_SIZE
# and rknn.TARGETS (tests/cli/test_cli_first_run.py checks they agree): building the parser must not
# import qtts.export, so `qtts say` never loads the export toolchain.
PRECISIONS = ("fp32", "int8", "int4")
PREDICTOR_MODES = ("frame", "step")
DEFAULT_BLOCK_SIZE = 128
RKNN_TARGETS = ("rk3588", "rk3576", "rk3562", "rk3566", "rk3568")


def register(sub) -> None:
    ex = group(sub, "export", "export to ONNX / RKNN / QNN: bundles and streaming vocoder steps")
    _export_onnx_arguments(command(ex, "onnx", run_export_onnx, "export a checkpoint to an onnxruntime bundle "
                                   "(graphs, tables, plan.json, manifest.json); needs the [export] extra"))
    p = command(ex, "vocoder", run_export_vocoder, "export the stateful streaming vocoder step "
                "(B frames per call) to ONNX and check it with onnxruntime")
    add_model(p, plan=False, dtype=False, threads=None)
    p.add_argument("-o", "--output", required=True, help="output .onnx file")
    _chunk_frames(p, 8, "--codes-length")
    p.add_argument("--frames", type=number(lo=1), metavar="N", help="frames for the onnxruntime check (default max(100, 3B))")
    p.add_argument("--gate", type=float, metavar="DB", default=80.0, help="minimum onnxruntime SNR in dB (default 80)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    p = command(ex, "qnn", run_export_qnn, "export the code-predictor step and the vocoder step for "
                "QNN HTP fp16, with a plan.json")
    add_model(p, plan=False, dtype=False, threads=None)
    p.add_argument("-o", "--output", required=True, help="output folder (gets plan.json)")
    _chunk_frames(p, 4, "--codes-length")
    p.add_argument("--soc-model", default="57", help="QNN soc_model for HTP fp16 (default 57 = SM8550)")
    register_et(ex)
    _export_rknn_arguments(command(ex, "rknn", run_export_rknn, "compile an ONNX vocoder step to .rknn "
                                   "(fp16, rknn-toolkit2 in .venv-rknn) with a simulator check"))
    ve = group(sub, "verify", "check a plan or the streaming vocoder against the torch fp32 reference")
    _verify_arguments(ve)
    register_bench(sub)


def _chunk_frames(p, default: int, *old: str) -> None:
    p.add_argument("--chunk-frames", type=number(lo=1), default=default, metavar="B",
                   help=f"vocoder frames per call of the exported step (default {default})")
    hidden_alias(p, *old, dest="chunk_frames", type=number(lo=1))


def _component(name: str) -> str:
    """argparse type of --components: today's names, and the old ones (code_predictor, speech_decoder)."""
    name = LEGACY_NAMES.get(name, name)
    if name not in COMPONENTS:
        raise argparse.ArgumentTypeError(f"invalid choice: '{name}' (choose from {', '.join(COMPONENTS)})")
    return name


def _streams(text: str) -> tuple:
    try:
        values = tuple(sorted({int(x) for x in text.split(",")}))
    except ValueError:
        values = ()
    if not values or values[0] < 2:
        raise argparse.ArgumentTypeError(f"expected stream counts >= 2 separated by commas, got {text!r}")
    return values


def _export_onnx_arguments(p) -> None:
    add_model(p, plan=False, dtype=False, threads=None)
    p.add_argument("-o", "--output", required=True, help="bundle folder to write (new or empty)")
    p.add_argument("--force", action="store_true", help="replace a non-empty folder (an older bundle) as a whole")
    p.add_argument("--weights", choices=PRECISIONS, default="fp32",
                   help="weight precision of talker and predictor (default fp32)")
    p.add_argument("--talker-weights", choices=PRECISIONS, help="override --weights for the talker")
    p.add_argument("--predictor-weights", choices=PRECISIONS, help="override --weights for the predictor")
    p.add_argument("--mix", metavar="SEL=P,...", default="", help="per-group precisions over those, last rule wins, "
                   "e.g. talker.first2=int8,talker.attn=int8,predictor.heads9-15=int8 (docs/plan.md)")
    p.add_argument("--repair", metavar="M[,M]", default="", help="repairs of the quantized weights: awq (activation-aware "
                   "scales folded into the norms), mse (fitted block scales), rotate (Hadamard-rotated residual stream and "
                   "MLP: outlier channels spread), combined with commas, e.g. rotate,mse (docs/fidelity.md)")
    p.add_argument("--block-size", type=int, choices=(32, 64, 128), default=DEFAULT_BLOCK_SIZE,
                   help=f"MatMulNBits block size (default {DEFAULT_BLOCK_SIZE}: fastest; 32: most faithful)")
    p.add_argument("--tables", choices=TABLE_STORAGES, default="fp32",
                   help="storage of the gathered embedding tables (default fp32; fp16 halves them, int8 with "
                   "per-row scales quarters them: the 'fast' preset's choice)")
    p.add_argument("--predictor-mode", choices=PREDICTOR_MODES, default="frame",
                   help="frame: 15 steps + sampling fused in one graph (fastest); step: one graph run per code")
    p.add_argument("--components", nargs="+", type=_component, default=list(COMPONENTS), metavar="NAME",
                   help=f"what to export: {', '.join(COMPONENTS)} (default all)")
    p.add_argument("--first-chunk-frames", type=number(lo=0), default=1, metavar="B",
                   help="frames per call of the vocoder step for the first chunk (default 1; 0: none)")
    p.add_argument("--chunk-frames", type=number(lo=0), default=8, metavar="B",
                   help="frames per call of the main vocoder step (default 8; 0: no vocoder)")
    p.add_argument("--vocoder-streams", type=_streams, default=(), metavar="S,S",
                   help="also stacked main vocoder steps for S streams per call (a batched server; e.g. 2,4)")
    p.add_argument("--vocoder-from", metavar="BUNDLE", help="reuse the vocoder artifacts of another bundle")
    p.add_argument("--no-batch-graphs", action="store_true", help="skip the batch graphs a batched engine runs "
                   "(qtts serve --max-batch); such a bundle steps concurrent streams one by one")
    p.add_argument("--predictor-kernels", action="store_true", help="the int8 rotated predictor frame's layers as "
                   "compiled qtts.kernels::DecoderLayer ops (opt-in: docs/performance.md, 'Compiled kernels')")
    hidden_alias(p, "--vocoder-first", dest="first_chunk_frames", type=number(lo=0))
    hidden_alias(p, "--vocoder-main", dest="chunk_frames", type=number(lo=0))
    hidden_alias(p, "--speech-decoder-from", dest="vocoder_from")


def run_export_onnx(args) -> int:
    from ..export.onnx import ExportOptions, export_bundle

    check_folder(args.output)  # a non-empty folder without --force: export_bundle refuses it (same check, one message)
    opts = ExportOptions(
        talker=args.talker_weights or args.weights, predictor=args.predictor_weights or args.weights,
        block_size=args.block_size, predictor_mode=args.predictor_mode, vocoder_first=args.first_chunk_frames,
        vocoder_main=args.chunk_frames, components=tuple(dict.fromkeys(args.components)),
        vocoder_from=args.vocoder_from, batch_graphs=not args.no_batch_graphs, vocoder_streams=args.vocoder_streams,
        tables=args.tables, mix=args.mix, repair=args.repair, predictor_kernels=args.predictor_kernels,
    )
    t0 = time.perf_counter()
    plan = export_bundle(args.model, args.output, opts, overwrite=args.force)
    print(f"exported {', '.join(plan)} to {args.output} in {time.perf_counter() - t0:.1f} s")
    print(f"plan ({os.path.join(args.output, 'plan.json')}):")
    print(json.dumps(plan, indent=2, sort_keys=True))
    return 0


def run_export_vocoder(args) -> int:
    from ..export.vocoder import export_vocoder_onnx, report_text, verify_onnx
    from ..plans.plan import plan_snippet

    check_file(args.output, suffixes=(".onnx",))
    report = export_vocoder_onnx(args.model, args.chunk_frames, args.output)
    print(report_text(report))
    ok = not report["kv_concat"]
    if report["risky_ops"]:
        print("WARNING: ops the RKNN converter is known to choke on:", ", ".join(report["risky_ops"]))
    if not args.no_verify:
        frames = args.frames or max(100, 3 * args.chunk_frames)
        snr = verify_onnx(args.model, report["path"], frames=frames)
        ok = ok and snr >= args.gate
        print(f"onnxruntime stepwise vs torch offline decode ({frames} frames): SNR {snr:.1f} dB "
              f"(gate {args.gate:g}) {'ok' if snr >= args.gate else 'FAIL'}")
    print("plan snippet:")
    print(plan_snippet("vocoder", "onnx", {"main": os.path.basename(report["path"])}))
    return 0 if ok else 1


def run_export_qnn(args) -> int:
    from ..export.qnn import export_qnn_bundle

    check_folder(args.output)
    out = export_qnn_bundle(args.model, args.output, args.chunk_frames, args.soc_model)
    print(f"predictor step: {out['predictor']['path']} (ops: {', '.join(out['predictor']['ops'])})")
    print(f"vocoder step: {out['vocoder']['path']}")
    print(f"plan: {out['plan']}  (talker: torch; predictor and vocoder: qnn fp16)")
    print(f"check it: qtts verify plan -m {args.model} --plan {out['plan']}")
    return 0


def _export_rknn_arguments(p) -> None:
    p.add_argument("--onnx", required=True, help="step exported by `qtts export vocoder`")
    p.add_argument("--target", required=True, choices=RKNN_TARGETS, help="Rockchip SoC (a .rknn is per SoC)")
    p.add_argument("-o", "--output", help="output .rknn (default: <onnx>_<target>.rknn)")
    p.add_argument("--frames", type=number(lo=1), metavar="N", help="simulator check frames (default 3B)")
    p.add_argument("--gate", type=float, metavar="DB", default=50.0, help="minimum simulator SNR vs onnxruntime (dB)")
    p.add_argument("--no-verify", action="store_true", help="skip the simulator check")
    p.add_argument("--python", help="python of the converter env (default .venv-rknn)")


def run_export_rknn(args) -> int:
    from ..export.rknn import compile_rknn
    from ..plans.plan import plan_snippet

    if args.output:
        check_file(args.output, suffixes=(".rknn",))
    res = compile_rknn(args.onnx, args.target, args.output, verify=not args.no_verify,
                       frames=args.frames, gate=args.gate, python=args.python)
    print(f"wrote {res['rknn']} ({args.target}, fp16) in {res['build_s']:.1f} s; contract {res['contract']}")
    print(f"compile log: {res['log']}")
    ok = bool(res["passed"]) if "snr_db" in res else True
    if "snr_db" in res:
        print(f"simulator vs onnxruntime stepwise: SNR {res['snr_db']:.1f} dB (gate {res['gate_db']:g}) "
              f"{'ok' if ok else 'FAIL'}")
    print("plan snippet (copy the .rknn and its .json to the board):")
    print(plan_snippet("vocoder", "rknn", {"main": os.path.basename(res["rknn"])}))
    return 0 if ok else 1


def _verify_arguments(ve) -> None:
    p = command(ve, "plan", run_verify_plan, "compare a plan (e.g. an ONNX bundle) with the torch fp32 "
                "reference: codes, logits, vocoder SNR")
    add_model(p, threads="threads for both runtimes")
    p.add_argument("--frames", type=number(lo=1), metavar="N", default=32, help="greedy frames to generate (default 32)")
    p.add_argument("--vocoder-frames", type=number(lo=0), metavar="N", default=0,
                   help="also decode N random-code frames against the vocoder's bf16 bar (docs/fidelity.md; 300+)")
    p.add_argument("--text", help="text to speak (default: a fixed English sentence)")
    p.add_argument("--report", help="write the report to this .md (and the same stem .json)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of Markdown")
    p = command(ve, "aligner", run_verify_aligner, "compare the forced aligner's ONNX graphs (fp32, int8) with its "
                "torch fp32 reference: logits, marker classes, words within one 80 ms bin")
    p.add_argument("--aligner", required=True, metavar="DIR|HUB_ID", help="the Qwen3-ForcedAligner snapshot")
    p.add_argument("--seeds", type=number(lo=1), default=2, metavar="N", help="clips per language (default 2)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of Markdown")
    p = command(ve, "vocoder", run_verify_vocoder, "check the streaming vocoder step against the offline "
                "decode (SNR in dB per chunk schedule)")
    add_model(p, plan=False, dtype=False)
    p.add_argument("--chunk-frames", action="append", metavar="B[,B...]",
                   help="a chunk schedule: the first chunks' sizes, the last one repeats, then a remainder "
                   "(2,16 = 2 then 16s); repeatable (default: " + " ".join(DEFAULT_SCHEDULES) + ")")
    hidden_alias(p, "--chunks", dest="chunk_frames", action="append")
    p.add_argument("--frames", type=number(lo=1), metavar="N", default=300, help="random frames to decode (default 300)")
    p.add_argument("--gate", type=float, metavar="DB", default=100.0, help="minimum SNR in dB (default 100, fp32)")
    p.add_argument("--seed", type=int, default=0, help="random codes seed")


def run_verify_plan(args) -> int:
    from ..export.verify import report_markdown, verify_plan, write_report

    if args.report:
        check_file(args.report, "--report")
    plan = cli_plan(args)  # no --plan: the default preset (built if missing); 'torch' or --dtype: torch
    report = verify_plan(args.model, plan if isinstance(plan, str) else "torch", frames=args.frames, text=args.text,
                         threads=args.threads, dtype=args.dtype, vocoder_frames=args.vocoder_frames)
    print(json.dumps(report, indent=2, default=str) if args.json else report_markdown(report))
    if args.report:
        write_report(report, args.report)
    return 1 if report["passed"] is False else 0


def run_verify_aligner(args) -> int:
    from ..align.runtime import find_aligner
    from ..export.verify_aligner import report_markdown, verify_aligner

    report = verify_aligner(find_aligner(args.aligner), seeds=args.seeds)
    print(json.dumps(report, indent=2) if args.json else report_markdown(report))
    return 0 if report["passed"] else 1


def expand_schedule(spec: str, frames: int) -> list[int]:
    """'2,16' over 37 frames -> [2, 16, 16, 3]."""
    try:
        sizes = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError as exc:
        raise InputError(f"--chunk-frames '{spec}': expected comma-separated integers") from exc
    if not sizes or min(sizes) < 1:
        raise InputError(f"--chunk-frames '{spec}': chunk sizes must be >= 1")
    out: list[int] = []
    while sum(out) < frames:
        out.append(min(sizes[min(len(out), len(sizes) - 1)], frames - sum(out)))
    return out


def run_verify_vocoder(args) -> int:
    import numpy as np
    import torch

    from ..audio.chunk import snr_db
    from ..backends.torch import step_decode
    from ..export.vocoder import load_decoder
    from ..model.vocoder_step import VocoderStep

    plans = {s: expand_schedule(s, args.frames) for s in args.chunk_frames or DEFAULT_SCHEDULES}
    if args.threads:
        torch.set_num_threads(args.threads)
    decoder = load_decoder(args.model)
    codes = np.random.default_rng(args.seed).integers(0, decoder.config.codebook_size, (args.frames, 16))
    codes = torch.from_numpy(codes.T[None].copy())
    t0 = time.perf_counter()
    with torch.inference_mode():
        ref = decoder(codes).reshape(-1).numpy()
    dt = time.perf_counter() - t0
    print(f"offline decode: {args.frames} frames in {dt:.2f} s ({1000 * dt / args.frames:.1f} ms/frame)")
    steps: dict[int, VocoderStep] = {}

    def step_for(b: int) -> VocoderStep:
        if b not in steps:
            steps[b] = VocoderStep(decoder, b, like=next(iter(steps.values()), None)).eval()
        return steps[b]

    worst = float("inf")
    for spec, plan in plans.items():
        t0 = time.perf_counter()
        out = step_decode(step_for, codes, plan)
        dt = time.perf_counter() - t0
        snr = snr_db(ref, out) if len(out) == len(ref) else float("-inf")
        worst = min(worst, snr)
        print(f"schedule {spec:>8}: {len(plan)} steps, SNR {snr:7.1f} dB, {1000 * dt / args.frames:.1f} ms/frame  "
              f"{'ok' if snr >= args.gate else 'FAIL'}")
    print(f"worst SNR {worst:.1f} dB (gate {args.gate:g} dB, window {decoder.config.sliding_window} frames)")
    return 0 if worst >= args.gate else 1
