"""``qtts bench``: plans side by side (and the official qwen-tts), concurrency levels, word timestamps."""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..errors import InputError
from .common import add_model, check_file, command, number


def register(sub) -> None:
    _bench_arguments(command(sub, "bench", run_bench, "benchmark plans (and optionally the official "
                             "qwen-tts) on one checkpoint, side by side"))


def _bench_arguments(p) -> None:
    add_model(p, plan=False, dtype=False, threads=None)
    p.add_argument("--plan", action="append", help="a preset (fast, faithful, fastest: built once and cached), "
                   "'torch' (the fp32 reference) or a plan.json; repeat to compare plans (default: fast)")
    p.add_argument("--no-build", action="store_true", help="fail instead of building a preset that is not cached")
    p.add_argument("--frames", type=number(lo=4), metavar="N", default=64, help="frames per run, EOS blocked (default 64 = 5.1 s)")
    p.add_argument("--repeats", type=number(lo=1), default=3, help="measured runs per plan (medians; default 3)")
    p.add_argument("--threads", type=number(lo=1), default=2, help="intra-op CPU threads for every runtime (default 2)")
    p.add_argument("--pipeline", choices=("on", "off", "both"), default="on",
                   help="generation on a second thread (on, the library default), one thread (off), or each plan both ways")
    p.add_argument("--compare-official", action="store_true", help="also run the official qwen-tts fp32")
    p.add_argument("--plot", help="write a PNG of per-component time per plan")
    p.add_argument("--json", help="write all results to this JSON file")
    p.add_argument("--concurrency", type=_levels, metavar="K,K,...",
                   help="concurrent streams per level (e.g. 1,2,4,8): one batched engine vs K engines, "
                   "aggregate audio s/s, per-stream RTF and TTFA p50/p95 (--frames per stream, --repeats rounds)")
    p.add_argument("--no-engines", action="store_true", help="with --concurrency: skip the K-engine rounds")
    p.add_argument("--timestamps", action="store_true", help="word timestamps: the aligner pass per runtime (ms per "
                   "second of audio, fp32 and int8 ONNX) and the stream with timestamps off and on (first audio, RTF)")
    p.add_argument("--aligner", metavar="DIR|HUB_ID", help="with --timestamps: the forced aligner snapshot "
                   "(default: $QTTS_ALIGNER, else the official one in the Hugging Face cache)")


def _levels(text: str) -> tuple:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1 or max(levels) > 64:
        raise argparse.ArgumentTypeError(f"{text!r}: give stream counts 1..64 separated by commas, e.g. 1,2,4,8")
    return levels


def run_bench(args) -> int:
    from ..tools.bench import BenchOptions, bench_official, bench_plan, plot, table_markdown

    if args.plot:  # before minutes of benchmarking, not after
        check_file(args.plot, "--plot", suffixes=(".png",))
    if args.json:
        check_file(args.json, "--json")
    if args.concurrency:
        return _run_concurrency(args)
    if args.timestamps:
        return _run_timestamps(args)
    if args.compare_official:  # before minutes of benchmarking, not after
        from ..tools.official import check_installed

        check_installed()
    opts = BenchOptions(frames=args.frames, repeats=args.repeats, threads=args.threads)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.pipeline]
    results = []
    for plan, label in _bench_plans(args):
        for pipeline in modes:
            results.append(bench_plan(args.model, plan, dataclasses.replace(opts, pipeline=pipeline), label=label))
            r = results[-1]
            print(f"{r['label']}: RTF {r['rtf']:.2f}, TTFA {r['ttfa_ms']:.0f} ms, peak RSS {r['plan_peak_rss_mb']:.0f} MB",
                  flush=True)  # fmt: skip
    official = bench_official(args.model, opts) if args.compare_official else None
    print(table_markdown(results, official))
    if args.plot:
        plot(results, args.plot, official)
    if args.json:
        from ..plans.plan import write_json  # temp file + rename

        write_json(args.json, {"options": vars(opts), "results": results, "official": official})
    return 0


def _run_timestamps(args) -> int:
    from ..tools.bench_timestamps import TimestampBenchOptions, bench_timestamps, table_markdown

    if args.compare_official or args.plot or args.concurrency:
        raise InputError("--timestamps takes neither --compare-official, --plot nor --concurrency")
    opts = TimestampBenchOptions(frames=args.frames, repeats=args.repeats, threads=args.threads)
    results = [dict(bench_timestamps(args.model, plan, args.aligner, opts), label=label)
               for plan, label in _bench_plans(args)]  # fmt: skip
    for result in results:
        print(f"{result['label']}:\n{table_markdown(result)}\n", flush=True)
    if args.json:
        from ..plans.plan import write_json  # temp file + rename

        write_json(args.json, {"options": {**vars(opts), "runtimes": list(opts.runtimes)}, "timestamps": results})
    return 0


def _run_concurrency(args) -> int:
    from ..tools.bench_concurrency import ConcurrencyOptions, bench_concurrency, table_markdown

    if args.compare_official or args.plot:
        raise InputError("--concurrency takes neither --compare-official nor --plot")
    opts = ConcurrencyOptions(levels=args.concurrency, frames=args.frames, repeats=args.repeats, threads=args.threads,
                              engines=not args.no_engines)  # fmt: skip
    rows = []
    for plan, label in _bench_plans(args):
        rows += bench_concurrency(args.model, plan, opts, label=label)
        print(f"{label}: done", flush=True)
    print(table_markdown(rows))
    if args.json:
        from ..plans.plan import write_json  # temp file + rename

        write_json(args.json, {"options": {**vars(opts), "levels": list(opts.levels)}, "concurrency": rows})
    return 0


def _bench_plans(args) -> list:
    """(plan, label) per --plan: presets built (or found) first, so no build is timed."""
    from ..backends import snapshot_dir
    from ..plans.cache import DEFAULT_PRESET, ENV_PLAN, TORCH, preset_name, resolve_plan

    out = []
    for plan in args.plan or [os.environ.get(ENV_PLAN) or DEFAULT_PRESET]:
        if plan == TORCH:
            out.append((TORCH, "torch fp32"))
            continue
        path = resolve_plan(plan, snapshot_dir(args.model), no_build=True if args.no_build else None)
        name = preset_name(plan)
        out.append((path, f"{name}: {_label(path)}" if name else _label(path)))
    return out


def _label(plan_path: str) -> str:
    """'onnx: talker int4, predictor int8, vocoder fp32' from the plan's components."""
    from ..plans.plan import load_plan, read_manifest

    plan = load_plan(plan_path)
    specs = [(short, plan.get(name)) for name, short in
             (("talker", "talker"), ("predictor", "predictor"), ("vocoder", "vocoder"))]
    impls = {spec.impl for _, spec in specs}
    if len(impls) == 1:
        label = f"{impls.pop()}: " + ", ".join(f"{short} {spec.precision or 'fp32'}" for short, spec in specs)
    else:
        label = ", ".join(f"{short} {spec.impl} {spec.precision or 'fp32'}" for short, spec in specs)
    if not any(spec.precision in ("int8", "int4") for _, spec in specs):
        return label
    try:  # the MatMulNBits block size from the bundle manifest next to the plan
        block = int(read_manifest(os.path.dirname(os.path.abspath(plan_path)))["options"]["block_size"])
    except (InputError, ValueError, KeyError, TypeError):
        return label
    return f"{label} (block {block})"
