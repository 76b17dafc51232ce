#!/usr/bin/env python3
"""Interleaved A/B of execution plans in one process (less drift than separate `qtts bench` runs).

    .venv/bin/python benchmarks/ab_plans.py --model DIR --plan A/plan.json --plan B/plan.json [--runs 4]
    .venv/bin/python benchmarks/ab_plans.py --model DIR --plan A/plan.json --pipelined [--vocoder-threads 1]
    .venv/bin/python benchmarks/ab_plans.py --model DIR --plan A/plan.json --pipelined \
        --generation-threads 2 1 --vocoder-threads 2 1      # every split of the two cores
    .venv/bin/python benchmarks/ab_plans.py --model DIR --plan fast --pipelined --fp32-vocoder-too
        # the default against itself with QTTS_BF16_VOCODER=0 (the bundle's fp32 ONNX vocoder)
    .venv/bin/python benchmarks/ab_plans.py --model DIR --plan fast --pipelined --spin-us 0 5
        # onnxruntime's workers spinning at most 0 / 5 us between ops (QTTS_SPIN_US), one variant each
    .venv/bin/python benchmarks/ab_plans.py --model DIR --pipelined-only \
        --plan OLD/plan.json@QTTS_BF16_VOCODER=0,QTTS_SPIN_US=0 --plan fast
        # a plan opened under its own environment (here: an older bundle as that day's default ran it)
    .venv/bin/python benchmarks/ab_plans.py --model DIR --plan fast --pipelined-only --silent-vocoder-too
        # each pipelined variant also with a vocoder that costs nothing (silence of the right
        # length): the ceiling any vocoder work could reach on this CPU

Every plan is loaded once and warmed up; then the plans take turns (the order flips every round)
generating ``--frames`` frames with streaming decode (the schedule of qtts.engine.stream.Chunker: 1, 2,
4, 8, ...), serial. Prints per-run talker / predictor / vocoder ms per frame, the median RTF and
TTFA. ``--pipelined`` adds, for each plan, the two-thread pipeline of ``TTS.stream``
(qtts.engine.stream.run_ahead) as its own interleaved variant.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys

import numpy as np

from qtts.backends import open as open_components
from qtts.backends.onnx import SPIN_ENV
from qtts.config import SAMPLES_PER_FRAME
from qtts.errors import InputError, QttsError
from qtts.kernels import LAYER_SPIN_ENV, set_layer_threads
from qtts.plans.plan import BF16_VOCODER_ENV
from qtts.tools.bench import BenchOptions, one_run, warm_up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--plan", action="append", required=True)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="talker / predictor (and serial vocoder) threads")
    ap.add_argument("--pipelined", action="store_true", help="serial vs the pipeline of TTS.stream (qtts.engine.stream)")
    ap.add_argument("--pipelined-only", action="store_true", help="only the pipeline of TTS.stream (no serial runs)")
    ap.add_argument("--vocoder-threads", type=int, nargs="+", default=[None],
                    help="threads of the pipelined vocoder; several values: one pipelined variant each (default --threads)")
    ap.add_argument("--generation-threads", type=int, nargs="+", default=[None],
                    help="threads of the pipelined talker / predictor; crossed with --vocoder-threads (default --threads)")
    ap.add_argument("--fp32-vocoder-too", action="store_true",
                    help="each plan also opened with QTTS_BF16_VOCODER=0: the bundle's fp32 ONNX vocoder")
    ap.add_argument("--silent-vocoder-too", action="store_true",
                    help="each pipelined variant also with a vocoder that decodes nothing (silence): the ceiling")
    ap.add_argument("--spin-us", type=int, nargs="+", default=[None],
                    help="each plan opened once per value of QTTS_SPIN_US (how long onnxruntime's idle workers spin, us)")
    args = ap.parse_args()
    if any(t is not None and t < 1 for t in [args.threads, *args.vocoder_threads, *args.generation_threads]):
        ap.error("--threads, --vocoder-threads and --generation-threads take counts >= 1")
    if any(us is not None and us < 0 for us in args.spin_us):
        ap.error("--spin-us takes microseconds >= 0")
    serial = BenchOptions(threads=args.threads, pipeline=False)
    args.pipelined = args.pipelined or args.pipelined_only
    variants = []
    switches = [None, "0"] if args.fp32_vocoder_too else [None]
    for spec, switch, us in [(p, s, us) for p in args.plan for s in switches for us in args.spin_us]:
        plan, env = _plan_env(spec)
        name = spec + (" [fp32 vocoder]" if switch else "") + (f" [spin {us} us]" if us is not None else "")
        with contextlib.ExitStack() as stack:
            flags = {BF16_VOCODER_ENV: switch, SPIN_ENV: None if us is None else str(us)}
            for key, value in {**env, **{k: v for k, v in flags.items() if v is not None}}.items():
                stack.enter_context(_env(key, value))
            variants += [(*v, env) for v in _plan_variants(args, name, plan, serial)]
    per_run = any(LAYER_SPIN_ENV in env for *_v, env in variants)  # else nothing to re-apply
    for _name, parts, opts, env in variants:  # warm-up
        if per_run:
            _layer_settings(env, args.threads)
        warm_up(parts, opts)
    rows: dict[str, list] = {}
    for i in range(args.runs):
        for name, parts, opts, env in variants if i % 2 == 0 else variants[::-1]:
            if per_run:
                _layer_settings(env, args.threads)
            r = one_run(parts, args.frames, opts)
            rows.setdefault(name, []).append((r["talker_ms"], r["predictor_ms"], r["vocoder_ms"],
                                              r["total_s"] / r["audio_s"], r["ttfa_ms"], r["foreign_cores"]))  # fmt: skip
    for name, runs in rows.items():
        a = np.array(runs)
        print(f"{name}\n  talker {np.round(a[:, 0], 1)}  predictor {np.round(a[:, 1], 1)}  "
              f"vocoder {np.round(a[:, 2], 1)}  RTF {np.round(a[:, 3], 3)} (median {np.median(a[:, 3]):.3f})  "
              f"TTFA ms {np.round(a[:, 4])} (median {np.median(a[:, 4]):.0f})  foreign cores {np.round(a[:, 5], 2)}")  # fmt: skip


def _plan_env(spec: str) -> tuple[str, dict]:
    """``PLAN@K=V,K2=V2`` -> (PLAN, {K: V, K2: V2}): the variables set while the plan is opened."""
    plan, _, tail = spec.rpartition("@") if "=" in spec.rpartition("@")[2] else (spec, "", "")
    pairs = [p.partition("=") for p in tail.split(",") if p]
    if any(not k or not eq for k, eq, _v in pairs):
        raise InputError(f"--plan {spec!r}: write the environment as PLAN@NAME=VALUE,NAME2=VALUE2")
    return plan, {k: v for k, _eq, v in pairs}


def _layer_settings(env: dict, threads: int) -> None:
    """The DecoderLayer op's spin bound is one per process: a variant that names QTTS_LAYER_SPIN_US
    gets it re-applied before each of its runs (and the others the default back)."""
    with _env(LAYER_SPIN_ENV, env.get(LAYER_SPIN_ENV, os.environ.get(LAYER_SPIN_ENV, ""))):
        set_layer_threads(threads)


def _plan_variants(args, name: str, plan: str, serial: BenchOptions) -> list:
    """(name, parts, options) of ``plan``: serial (unless --pipelined-only), and each pipelined split."""
    parts = open_components(args.model, plan=plan, threads=args.threads)
    out = [] if args.pipelined_only else [(name + " (serial)", parts, serial)]
    opened = {args.threads: parts}
    for gt, vt in _splits(args) if args.pipelined else []:
        for t in (gt, vt):
            if t not in opened:
                opened[t] = open_components(args.model, plan=plan, threads=t)
        piped = dataclasses.replace(opened[gt], vocoder=opened[vt].vocoder)
        label, opts = f"{name} (pipelined, generation threads {gt}, vocoder threads {vt})", dataclasses.replace(serial, pipeline=True)
        out.append((label, piped, opts))
        if args.silent_vocoder_too:
            out.append((label + " [silent vocoder]", dataclasses.replace(piped, vocoder=_Silent(piped.vocoder)), opts))
    return out


@contextlib.contextmanager
def _env(name: str, value: str | None):
    """``name`` set to ``value`` for the block (None: left as it is)."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None and old is None:
            del os.environ[name]
        elif value is not None:
            os.environ[name] = old


class _Silent:
    """A vocoder whose streams return silence of the right length at once (warm-up and the rest
    pass through to the real one): the pipeline as if decoding cost nothing."""

    def __init__(self, inner):
        self._inner = inner

    def stream(self):
        return _SilentStream(self._inner.stream())

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _SilentStream:
    def __init__(self, inner):
        self._inner = inner

    def decode(self, codes):
        return np.zeros(len(codes) * SAMPLES_PER_FRAME, dtype=np.float32)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _splits(args) -> list[tuple[int, int]]:
    """(generation threads, vocoder threads) of every pipelined variant."""
    def pick(t):
        return args.threads if t is None else t

    return [(pick(gt), pick(vt)) for gt in args.generation_threads for vt in args.vocoder_threads]


if __name__ == "__main__":
    try:
        main()
    except (InputError, QttsError) as exc:
        sys.exit(f"ab_plans: {exc}")
