"""``qtts random-checkpoint``: write a random-weight snapshot in the real Qwen3-TTS layout."""

from __future__ import annotations

import os
import time

COMMAND = ("random-checkpoint",)
HELP = "write a random-weight Qwen3-TTS snapshot (real layout and ids) for tests and benchmarks"


def add_arguments(parser) -> None:
    from ..random_checkpoint import DTYPES, KINDS, LAYOUTS, SIZES

    parser.add_argument("out", help="output directory (new or empty)")
    parser.add_argument("--size", choices=SIZES, default="tiny", help="tiny widths, or the real dimensions")
    parser.add_argument("--kind", choices=KINDS, default="base", help="checkpoint kind (default: base)")
    parser.add_argument(
        "--layout", choices=LAYOUTS, default="0.6b", help="0.6b or 1.7b layout (default: 0.6b)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="copy the real Qwen2 vocab.json + merges.txt from DIR (default: a byte-level stand-in)",
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="weight dtype (default: float32)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it is not empty")


def run(args) -> int:
    from ..random_checkpoint import write_random_checkpoint

    t0 = time.perf_counter()
    out = write_random_checkpoint(
        args.out,
        size=args.size,
        kind=args.kind,
        layout=args.layout,
        seed=args.seed,
        tokenizer_dir=args.tokenizer,
        dtype=args.dtype,
        overwrite=args.overwrite,
    )
    total = 0
    for root, _, files in os.walk(out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(
        f"wrote {args.size} {args.kind} ({args.layout} layout, {args.dtype}, seed {args.seed}) to {out}: "
        f"{total / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s"
    )
    print("random weights: the model makes noise, not speech")
    return 0
