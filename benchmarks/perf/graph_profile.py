#!/usr/bin/env python3
"""onnxruntime kernel-time profile (per op type) of the talker step and the predictor frame.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/graph_profile.py [--bundle /work/ckpt/full06-int4] \
        [--threads 1] [--runs 10] [--pos 40]

Talker: one decode step at position ``--pos`` (KV bound in place, as the backend does);
predictor: one fused frame (15 steps + sampling). Prints ms per call per op type, node counts,
and the time outside the MatMulNBits kernels.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402


def profile_session(path: str, threads: int, run_fn, runs: int, extra_cfg: dict | None = None) -> tuple:
    import onnxruntime as ort

    from qtts.backends.onnx import session_options

    with tempfile.TemporaryDirectory() as tmp:
        so = session_options(threads)
        for k, v in (extra_cfg or {}).items():
            so.add_session_config_entry(k, v)
        so.enable_profiling, so.profile_file_prefix = True, os.path.join(tmp, "p")
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        state = run_fn(s, None)
        for _ in range(runs):
            run_fn(s, state)
        with open(s.end_profiling(), encoding="utf-8") as fh:
            ev = json.load(fh)
    per, count = collections.Counter(), collections.Counter()
    run_ms = [e["dur"] / 1000.0 for e in ev if e.get("name") == "model_run"][1:]
    for e in ev:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["args"]["op_name"]] += e["dur"] / 1000.0
            count[e["args"]["op_name"]] += 1
    n = runs + 1
    return {k: v / n for k, v in per.items()}, {k: v // n for k, v in count.items()}, float(np.median(run_ms))


def talker_runner(bundle: str, pos: int, hidden: int):
    from qtts.backends.onnx import KVBinding

    man = json.load(open(os.path.join(bundle, "manifest.json"), encoding="utf-8"))
    t = man["graphs"]["talker"]
    cos = np.load(os.path.join(bundle, man["runtime_files"]["rope_cos"]), mmap_mode="r")
    sin = np.load(os.path.join(bundle, man["runtime_files"]["rope_sin"]), mmap_mode="r")
    kv_len = min(256, len(cos))
    if pos >= kv_len:
        raise SystemExit(f"--pos {pos} must be below the KV length {kv_len}")
    cos, sin = np.ascontiguousarray(cos[:kv_len]), np.ascontiguousarray(sin[:kv_len])
    x = np.random.default_rng(0).standard_normal((1, 1, hidden)).astype(np.float32) * 0.1

    def run(s, state):
        if state is None:
            state = KVBinding(s, t["layers"], (1, t["kv_heads"], kv_len, t["head_dim"]), cos, sin, ["logits", "hidden"])
        state.run(x, pos)
        return state

    return run


def predictor_runner(hidden: int):
    rng = np.random.default_rng(0)
    feeds = {"hidden": rng.standard_normal((1, hidden)).astype(np.float32) * 0.1, "code0": np.array([5]),
             "uniforms": rng.random(15).astype(np.float32), "temperature": np.array([0.9], np.float32),
             "top_k": np.array([50]), "top_p": np.array([1.0], np.float32), "do_sample": np.array([True])}

    def run(s, state):
        s.run(["codes"], feeds)
        return True

    return run


def jobs(args) -> list:
    """(name, graph path, runner) for the talker step and the fused predictor frame of the bundle."""
    from qtts.plans.plan import load_plan

    plan = load_plan(os.path.join(args.bundle, "plan.json"))
    man = json.load(open(os.path.join(args.bundle, "manifest.json"), encoding="utf-8"))
    if man["graphs"]["predictor"].get("mode") != "frame" and not args.predictor:
        raise SystemExit(f"{args.bundle}: the predictor is not a fused frame graph; export the bundle with the default "
                         "predictor mode or pass --predictor FRAME.onnx")
    hidden = int(np.load(os.path.join(args.bundle, man["runtime_files"]["codec_embedding"]), mmap_mode="r").shape[1])
    return [("talker step", plan.get("talker").artifacts["main"], talker_runner(args.bundle, args.pos, hidden)),
            ("predictor frame", args.predictor or plan.get("predictor").artifacts["main"], predictor_runner(hidden))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default="/work/ckpt/full06-int4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--pos", type=int, default=40)
    ap.add_argument("--predictor", default=None, help="predictor graph path (default: the bundle's)")
    args = ap.parse_args(argv)
    for name, path, fn in jobs(args):
        per, count, run_ms = profile_session(path, args.threads, fn, args.runs)
        total = sum(per.values())
        mm = per.get("MatMulNBits", 0.0)
        print(f"{name} ({os.path.basename(path)}, {args.threads} threads): model_run {run_ms:.2f} ms, kernels {total:.2f} ms, "
              f"MatMulNBits {mm:.2f} ms ({100 * mm / total:.0f} %), other kernels {total - mm:.2f} ms, "
              f"outside kernels {run_ms - total:.2f} ms, {sum(count.values())} kernel calls")
        for op, ms in sorted(per.items(), key=lambda kv: -kv[1])[:14]:
            print(f"    {op:<30} {ms:7.3f} ms  {count[op]:4d} calls  {1000 * ms / max(count[op], 1):7.1f} us/call")


if __name__ == "__main__":
    main()
