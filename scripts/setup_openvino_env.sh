#!/usr/bin/env bash
# Create .venv-openvino: the environment of benchmarks/perf/openvino_gemv.py (OpenVINO + NNCF weight
# compression against onnxruntime MatMulNBits). Kept apart from qtts's venv: OpenVINO is a benchmark
# subject, not a dependency. The script imports qtts from the source tree (PYTHONPATH=src).
# Idempotent: a stamp file makes a second run a fast no-op.
#   bash scripts/setup_openvino_env.sh            # create or verify
#   OPENVINO_VENV=/path bash scripts/setup_openvino_env.sh
# Then: PYTHONPATH=src .venv-openvino/bin/python benchmarks/perf/openvino_gemv.py --help
#       (docs/history/performance.md, "OpenVINO on the Zen 4 VM (re-measured)")
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OPENVINO_VENV:-.venv-openvino}
PY=${PYTHON:-python3}
OPENVINO_VERSION=2026.4.1
NNCF_VERSION=3.4.0
ORT_VERSION=1.32.0
STAMP="$VENV/.qtts-openvino-env-v1-$OPENVINO_VERSION-$NNCF_VERSION-$ORT_VERSION"
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "setting up the OpenVINO benchmark environment in $VENV (once; ~600 MB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
$VPY -m pip install -q -U pip
$VPY -m pip install -q "openvino==$OPENVINO_VERSION" "nncf==$NNCF_VERSION" "onnxruntime==$ORT_VERSION" onnx "numpy>=1.24"
$VPY - <<'PYEOF' >&2
import nncf, onnxruntime, openvino as ov
print("OpenVINO benchmark env ready: openvino", ov.__version__, "| nncf", nncf.__version__,
      "| onnxruntime", onnxruntime.__version__, "| CPU", ov.Core().get_property("CPU", "FULL_DEVICE_NAME"))
PYEOF
touch "$STAMP"
