"""``qtts export onnx``: talker, code predictor, text projection, tables and speech decoder -> a bundle."""

from __future__ import annotations

import json
import time

COMMAND = ("export", "onnx")
HELP = "export a checkpoint to an onnxruntime bundle (graphs, tables, plan.json, manifest.json)"


def add_arguments(parser) -> None:
    from ..export.onnx import COMPONENTS, PRECISIONS, PREDICTOR_MODES
    from ..export.quantize import DEFAULT_BLOCK_SIZE

    parser.add_argument("--model", required=True, help="snapshot directory or hub id")
    parser.add_argument("-o", "--out", required=True, help="bundle directory to write")
    parser.add_argument(
        "--weights", choices=PRECISIONS, default="fp32",
        help="weight precision of talker and code predictor (default fp32)",
    )  # fmt: skip
    parser.add_argument("--talker-weights", choices=PRECISIONS, help="override --weights for the talker")
    parser.add_argument(
        "--predictor-weights", choices=PRECISIONS, help="override --weights for the code predictor"
    )
    parser.add_argument(
        "--block-size", type=int, choices=(32, 64, 128), default=DEFAULT_BLOCK_SIZE,
        help=f"MatMulNBits block size (default {DEFAULT_BLOCK_SIZE}: fastest; 32: most faithful)"
    )
    parser.add_argument(
        "--predictor-mode", choices=PREDICTOR_MODES, default="frame",
        help="frame: 15 steps + sampling fused in one graph (fastest); step: one graph run per code",
    )  # fmt: skip
    parser.add_argument(
        "--components",
        nargs="+",
        choices=COMPONENTS,
        default=list(COMPONENTS),
        help="what to export (default all)",
    )
    parser.add_argument(
        "--vocoder-first", type=int, default=2, help="codes per call of the first decoder step"
    )
    parser.add_argument(
        "--speech-decoder-from", metavar="BUNDLE", help="reuse the speech decoder artifacts of another bundle"
    )
    parser.add_argument("--vocoder-main", type=int, default=8, help="codes per call of the main decoder step")


def run(args) -> int:
    from ..export.onnx import ExportOptions, export_bundle

    opts = ExportOptions(
        talker=args.talker_weights or args.weights,
        predictor=args.predictor_weights or args.weights,
        block_size=args.block_size,
        predictor_mode=args.predictor_mode,
        vocoder_first=args.vocoder_first,
        vocoder_main=args.vocoder_main,
        components=tuple(args.components),
        vocoder_from=args.speech_decoder_from,
    )
    t0 = time.perf_counter()
    plan = export_bundle(args.model, args.out, opts)
    print(f"exported {', '.join(plan)} to {args.out} in {time.perf_counter() - t0:.1f} s")
    print(f"plan ({args.out}/plan.json):")
    print(json.dumps(plan, indent=2, sort_keys=True))
    return 0
