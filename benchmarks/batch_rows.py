#!/usr/bin/env python3
"""Are a plan's batched rows bitwise those of one stream? (the fact behind "codes equal alone").

Opens ``--plan`` twice on ``--model``: a one-stream engine and a batched one (``max_batch`` 4).
Three requests (x-vector and ICL voices, greedy and seeded sampling) are prefilled on both and
stepped side by side for ``--steps`` frames: per step it prints whether every row's talker logits
and predictor codes equal the one-stream ones. Then the batched predictor graph alone, for row
sets of 1-4 rows (also the same row twice), against one-row calls. Exit 0 when everything was
bitwise equal, 1 otherwise (a runtime whose batched kernels depend on the row count, e.g. ONNX
int4 MatMulNBits on AVX2).

    PYTHONPATH=src .venv/bin/python benchmarks/batch_rows.py --model /tmp/full06 --plan /tmp/bt/int8/plan.json
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from qtts.backends import open as open_parts  # noqa: E402
from qtts.engine.batching import advance_rows, predict_rows  # noqa: E402
from qtts.engine.generate import PredictorSampler, advance, next_code0, predict, prefill, release  # noqa: E402
from support.batch_util import TEXTS, request, voices  # noqa: E402


def _requests(parts) -> list:
    xv, icl = voices(parts.config)
    return [request(parts, "a", TEXTS[0], 32, voice=xv), request(parts, "b", TEXTS[1], 32, voice=icl),
            request(parts, "c", TEXTS[2], 32, voice=xv, greedy=False, seed=3)]  # fmt: skip


def side_by_side(single, batched, steps: int) -> bool:
    reqs = _requests(single)
    one = [prefill(single.backend, r.prompt, r.params, r.speaker) for r in reqs]
    many = [prefill(batched.backend, r.prompt, r.params, r.speaker) for r in reqs]
    ok = all(np.array_equal(a.logits, b.logits) for a, b in zip(one, many))
    print(f"prefill logits equal: {ok}")
    for step in range(steps):
        picks = [next_code0(s, r.params) for s, r in zip(one, reqs)]
        frames = [predict(single.backend, s, c, r.params, u) for s, (c, u), r in zip(one, picks, reqs)]
        picks = [next_code0(s, r.params) for s, r in zip(many, reqs)]
        rows = predict_rows(batched.backend, many, [c for c, _ in picks], [r.params for r in reqs],
                            [u for _, u in picks])  # fmt: skip
        same_codes = [bool(np.array_equal(a, b)) for a, b in zip(frames, rows)]
        for s, f in zip(one, frames):
            advance(single.backend, s, f)
        advance_rows(batched.backend, many, frames)  # the same frames, so the talkers stay comparable
        diff = [float(np.abs(a.logits - b.logits).max()) for a, b in zip(one, many)]
        print(f"step {step}: codes equal {same_codes}, talker logits max |diff| {diff}")
        ok = ok and all(same_codes) and max(diff) == 0.0
    for state in many:
        release(batched.backend, state)
    return ok


def predictor_rows(single, batched) -> bool:
    reqs = _requests(single)
    states = [prefill(single.backend, r.prompt, r.params, r.speaker) for r in reqs]
    picks = [next_code0(s, r.params) for s, r in zip(states, reqs)]
    hidden = np.stack([s.hidden for s in states])
    code0 = np.array([c for c, _ in picks])
    uniforms = np.stack([u for _, u in picks])
    params = [PredictorSampler(r.params.predictor) for r in reqs]
    be = batched.backend
    alone = [be.predict_frames(hidden[i : i + 1], code0[i : i + 1], params[i : i + 1], uniforms[i : i + 1])[0]
             for i in range(len(reqs))]  # fmt: skip
    ok = True
    for rows in ([0, 1], [0, 1, 2], [0, 0], [0, 0, 0, 0], [1, 1]):
        out = be.predict_frames(hidden[rows], code0[rows], [params[i] for i in rows], uniforms[rows])
        same = [bool(np.array_equal(out[j], alone[i])) for j, i in enumerate(rows)]
        print(f"predictor rows {rows}: equal to one-row calls {same}")
        ok = ok and all(same)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="snapshot dir")
    p.add_argument("--plan", required=True, help="plan.json of a bundle with batch graphs")
    p.add_argument("--steps", type=int, default=3, help="frames stepped side by side (default 3)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    single = open_parts(args.model, plan=args.plan, threads=args.threads)
    batched = open_parts(args.model, plan=args.plan, threads=args.threads, max_batch=4)
    ok = side_by_side(single, batched, args.steps)
    ok = predictor_rows(single, batched) and ok
    print("bitwise equal" if ok else "NOT bitwise equal")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
