#!/usr/bin/env python3
"""Per-row cost of the batched talker and predictor at B = 1, 2, 4, 8 streams, per plan.

For each ``--plan`` (a bundle's plan.json with batch graphs; several plans: one table) it opens
a batched engine (``max_batch`` = the largest B), prefills B streams and times ``--steps`` batched
talker steps (``advance_rows``) and batched predictor frames (``predict_rows``) at each B. It
prints, per plan and B: the median ms per call, ms per row (call / B) and the per-row speed-up
over B = 1 (how well that plan's rows batch: 1.0 = no gain, B = perfect). EOS is blocked so every
row steps every time. Name the CPU and its load next to any figure (the script prints both).

    PYTHONPATH=src python benchmarks/perf/row_cost.py --model SNAPSHOT --plan int8/plan.json --plan int4/plan.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

from qtts.backends import open as open_parts  # noqa: E402
from qtts.engine.batching import advance_rows, predict_rows  # noqa: E402
from qtts.engine.generate import next_code0, prefill, release  # noqa: E402
from support.batch_util import TEXTS, request, voices  # noqa: E402


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def time_rows(parts, rows: int, steps: int) -> dict:
    """Median ms of one batched talker step and one batched predictor frame over ``rows`` streams."""
    speakers = parts.config.speakers  # a CustomVoice checkpoint: its first speaker
    who = {"speaker": speakers[0]} if speakers else {"voice": voices(parts.config)[0]}
    reqs = [request(parts, f"r{i}", TEXTS[i % len(TEXTS)], steps + 4, greedy=False, seed=i,
                    min_frames=steps + 4, **who) for i in range(rows)]  # fmt: skip
    states = [prefill(parts.backend, r.prompt, r.params, r.speaker) for r in reqs]
    talker, predictor = [], []
    try:
        for _ in range(steps + 1):  # the first step warms up and is dropped
            picks = [next_code0(s, r.params) for s, r in zip(states, reqs)]
            t0 = time.perf_counter()
            frames = predict_rows(parts.backend, states, [c for c, _ in picks], [r.params for r in reqs],
                                  [u for _, u in picks])  # fmt: skip
            t1 = time.perf_counter()
            advance_rows(parts.backend, states, frames)
            t2 = time.perf_counter()
            predictor.append(t1 - t0)
            talker.append(t2 - t1)
    finally:
        for s in states:
            release(parts.backend, s)
    return {"talker_ms": 1e3 * statistics.median(talker[1:]), "predictor_ms": 1e3 * statistics.median(predictor[1:])}


def row_costs(model: str, plan: str, sizes: tuple, steps: int, threads: int) -> list:
    parts = open_parts(model, plan=plan, threads=threads, max_batch=max(sizes))
    out = []
    for b in sizes:
        t = time_rows(parts, b, steps)
        out.append({"plan": plan, "rows": b, **t, "talker_row_ms": t["talker_ms"] / b,
                    "predictor_row_ms": t["predictor_ms"] / b})  # fmt: skip
    base = out[0]
    for r in out:
        r["talker_gain"] = base["talker_row_ms"] / r["talker_row_ms"]
        r["predictor_gain"] = base["predictor_row_ms"] / r["predictor_row_ms"]
    return out


def table(rows: list) -> str:
    lines = ["| plan | B | talker ms/step | talker ms/row | row gain | predictor ms/frame | predictor ms/row | row gain |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['plan']} | {r['rows']} | {r['talker_ms']:.1f} | {r['talker_row_ms']:.1f} | "
                     f"{r['talker_gain']:.2f}x | {r['predictor_ms']:.1f} | {r['predictor_row_ms']:.1f} | "
                     f"{r['predictor_gain']:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="snapshot dir")
    p.add_argument("--plan", action="append", required=True, help="plan.json of a bundle with batch graphs (repeat)")
    p.add_argument("--rows", default="1,2,4,8", help="batch sizes (default 1,2,4,8)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per size (default 12)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    try:
        sizes = tuple(sorted({int(x) for x in args.rows.split(",")}))
    except ValueError:
        print(f"--rows {args.rows!r}: comma-separated integers, e.g. 1,2,4,8", file=sys.stderr)
        return 2
    if not sizes or sizes[0] < 1:
        print("--rows: sizes must be >= 1", file=sys.stderr)
        return 2
    rows = []
    for plan in args.plan:
        rows += row_costs(args.model, plan, sizes, args.steps, args.threads)
    print(f"CPU: {_cpu()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; threads {args.threads}")
    print(table(rows))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"cpu": _cpu(), "rows": rows}, fh, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
