"""``qtts export executorch``: the XNNPACK ``.pte`` bundle (its exporter: :mod:`qtts.export.executorch`)."""

from __future__ import annotations

import json
import os
import time

from .common import add_model, check_folder, command, hidden_alias, number

#: mirrors qtts.export.executorch.WEIGHTS (the parser must not import qtts.export)
WEIGHTS = ("fp32", "int8", "int4")


def register_et(ex) -> None:
    p = command(ex, "executorch", run_export_et, "export talker, predictor and vocoder steps to "
                "ExecuTorch XNNPACK .pte files with a plan.json (needs the [executorch] extra)")
    add_model(p, plan=False, dtype=False, threads=None)
    p.add_argument("-o", "--output", required=True, help="bundle folder to write (new or empty)")
    p.add_argument("--force", action="store_true", help="replace a non-empty folder (an older bundle) as a whole")
    p.add_argument("--weights", choices=WEIGHTS, default="fp32", help="talker, predictor and text projection "
                   "weights: fp32, int8 (8da8w) or int4 (8da4w, groups of 32); the vocoder stays fp32")
    p.add_argument("--max-len", type=number(lo=2), default=1024, metavar="N",
                   help="talker KV slots (prompt + frames) of the fixed-size cache (default 1024)")
    p.add_argument("--chunk-frames", type=number(lo=1), default=4, metavar="B",
                   help="vocoder frames per call of the exported step (default 4)")
    hidden_alias(p, "--codes-length", dest="chunk_frames", type=number(lo=1))


def run_export_et(args) -> int:
    from ..export.executorch import export_et_bundle

    check_folder(args.output)
    t0 = time.perf_counter()
    plan = export_et_bundle(args.model, args.output, args.weights, args.max_len, args.chunk_frames,
                            overwrite=args.force)  # fmt: skip
    print(f"exported talker, predictor and vocoder to {args.output} in {time.perf_counter() - t0:.1f} s")
    print(f"plan ({os.path.join(args.output, 'plan.json')}):")
    print(json.dumps(plan, indent=2, sort_keys=True))
    return 0
