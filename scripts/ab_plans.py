#!/usr/bin/env python3
"""Interleaved A/B of execution plans in one process (less drift than separate `qtts bench` runs).

    .venv/bin/python scripts/ab_plans.py --model DIR --plan A/plan.json --plan B/plan.json [--runs 4]
    .venv/bin/python scripts/ab_plans.py --model DIR --plan A/plan.json --pipelined [--vocoder-threads 1]

Every plan is loaded once and warmed up; then the plans take turns (the order flips every round)
generating ``--frames`` frames with streaming decode (2 frames, then 8). Prints per-run talker /
predictor / vocoder ms per frame and the median RTF. ``--pipelined`` instead compares, for each
plan, the serial loop with a vocoder on a second thread fed through a queue.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time

import numpy as np

from qtts.backends import open as open_components
from qtts.bench import BenchOptions, _loop_params, _one_run
from qtts.errors import InputError, QttsError
from qtts.generate import generate
from qtts.verify import reference_prompt


def pipelined_run(parts, prompt, speaker, lp, decoder) -> tuple[float, float]:
    """(RTF, TTFA s) with decoding on a worker thread; chunks of 2 frames, then 8."""
    chunks: queue.Queue = queue.Queue()
    ttfa: list[float] = []
    t0 = time.perf_counter()

    def worker():
        while (item := chunks.get()) is not None:
            decoder.decode(item)
            ttfa.append(time.perf_counter() - t0)

    thread = threading.Thread(target=worker)
    thread.start()
    pending, sent, frames = [], 0, 0
    for codes in generate(parts.backend, prompt, lp, speaker):
        pending.append(codes)
        frames += 1
        if len(pending) >= (2 if sent == 0 else 8):
            chunks.put(np.asarray(pending, dtype=np.int64))
            pending, sent = [], sent + 1
    if pending:
        chunks.put(np.asarray(pending, dtype=np.int64))
    chunks.put(None)
    thread.join()
    return (time.perf_counter() - t0) / (frames * 0.08), ttfa[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--plan", action="append", required=True)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="talker / predictor (and serial vocoder) threads")
    ap.add_argument("--pipelined", action="store_true", help="serial vs vocoder on a second thread")
    ap.add_argument("--vocoder-threads", type=int, default=2, help="threads of the pipelined vocoder")
    args = ap.parse_args()
    opts = BenchOptions(threads=args.threads)
    loaded = []
    for plan in args.plan:
        parts = open_components(args.model, plan=plan, threads=args.threads)
        prompt, speaker = reference_prompt(parts, opts.text)
        _one_run(parts, prompt, speaker, _loop_params(parts.config, 4, opts.seed), opts)  # warm-up
        vocoder = open_components(args.model, plan=plan, threads=args.vocoder_threads).vocoder if args.pipelined else None
        loaded.append((plan, parts, prompt, speaker, vocoder))
    rows: dict[str, list] = {}
    for i in range(args.runs):
        for plan, parts, prompt, speaker, vocoder in loaded if i % 2 == 0 else loaded[::-1]:
            lp = _loop_params(parts.config, args.frames, opts.seed)
            r = _one_run(parts, prompt, speaker, lp, opts)
            rows.setdefault(plan, []).append(
                (r["talker_ms"], r["predictor_ms"], r["vocoder_ms"], r["total_s"] / r["audio_s"], r["ttfa_ms"])
            )
            if vocoder is not None:
                rtf, ttfa = pipelined_run(parts, prompt, speaker, lp, vocoder.stream())
                rows.setdefault(plan + " (pipelined)", []).append((np.nan, np.nan, np.nan, rtf, 1000 * ttfa))
    for name, runs in rows.items():
        a = np.array(runs)
        print(f"{name}\n  talker {np.round(a[:, 0], 1)}  predictor {np.round(a[:, 1], 1)}  "
              f"vocoder {np.round(a[:, 2], 1)}  RTF {np.round(a[:, 3], 3)} (median {np.median(a[:, 3]):.3f})  "
              f"TTFA ms {np.round(a[:, 4])}")  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except (InputError, QttsError) as exc:
        sys.exit(f"ab_plans: {exc}")
