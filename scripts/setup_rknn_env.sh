#!/usr/bin/env bash
# Create .venv-rknn: the RKNN converter environment (rknn-toolkit2 2.5.0 pins numpy 1.x / onnx <= 1.18,
# so it cannot share qtts's main venv). Idempotent: a stamp file makes a second run a fast no-op.
#   bash scripts/setup_rknn_env.sh            # create or verify
#   RKNN_VENV=/path bash scripts/setup_rknn_env.sh
# `qtts export rknn` runs its conversion inside this environment.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RKNN_VENV:-.venv-rknn}
PY=${PYTHON:-python3}
STAMP="$VENV/.qtts-rknn-env-v1"
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "setting up the RKNN converter environment in $VENV (once; ~1.5 GB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
source scripts/pyinstall.sh  # pyinstall: uv where it can be had, else pip
# not byte-compiled whole (~20 s of CPU): the ready check below compiles what the converter imports
export PYINSTALL_COMPILE=0
pyinstall $VPY "numpy==1.26.4" "onnx==1.18.0" onnxruntime "protobuf>=4.21.6,<=4.25.4" \
  psutil ruamel.yaml scipy tqdm opencv-python-headless fast-histogram
pyinstall $VPY torch==2.13.0     # imported by the toolkit at load; local CPU wheel here
pyinstall $VPY "setuptools<81"   # torch pulls a setuptools without pkg_resources, which RKNN() needs
# The toolkit declares torch<=2.4 / opencv-python; it works with torch 2.13 and the headless OpenCV.
# Installed last and --no-deps: pip checks declared requirements only of what it installs with
# dependencies, so no later step prints a harmless "ERROR: ... incompatible" about the toolkit.
pyinstall $VPY --no-deps rknn-toolkit2==2.5.0
PYTHONDONTWRITEBYTECODE= $VPY -c "from rknn.api import RKNN; import numpy, onnx, onnxruntime; print('rknn-toolkit2 ready: numpy', numpy.__version__, 'onnx', onnx.__version__)" >&2
touch "$STAMP"
