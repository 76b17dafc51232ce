"""``qtts export vocoder``: the stateful vocoder step -> ONNX (fixed shapes), checked with onnxruntime."""

from __future__ import annotations

import os

COMMAND = ("export", "vocoder")
HELP = "export the stateful streaming vocoder step (B frames per call) to ONNX and verify it"


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="snapshot directory or hub id")
    parser.add_argument("--codes-length", type=int, required=True, metavar="B", help="frames per step")
    parser.add_argument("-o", "--output", required=True, help="output .onnx file")
    parser.add_argument(
        "--frames", type=int, default=None, help="frames for the onnxruntime check (default max(100, 3B))"
    )
    parser.add_argument("--gate", type=float, default=80.0, help="minimum onnxruntime SNR in dB (default 80)")
    parser.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")


def run(args) -> int:
    from ..errors import InputError
    from ..export.vocoder import export_vocoder_onnx, report_text, verify_onnx
    from ..plan import plan_snippet

    if args.codes_length < 1:
        raise InputError(f"--codes-length must be >= 1, got {args.codes_length}")
    if not args.output.endswith(".onnx"):
        raise InputError(f"-o {args.output}: the output must be an .onnx file")
    report = export_vocoder_onnx(args.model, args.codes_length, args.output)
    print(report_text(report))
    ok = not report["kv_concat"]
    if report["risky_ops"]:
        print("WARNING: ops the RKNN converter is known to choke on:", ", ".join(report["risky_ops"]))
    if not args.no_verify:
        frames = args.frames or max(100, 3 * args.codes_length)
        snr = verify_onnx(args.model, report["path"], frames=frames)
        ok = ok and snr >= args.gate
        print(f"onnxruntime stepwise vs torch offline decode ({frames} frames): SNR {snr:.1f} dB "
              f"(gate {args.gate:g}) {'ok' if snr >= args.gate else 'FAIL'}")  # fmt: skip
    print("plan snippet:")
    print(plan_snippet("vocoder", "onnx", {"main": os.path.basename(report["path"])}))
    return 0 if ok else 1
