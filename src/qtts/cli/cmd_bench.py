"""``qtts bench``: per-component ms/frame, frames/s, RTF, TTFA and peak RSS for plans on one checkpoint."""

from __future__ import annotations

import os

COMMAND = ("bench",)
HELP = "benchmark plans (and optionally the official qwen-tts) on one checkpoint, side by side"


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="snapshot directory or hub id")
    parser.add_argument(
        "--plan", action="append", default=None,
        help="execution plan JSON; repeat to compare plans; 'torch' = the torch fp32 default (default: torch)",
    )  # fmt: skip
    parser.add_argument(
        "--frames", type=int, default=64, help="frames per run, EOS blocked (default 64 = 5.1 s)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per plan (medians; default 3)")
    parser.add_argument(
        "--threads", type=int, default=2, help="intra-op threads for every runtime (default 2)"
    )
    parser.add_argument("--compare-official", action="store_true", help="also run the official qwen-tts fp32")
    parser.add_argument("--plot", help="write a PNG of per-component time per plan")
    parser.add_argument("--json", help="write all results to this JSON file")


def run(args) -> int:
    from ..bench import BenchOptions, bench_official, bench_plan, plot, table_markdown
    from ..errors import InputError

    if args.frames < 4 or args.repeats < 1:
        raise InputError("--frames must be >= 4 and --repeats >= 1")
    _check_outputs(args.plot, args.json)  # before minutes of benchmarking, not after
    opts = BenchOptions(frames=args.frames, repeats=args.repeats, threads=args.threads)
    results = []
    for plan in args.plan or ["torch"]:
        label = "torch fp32" if plan == "torch" else _label(plan)
        results.append(bench_plan(args.model, None if plan == "torch" else plan, opts, label=label))
        print(f"{label}: RTF {results[-1]['rtf']:.2f}, TTFA {results[-1]['ttfa_ms']:.0f} ms", flush=True)
    official = bench_official(args.model, opts) if args.compare_official else None
    print(table_markdown(results, official))
    if args.plot:
        plot(results, args.plot, official)
    if args.json:
        from ..bundle import write_json  # temp file + rename

        write_json(args.json, {"options": vars(opts), "results": results, "official": official})
    return 0


def _check_outputs(plot_path: str | None, json_path: str | None) -> None:
    from ..errors import InputError

    if plot_path and not plot_path.lower().endswith(".png"):
        raise InputError(f"--plot {plot_path}: the plot is a PNG; give a path ending in .png")
    for flag, path in (("--plot", plot_path), ("--json", json_path)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            raise InputError(f"{flag} {path}: folder {folder} does not exist; create it first")


def _label(plan_path: str) -> str:
    """'onnx: talker int4, predictor int8, vocoder fp32' from the plan's components."""
    from ..plan import load_plan

    plan = load_plan(plan_path)
    specs = [(short, plan.get(name)) for name, short in
             (("talker", "talker"), ("predictor", "predictor"), ("vocoder", "vocoder"))]  # fmt: skip
    impls = {spec.impl for _, spec in specs}
    if len(impls) == 1:
        label = f"{impls.pop()}: " + ", ".join(f"{short} {spec.precision or 'fp32'}" for short, spec in specs)
    else:
        label = ", ".join(f"{short} {spec.impl} {spec.precision or 'fp32'}" for short, spec in specs)
    block = _block_size(plan_path)
    quantized = any(spec.precision in ("int8", "int4") for _, spec in specs)
    return f"{label} (block {block})" if block and quantized else label


def _block_size(plan_path: str) -> int | None:
    """MatMulNBits block size from the bundle manifest next to the plan (None when absent)."""
    from ..bundle import read_manifest
    from ..errors import InputError

    try:
        return int(read_manifest(os.path.dirname(os.path.abspath(plan_path)))["options"]["block_size"])
    except (InputError, ValueError, KeyError, TypeError):
        return None
