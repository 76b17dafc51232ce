"""``qtts verify plan``: fidelity of an execution plan against the torch fp32 reference."""

from __future__ import annotations

import json

COMMAND = ("verify", "plan")
HELP = "compare a plan (e.g. an ONNX bundle) with the torch fp32 reference: codes, logits, vocoder SNR"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--model", required=True, help="snapshot directory or hub id (the plan's source checkpoint)"
    )
    parser.add_argument(
        "--plan", help="execution plan JSON, e.g. BUNDLE/plan.json (default: torch everywhere)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="torch weight dtype of the tested plan",
    )
    parser.add_argument("--frames", type=int, default=32, help="greedy frames to generate (default 32)")
    parser.add_argument("--text", help="text to speak (default: a fixed English sentence)")
    parser.add_argument("--threads", type=int, help="threads for both runtimes")
    parser.add_argument("--report", help="write the report to this .md (and the same stem .json)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of Markdown")


def run(args) -> int:
    from ..errors import InputError
    from ..verify import report_markdown, verify_plan, write_report

    if args.frames < 1:
        raise InputError(f"--frames must be >= 1, got {args.frames}")
    report = verify_plan(
        args.model, args.plan, frames=args.frames, text=args.text, threads=args.threads, dtype=args.dtype
    )
    print(json.dumps(report, indent=2, default=str) if args.json else report_markdown(report))
    if args.report:
        write_report(report, args.report)
    return 1 if report["passed"] is False else 0
