#!/usr/bin/env python3
"""Peak RSS of one plan in a fresh process: load, warm up, one streamed run (pipelined by default).

    PYTHONPATH=src .venv/bin/python benchmarks/perf/plan_rss.py --model DIR --plan plan.json [--frames 16] [--serial]
"""

from __future__ import annotations

import argparse

from qtts.backends import open as open_components
from qtts.tools.bench import BenchOptions, one_run, rss_mb, window_peak_rss_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serial", action="store_true")
    args = ap.parse_args()
    opts = BenchOptions(threads=args.threads, pipeline=not args.serial)
    parts = open_components(args.model, plan=args.plan, threads=args.threads)
    loaded = rss_mb()
    r = one_run(parts, args.frames, opts)
    print(f"{args.plan}: RSS after load {loaded:.0f} MB, after run {rss_mb():.0f} MB, peak {window_peak_rss_mb():.0f} MB "
          f"(RTF {r['total_s'] / r['audio_s']:.2f}, {r['frames']} frames)")


if __name__ == "__main__":
    main()
