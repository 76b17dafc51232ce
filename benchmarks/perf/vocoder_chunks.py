#!/usr/bin/env python3
"""Vocoder cost per frame against the step size B (frames per call), interleaved in one process.

    PYTHONPATH=src .venv/bin/python benchmarks/perf/vocoder_chunks.py --model /work/ckpt/full06 \
        [--bs 1,2,4,8,16] [--threads 1] [--weights shared|plain|both] [--frames 16] [--rounds 3] \
        [--cache /work/perf/vocoder-steps]

Exports one ONNX vocoder step per B from the checkpoint (qtts.export.vocoder, cached in
``--cache``; a temporary directory by default) and runs it through the product's vocoder
(qtts.backends.onnx.OnnxVocoder, one stream per sample). ``shared``: the steps keep their weights
in one memory-mapped file with prepacking off, as every exported bundle does
(qtts.export.vocoder.share_step_weights); ``plain``: one self-contained graph per B with
prepacking (bundles exported before the shared file). Each sample decodes the same ``--frames``
random frames (a multiple of every B) with steps of one size; reports wall and CPU ms per frame
(CPU = work; wall/CPU > 1 at 2 threads = parallel speed-up).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402
from _common import interleaved, loadavg, report  # noqa: E402

from qtts.config import ModelConfig  # noqa: E402


def plain_steps(model: str, bs: list[int], cache: str) -> dict:
    """B -> path of a self-contained step graph (exported once into ``cache``)."""
    from qtts.export.vocoder import export_vocoder_onnx

    paths = {}
    for b in bs:
        path = os.path.join(cache, f"voc_b{b}.onnx")
        if not os.path.exists(path):
            print(f"  exporting the B={b} step to {path}", flush=True)
            export_vocoder_onnx(model, b, path)
        paths[b] = path
    return paths


def shared_steps(plain: dict, cache: str) -> dict:
    """B -> path of the same graphs with their weights moved into one shared file (a bundle's layout)."""
    from qtts.export.vocoder import SHARED_INDEX, share_step_weights

    directory = os.path.join(cache, "shared-" + "-".join(str(b) for b in plain))
    names = {b: os.path.basename(p) for b, p in plain.items()}
    if not os.path.exists(os.path.join(directory, SHARED_INDEX)):
        tmp = tempfile.mkdtemp(prefix=".shared-", dir=cache)
        for p in plain.values():
            shutil.copy(p, tmp)
        share_step_weights(tmp, sorted(names.values()))
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
    return {b: os.path.join(directory, n) for b, n in names.items()}


def variants(args, cache: str) -> dict:
    """Variant name -> OnnxVocoder with one step size."""
    from qtts.backends.onnx import OnnxVocoder

    bs = [int(x) for x in args.bs.split(",")]
    bad = [b for b in bs if b < 1 or args.frames % b]
    if bad:
        raise SystemExit(f"--frames {args.frames} must be a multiple of every B (not of {bad})")
    plain = plain_steps(args.model, bs, cache)
    kinds = ("shared", "plain") if args.weights == "both" else (args.weights,)
    paths = {"plain": plain, "shared": shared_steps(plain, cache) if "shared" in kinds else {}}
    out = {}
    for kind in kinds:
        for b in bs:
            vocoder = OnnxVocoder(paths[kind][b], threads=args.threads)
            if (vocoder.shared is not None) != (kind == "shared"):
                raise SystemExit(f"{paths[kind][b]}: expected {kind} weights")
            out[f"B={b} {kind}"] = (b, vocoder)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (the vocoder steps are exported from it)")
    ap.add_argument("--bs", default="1,2,4,8,16", help="comma-separated step sizes B")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per session")
    ap.add_argument("--weights", choices=("shared", "plain", "both"), default="shared",
                    help="one shared weight file without prepacking (bundles), one per graph, or both")
    ap.add_argument("--frames", type=int, default=16, help="frames per sample (a multiple of every B)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--cache", default=None, help="directory for the exported steps (default: a temporary one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or tmp
        os.makedirs(cache, exist_ok=True)
        run_variants(args, variants(args, cache))


def run_variants(args, vocoders: dict) -> None:
    size = ModelConfig.from_dir(args.model).speech_tokenizer.decoder_config.codebook_size
    codes = np.random.default_rng(0).integers(0, size, (args.frames, 16))
    runs, outs = {}, {}
    for name, (b, vocoder) in vocoders.items():

        def run(vocoder=vocoder, b=b):
            stream = vocoder.stream()
            return np.concatenate([stream.decode(codes[i : i + b]) for i in range(0, args.frames, b)])

        outs[name] = run()
        runs[name] = run
    first = next(iter(outs))
    for name, o in outs.items():
        print(f"  {name}: max abs diff vs {first}: {np.abs(o - outs[first]).max():.2e}")
    res = interleaved(runs, args.rounds)
    print(f"vocoder, {args.threads} threads, {args.frames} frames/sample, loadavg {loadavg()}")
    print(report(res, unit="ms/frame", scale=1.0 / args.frames))


if __name__ == "__main__":
    main()
