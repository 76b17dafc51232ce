"""The RKNN board recipe of docs/arm.md, followed on an arm64 machine up to the step that needs the
NPU (benchmarks/arm.sh runs it in the emulated root; on a real RK3588 it runs to the end).

    python benchmarks/arm_rknn.py --model CKPT --bundle BUNDLE --rknn voc8.rknn --codes codes.npz

Steps: (1) rknn-toolkit-lite2 imports; (2) a plan whose vocoder is ``impl: rknn`` (the bundle's
talker and predictor, the ``.rknn`` step and its ``.rknn.json`` contract) parses and names the
rknn opener; (3) ``RKNNLite.load_rknn`` reads the x86-built ``.rknn`` on arm64; (4) ``qtts decode``
of the codes through that plan: on a board with the NPU it writes the audio, elsewhere it must fail
at ``init_runtime`` with qtts's error naming librknnrt.so (exit 1); without an NPU, step 3b also
calls ``init_runtime(target='rk3588')`` to show where rknnlite stops when told the SoC. Each step prints ``step N: ...
ok`` or ``stop``; the exit status is 0 when every step behaved as expected for this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys


def _npu_present() -> bool:
    """The RKNPU2 kernel driver's device nodes (a board with the NPU driver loaded)."""
    return os.path.exists("/dev/rknpu") or os.path.exists("/sys/kernel/debug/rknpu") or os.path.exists("/proc/rknpu")


def _plan(bundle: str, rknn: str, out: str) -> str:
    """A copy of the bundle whose vocoder entry is the .rknn step (with its contract beside it)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(bundle, out)
    for f in (rknn, rknn + ".json"):
        shutil.copy(f, out)
    path = os.path.join(out, "plan.json")
    with open(path, encoding="utf-8") as fh:
        plan = json.load(fh)
    plan["vocoder"] = {"impl": "rknn", "artifacts": {"main": os.path.basename(rknn)}, "precision": "fp16"}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(plan, fh, indent=1)
    return path


def main(args) -> int:
    ok = True
    import rknnlite
    from rknnlite.api import RKNNLite

    with open(os.path.join(os.path.dirname(rknnlite.__file__), "VERSION"), encoding="utf-8") as fh:
        print(f"step 1: import rknnlite.api (rknn-toolkit-lite2 {fh.read().strip()}) ok")

    from qtts.plans.plan import load_plan

    path = _plan(args.bundle, args.rknn, args.out)
    plan = load_plan(path)
    voc = plan.get("vocoder")
    print(f"step 2: plan {path}: vocoder impl {voc.impl}, artifacts {dict(voc.artifacts)} ok")

    rt = RKNNLite()
    ret = rt.load_rknn(args.rknn)
    ok &= ret == 0
    print(f"step 3: RKNNLite.load_rknn({os.path.basename(args.rknn)}) returned {ret} {'ok' if ret == 0 else 'FAIL'}")
    if not _npu_present():  # the SoC named, so rknnlite skips its device-tree detection and goes on to librknnrt.so
        ret = rt.init_runtime(target="rk3588")
        print(f"step 3b: RKNNLite.init_runtime(target='rk3588') returned {ret} (no board: -1 expected; its log above)")
        ok &= ret != 0
    rt.release()

    wav = os.path.join(args.out, "rknn.wav")
    cmd = [sys.executable, "-m", "qtts", "decode", args.codes, "-m", args.model, "--plan", path, "-o", wav]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-6:]
    if _npu_present():
        good = proc.returncode == 0 and os.path.exists(wav)
        print(f"step 4: qtts decode through the NPU: exit {proc.returncode} {'ok' if good else 'FAIL'}")
    else:
        good = proc.returncode == 1 and "librknnrt.so" in proc.stderr and not os.path.exists(wav)
        print(f"stop at step 4 (no NPU here): qtts decode exit {proc.returncode}, "
              f"{'the expected clear error' if good else 'FAIL: not the expected error'}")
    for line in tail:
        print(f"    {line}")
    return 0 if ok and good else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--bundle", required=True, help="an ONNX bundle (talker, predictor) of the same checkpoint")
    p.add_argument("--rknn", required=True, help="a .rknn step from `qtts export rknn`, its .rknn.json beside it")
    p.add_argument("--codes", required=True, help="codes to vocode (qtts say --codes-out)")
    p.add_argument("--out", default="rknn-plan")
    p.add_argument("--timeout", type=float, default=900.0)
    sys.exit(main(p.parse_args()))
