#!/usr/bin/env python3
"""What batch invariance costs a batched engine: every step on an even number of rows, or not.

Opens ``--plan`` (a bundle with batch graphs) on ``--model`` as a batched engine (``max_batch`` 4)
and runs ``--streams`` streams together through the batch loop for ``--frames`` frames, alternately
with the batch backend's even-row rule on (the product: an odd batch gets an idle talker row and a
repeated predictor row) and off (rows as they come: a row's last bits then depend on its batch
mates), ``--rounds`` times each. Prints the median ms per step of each and their ratio. With an
even ``--streams`` the two are the same computation.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/even_rows.py --model /tmp/full06cv \\
        --plan ~/.cache/qtts/bundles/<key>-fast-<hash>/plan.json --streams 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from _common import add_batch_arguments, batch_requests  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(p, frames=48)
    p.add_argument("--plan", required=True, help="plan.json of a bundle with batch graphs")
    args = p.parse_args(argv)
    if not 1 <= args.streams <= 4:
        p.error("--streams must be 1-4 (the engine has 4 rows)")

    import qtts.backends.onnx_batch as onnx_batch
    from qtts.backends import open as open_parts
    from support.batch_util import run_batch

    parts = open_parts(args.model, plan=args.plan, threads=args.threads, max_batch=4)
    reqs = batch_requests(parts, args.streams, args.frames)
    even = onnx_batch._even
    ms = {"rows as they come": [], "even rows (the product)": []}
    for _ in range(args.rounds):
        for name, rule in zip(ms, (lambda n: n, even)):
            onnx_batch._even = rule
            t0 = time.perf_counter()
            run_batch(parts.backend, {0: reqs})
            ms[name].append((time.perf_counter() - t0) / args.frames * 1e3)
    onnx_batch._even = even
    for name, v in ms.items():
        print(f"{args.streams} stream(s), {name}: {statistics.median(v):.1f} ms/step "
              f"(median of {len(v)}; {min(v):.1f}-{max(v):.1f})")  # fmt: skip
    a, b = (statistics.median(v) for v in ms.values())
    print(f"even / as they come: {b / a:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
