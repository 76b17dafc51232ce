#!/usr/bin/env python3
"""What batch invariance costs a batched torch engine: linear layers in groups of 3 rows, or all rows in one call.

Opens ``--model`` with the torch plan as a batched engine (``max_batch`` 4) and runs ``--streams``
streams together through the batch loop for ``--frames`` frames, alternately with the batch seam's
:class:`qtts.backends.torch_rows.RowLinear` (the product: every linear call has 3 rows, so
a row's result does not depend on the row count) and without it (one call of all rows: MKL picks
its kernel by the row count, and a row's last bits depend on its batch mates),
``--rounds`` times each. Prints the median ms per step (talker step + predictor frame) of each and
their ratio.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/torch_rows.py --model /path/to/0.6B --streams 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from _common import add_batch_arguments, batch_requests  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(p, frames=12)
    args = p.parse_args(argv)
    if not 1 <= args.streams <= 4:
        p.error("--streams must be 1-4 (the engine has 4 rows)")

    import qtts.backends.torch_rows as torch_rows
    from qtts.backends import open as open_parts
    from support.batch_util import run_batch

    parts = open_parts(args.model, plan="torch", threads=args.threads, max_batch=4, parts=("generation",))
    reqs = batch_requests(parts, args.streams, args.frames)
    product = torch_rows.RowLinear
    ms = {"one call of all rows": [], "groups of 3 rows (the product)": []}
    run_batch(parts.backend, {0: reqs})  # warm-up: first-call allocations, oneDNN primitive caches
    for _ in range(args.rounds):
        for name, mode in zip(ms, (contextlib.nullcontext, product)):
            torch_rows.RowLinear = mode  # what the backend's batch seam enters
            t0 = time.perf_counter()
            _, stats = run_batch(parts.backend, {0: reqs})
            steps = sum(1 for s in stats if s.predicted)
            ms[name].append((time.perf_counter() - t0 - sum(s.prefill_s for s in stats)) / steps * 1e3)
    torch_rows.RowLinear = product
    for name, v in ms.items():
        print(f"{args.streams} stream(s), {name}: {statistics.median(v):.1f} ms/step, min {min(v):.1f} "
              f"(median of {len(v)}; max {max(v):.1f})")  # fmt: skip
    (a, b), (c, d) = (statistics.median(v) for v in ms.values()), (min(v) for v in ms.values())
    print(f"groups / one call: {b / a:.3f} (medians), {d / c:.3f} (minima)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
