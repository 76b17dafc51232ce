"""``qtts export rknn``: compile an exported ONNX vocoder step to .rknn (fp16) and check it in the simulator."""

from __future__ import annotations

COMMAND = ("export", "rknn")
HELP = "compile an ONNX vocoder step to .rknn (fp16, rknn-toolkit2 in .venv-rknn) with a simulator check"


def add_arguments(parser) -> None:
    from ..export.rknn import TARGETS

    parser.add_argument("--onnx", required=True, help="step exported by `qtts export vocoder`")
    parser.add_argument("--target", required=True, choices=TARGETS, help="Rockchip SoC (a .rknn is per SoC)")
    parser.add_argument("-o", "--output", default=None, help="output .rknn (default: <onnx>_<target>.rknn)")
    parser.add_argument("--frames", type=int, default=None, help="simulator check frames (default 3B)")
    parser.add_argument("--gate", type=float, default=50.0, help="minimum simulator SNR vs onnxruntime (dB)")
    parser.add_argument("--no-verify", action="store_true", help="skip the simulator check")
    parser.add_argument("--python", default=None, help="python of the converter env (default .venv-rknn)")


def run(args) -> int:
    import os

    from ..errors import InputError
    from ..export.rknn import compile_rknn
    from ..plan import plan_snippet

    if args.output and not args.output.endswith(".rknn"):
        raise InputError(f"-o {args.output}: the output must be a .rknn file")
    res = compile_rknn(args.onnx, args.target, args.output, verify=not args.no_verify,
                       frames=args.frames, gate=args.gate, python=args.python)  # fmt: skip
    print(f"wrote {res['rknn']} ({args.target}, fp16) in {res['build_s']:.1f} s; contract {res['contract']}")
    print(f"compile log: {res['log']}")
    ok = True
    if "snr_db" in res:
        ok = bool(res["passed"])
        print(f"simulator vs onnxruntime stepwise: SNR {res['snr_db']:.1f} dB (gate {res['gate_db']:g}) "
              f"{'ok' if ok else 'FAIL'}")  # fmt: skip
    print("plan snippet (copy the .rknn and its .json to the board):")
    print(plan_snippet("vocoder", "rknn", {"main": os.path.basename(res["rknn"])}))
    return 0 if ok else 1
