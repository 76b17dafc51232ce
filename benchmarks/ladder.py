"""The bits-vs-fidelity ladder: export and verify a list of weight recipes on one checkpoint.

Usage (PYTHONPATH=src, or an installed qtts)::

    python benchmarks/ladder.py -m MODEL --out DIR                     # the default recipes below
    python benchmarks/ladder.py -m MODEL --out DIR --recipe "int4 attn8=--weights int4 --mix talker.attn=int8"
    python benchmarks/ladder.py -m MODEL --out DIR --bench             # + RTF (qtts bench; a quiet machine)

Each recipe ``NAME=ARGS`` is ``qtts export onnx`` arguments (talker and predictor only; with
``--bench`` the vocoder is exported once and borrowed), verified with ``qtts verify plan --frames
N``; the table lists bits per streamed weight (from the graphs), talker- and predictor-logit SNR
(teacher-forced, min / median), greedy frame agreement, bundle size and, with ``--bench``, RTF.
Random weights test the method, not the real model: run it (or ``qtts verify plan``) on your
real weights. Every step is a subprocess, so one recipe's memory is gone before the next.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

DEFAULT_RECIPES = (
    "int8=--weights int8",
    "int4=--weights int4",
    "int4 mse=--weights int4 --repair mse",
    "int4 awq+mse=--weights int4 --repair awq,mse",
    "int4 talker, int8 predictor=--talker-weights int4 --predictor-weights int8",
    "int4, talker attn int8=--weights int4 --mix talker.attn=int8",
    "int4, talker first4+last4 int8=--weights int4 --mix talker.first4=int8,talker.last4=int8",
    "int4, head + predictor heads 9-15 int8=--weights int4 --mix talker.head=int8,predictor.heads9-15=int8",
    "int4 awq+mse, predictor int8=--weights int4 --predictor-weights int8 --repair awq,mse",
    "int8 rotate=--weights int8 --repair rotate",
    "int4 rotate=--weights int4 --repair rotate",
    "int4 rotate, talker attn int8=--weights int4 --mix talker.attn=int8 --repair rotate",
    "int4 talker rotate, int8 predictor=--talker-weights int4 --predictor-weights int8 --repair rotate",
)
NOTE = ("Random weights test the method, not the real model; run `qtts verify plan` on your real weights "
        "(plus greedy-code agreement over a few sentences) to see these rows for the real model.")  # fmt: skip


def _qtts(args: list, log) -> None:
    cmd = [sys.executable, "-m", "qtts", *args]
    print("$ qtts " + " ".join(shlex.quote(a) for a in args), flush=True)
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode not in (0, 1):  # verify exits 1 for a failed gate: still a row
        raise SystemExit(f"qtts {args[0]} {args[1] if len(args) > 1 else ''} failed (exit {proc.returncode}); see the log")


def _size_mb(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs) / 1e6


def parse_recipe(text: str) -> tuple[str, list]:
    name, eq, args = text.partition("=")
    if not eq or not name.strip():
        raise SystemExit(f"--recipe {text!r}: expected NAME=EXPORT ARGS, e.g. 'int4=--weights int4'")
    return name.strip(), shlex.split(args)


def run_recipe(opts, name: str, args: list, log, vocoder: str | None) -> dict:
    folder = os.path.join(opts.out, name.replace(" ", "_").replace(",", "").replace("+", "p"))
    extra = ["--vocoder-from", vocoder] if vocoder else []
    _qtts(["export", "onnx", "-m", opts.model, "-o", folder, *args, "--components", "talker", "predictor",
           "--no-batch-graphs", *extra, "--force"], log)  # fmt: skip
    report = os.path.join(folder, "verify.md")
    _qtts(["verify", "plan", "-m", opts.model, "--plan", os.path.join(folder, "plan.json"),
           "--frames", str(opts.frames), "--report", report], log)  # fmt: skip
    with open(report[:-3] + ".json", encoding="utf-8") as fh:
        row = json.load(fh)
    row.update(name=name, bundle_mb=_size_mb(folder), plan_path=os.path.join(folder, "plan.json"))
    return row


def _bench(opts, rows: list, log) -> None:
    out = os.path.join(opts.out, "bench.json")
    args = ["bench", "-m", opts.model, "--frames", str(opts.bench_frames), "--json", out]
    for row in rows:
        args += ["--plan", row["plan_path"]]
    _qtts(args, log)
    with open(out, encoding="utf-8") as fh:
        results = json.load(fh)["results"]
    for row, res in zip(rows, results):
        row["rtf"] = res.get("rtf")


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(rows: list) -> str:
    lines = ["| recipe | bits / streamed weight | talker-logit SNR dB min / median | predictor-logit SNR dB min / median "
             "| greedy frames equal | code 0 top-1 (TF) | codebooks 1-15 | bundle MB | RTF |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        bits = ((r.get("weights") or {}).get("per_frame") or {}).get("bits_per_weight")
        lines.append(
            f"| {r['name']} | {_f(bits, '{:.2f}')} | {_f(r['talker_logit_snr_db_min'])} / "
            f"{_f(r['talker_logit_snr_db_median'])} | {_f(r['predictor_logit_snr_db_min'])} / "
            f"{_f(r['predictor_logit_snr_db_median'])} | {_f(100 * r['greedy_equal_rate'], '{:.0f} %')} | "
            f"{_f(100 * r['code0_top1_agreement'], '{:.0f} %')} | {_f(100 * r['codebooks_1_15_agreement'], '{:.0f} %')} | "
            f"{r['bundle_mb']:.0f} | {_f(r.get('rtf'), '{:.2f}')} |"
        )
    return "\n".join(lines + ["", NOTE])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="checkpoint folder")
    ap.add_argument("--out", required=True, help="folder for the bundles, reports and the log")
    ap.add_argument("--recipe", action="append", metavar="NAME=ARGS", help="a recipe (repeatable; default: the ladder)")
    ap.add_argument("--frames", type=int, default=16, help="verify frames (default 16)")
    ap.add_argument("--bench", action="store_true", help="also qtts bench every recipe (RTF; needs a quiet machine)")
    ap.add_argument("--bench-frames", type=int, default=64, help="bench frames (default 64)")
    ap.add_argument("--json", help="write the rows to this JSON file")
    opts = ap.parse_args(argv)
    os.makedirs(opts.out, exist_ok=True)
    recipes = [parse_recipe(r) for r in opts.recipe or DEFAULT_RECIPES]
    rows = []
    with open(os.path.join(opts.out, "ladder.log"), "a", encoding="utf-8") as log:
        vocoder = None
        if opts.bench:
            vocoder = os.path.join(opts.out, "_vocoder")
            _qtts(["export", "onnx", "-m", opts.model, "-o", vocoder, "--components", "vocoder", "--force"], log)
        for name, args in recipes:
            rows.append(run_recipe(opts, name, args, log, vocoder))
            print(table(rows[-1:]).splitlines()[2], flush=True)
        if opts.bench:
            _bench(opts, rows, log)
    print(table(rows))
    if opts.json:
        with open(opts.json + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2, default=str)
        os.replace(opts.json + ".tmp", opts.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
