"""ONNX vocoder step -> ``.rknn`` (fp16, rknn-toolkit2 2.5.0) with a PC-simulator check.

rknn-toolkit2 pins numpy 1.x and onnx <= 1.18, so it lives in its own environment
(``.venv-rknn``, created by ``scripts/setup_rknn_env.sh``). This file has two halves:

* the host half (:func:`compile_rknn`, used by ``qtts export rknn``) finds that environment and
  runs this very file there as a subprocess; its output becomes ``<out>.build.log``;
* the converter half (:func:`main`) runs inside ``.venv-rknn``. It imports only the standard
  library, numpy, onnx, onnxruntime and rknn - never qtts (whose modules expect numpy 2) - so the
  module's top level must stay stdlib-only. It reads the step contract from the ONNX metadata,
  builds fp16 (``do_quantization=False``: int8 makes the Snake activations audibly noisy),
  exports, then decodes random codes step by step in the toolkit's simulator and with
  onnxruntime and prints the SNR; it writes the contract next to the output (``<out>.json``),
  which the on-board :class:`qtts.backends.rknn.RknnVocoder` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

TARGETS = ("rk3588", "rk3576", "rk3562", "rk3566", "rk3568")
RESULT_TAG = "QTTS_RKNN_RESULT "
SETUP_COMMAND = "bash scripts/setup_rknn_env.sh"
STEP_INPUTS = ("audio_codes", "freqs_in", "cache_valid", "cache_in")
_RUNNER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


# ----------------------------------------------------------------------------- host half
def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def converter_python(explicit: str | None = None) -> str | None:
    """The converter environment's python: explicit, $QTTS_RKNN_PYTHON, ./.venv-rknn, <repo>/.venv-rknn."""
    if explicit:  # an explicit choice is never silently replaced
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    candidates = [os.environ.get("QTTS_RKNN_PYTHON")]
    candidates += [os.path.join(d, ".venv-rknn", "bin", "python") for d in (os.getcwd(), _repo_root())]
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def setup_hint() -> str:
    return (
        "the RKNN converter environment (.venv-rknn with rknn-toolkit2 2.5.0) is missing; create it with:\n"
        f"  cd {_repo_root()} && {SETUP_COMMAND}\n"
        "or point QTTS_RKNN_PYTHON at a python that has rknn-toolkit2 installed"
    )


def compile_rknn(onnx_path: str, target: str, out: str | None = None, verify: bool = True,
                 frames: int | None = None, gate: float = 50.0, python: str | None = None) -> dict:  # fmt: skip
    """Convert in the converter environment; returns its result (paths, SNR, build seconds)."""
    from ..errors import InputError, MissingDependencyError, QttsError

    if target not in TARGETS:
        raise InputError(f"--target {target}: choose one of {', '.join(TARGETS)}")
    if not os.path.isfile(onnx_path):
        raise InputError(f"{onnx_path}: ONNX file not found (export one with `qtts export vocoder`)")
    py = converter_python(python)
    if py is None:
        raise MissingDependencyError(setup_hint())
    out = os.path.abspath(out or os.path.splitext(onnx_path)[0] + f"_{target}.rknn")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    log_path = out + ".build.log"
    cmd = [py, "-I", "-c", _RUNNER, os.path.abspath(__file__), "--onnx", os.path.abspath(onnx_path),
           "--target", target, "--out", out, "--gate", str(gate)]  # fmt: skip
    if frames:
        cmd += ["--frames", str(frames)]
    if not verify:
        cmd.append("--no-verify")
    # the toolkit drops check*.onnx copies of the model into its cwd: give it a scratch one
    with (
        open(log_path, "w", encoding="utf-8") as log,
        tempfile.TemporaryDirectory(prefix="qtts-rknn-") as tmp,
    ):
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    lines = _compact_log(log_path)
    results = [json.loads(ln[len(RESULT_TAG) :]) for ln in lines if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not results:
        tail = "\n".join(lines[-15:])
        raise QttsError(f"RKNN conversion failed (exit {proc.returncode}); full log: {log_path}\n{tail}")
    result = results[-1]
    result["log"] = log_path
    return result


def _compact_log(path: str, keep: int = 20) -> list[str]:
    """Collapse the toolkit's repeated ``REGTASK: The bit width ... exceeds the limit`` lines (the
    full-size build prints ~900k of them, 140 MB) to the first ``keep`` plus a count; returns the lines."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    regtask = [i for i, ln in enumerate(lines) if "REGTASK:" in ln]
    if len(regtask) > keep:
        drop = set(regtask[keep:])
        kept = [ln for i, ln in enumerate(lines) if i not in drop]
        kept.insert(
            regtask[keep - 1] + 1, f"[qtts] {len(drop)} more REGTASK lines like the above were removed"
        )
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(kept) + "\n")
        lines = kept
    return lines


# ----------------------------------------------------------------------------- converter half
def rope_freqs(start: int, count: int, inv_freq):
    """Same as qtts.backends.vocoder_step.rope_freqs (duplicated: this half cannot import qtts)."""
    import numpy as np

    pos = np.arange(start, start + count, dtype=np.float32)[:, None]
    angles = pos * np.asarray(inv_freq, dtype=np.float32)[None, :]
    return np.mod(angles.astype(np.float64), 2.0 * np.pi).astype(np.float32)


def read_contract(onnx_path: str) -> dict:
    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if "qtts.step_contract" not in meta:
        raise SystemExit(f"{onnx_path}: not a qtts vocoder step (no qtts.step_contract metadata)")
    return json.loads(meta["qtts.step_contract"])


def _inputs(contract: dict) -> tuple[list, list]:
    b, nq = contract["codes_length"], contract["num_quantizers"]
    shapes = [[1, nq, b], [b, contract["head_dim"] // 2], [1], [contract["cache_size"]]]
    return list(STEP_INPUTS), shapes


def _stepwise(run, contract: dict, codes) -> object:
    """Decode codes [T,16] (T a multiple of B) with ``run(feeds_list) -> (audio, cache)``."""
    import numpy as np

    b = contract["codes_length"]
    cache = np.zeros(contract["cache_size"], dtype=np.float32)
    outs = []
    for pos in range(0, len(codes), b):
        feeds = [
            np.ascontiguousarray(codes[pos : pos + b].T[None], dtype=np.int64),
            rope_freqs(pos, b, contract["inv_freq"]),
            np.array([min(pos, contract["kv_slots"])], dtype=np.float32),
            cache,
        ]
        audio, cache = run(feeds)
        outs.append(np.asarray(audio, dtype=np.float32).reshape(-1))
        cache = np.asarray(cache, dtype=np.float32).reshape(-1)
    return np.concatenate(outs)


def _snr(ref, test) -> float:
    import numpy as np

    err = float(np.sum((ref.astype(np.float64) - test) ** 2))
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / err))


def _simulate(rknn, onnx_path: str, contract: dict, frames: int) -> float:
    import numpy as np
    import onnxruntime as ort

    b = contract["codes_length"]
    frames = max(b, frames - frames % b)
    codes = np.random.default_rng(0).integers(0, 2048, (frames, contract["num_quantizers"]))
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    ref = _stepwise(lambda f: sess.run(None, dict(zip(STEP_INPUTS, f))), contract, codes)
    if rknn.init_runtime() != 0:
        raise SystemExit("rknn init_runtime (simulator) failed")
    got = _stepwise(lambda f: rknn.inference(inputs=f), contract, codes)
    return _snr(ref, got)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="qtts RKNN converter half (runs inside .venv-rknn)")
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--target", required=True, choices=TARGETS)
    ap.add_argument("--out", required=True)
    ap.add_argument("--frames", type=int, default=0, help="simulator check frames (default 3B)")
    ap.add_argument("--gate", type=float, default=50.0)
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args(argv)
    import time

    from rknn.api import RKNN

    contract = read_contract(args.onnx)
    names, shapes = _inputs(contract)
    print(
        f"onnx {args.onnx}: B={contract['codes_length']} N={contract['cache_size']} -> {args.target} fp16",
        flush=True,
    )
    rknn = RKNN(verbose=True)
    t0 = time.time()
    rknn.config(target_platform=args.target)
    if rknn.load_onnx(model=args.onnx, inputs=names, input_size_list=shapes) != 0:
        raise SystemExit("rknn load_onnx failed")
    if rknn.build(do_quantization=False) != 0:  # fp16 (w16a16); int8 costs ~45 dB on Snake
        raise SystemExit("rknn build failed")
    tmp = os.path.join(os.path.dirname(args.out), "." + os.path.basename(args.out) + ".tmp")
    if rknn.export_rknn(tmp) != 0:
        raise SystemExit("rknn export_rknn failed")
    os.replace(tmp, args.out)
    build_s = time.time() - t0
    with open(args.out + ".json", "w", encoding="utf-8") as fh:
        json.dump(contract, fh)
    result = {
        "rknn": args.out,
        "contract": args.out + ".json",
        "target": args.target,
        "build_s": round(build_s, 2),
    }
    if not args.no_verify:
        snr = _simulate(rknn, args.onnx, contract, args.frames or 3 * contract["codes_length"])
        result.update(snr_db=round(snr, 2), gate_db=args.gate, passed=snr >= args.gate)
        print(f"simulator vs onnxruntime stepwise: SNR {snr:.1f} dB (gate {args.gate:g})", flush=True)
    rknn.release()
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
