"""``qtts export qnn``: code-predictor and vocoder steps for Qualcomm QNN HTP (fp16) and a plan."""

from __future__ import annotations

COMMAND = ("export", "qnn")
HELP = "export the code-predictor step and the vocoder step for QNN HTP fp16, with a plan.json"


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="snapshot directory or hub id")
    parser.add_argument("-o", "--output", required=True, help="output directory (gets plan.json)")
    parser.add_argument(
        "--codes-length", type=int, default=4, metavar="B", help="vocoder frames per step (default 4)"
    )
    parser.add_argument("--soc-model", default="57", help="QNN soc_model for HTP fp16 (default 57 = SM8550)")


def run(args) -> int:
    from ..errors import InputError
    from ..export.qnn import export_qnn_bundle

    if args.codes_length < 1:
        raise InputError(f"--codes-length must be >= 1, got {args.codes_length}")
    out = export_qnn_bundle(args.model, args.output, args.codes_length, args.soc_model)
    print(f"code predictor step: {out['predictor']['path']} (ops: {', '.join(out['predictor']['ops'])})")
    print(f"vocoder step: {out['vocoder']['path']}")
    print(f"plan: {out['plan']}  (talker: torch; predictor and vocoder: qnn fp16)")
    print(f"check it: qtts verify plan --model {args.model} --plan {out['plan']}")
    return 0
