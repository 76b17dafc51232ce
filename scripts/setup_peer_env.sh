#!/usr/bin/env bash
# Create .venv-peer: the environment of the C++ peer qwentts.cpp (the RealtimeTTS CPU wheel
# `realtimetts-qwen-native-cpu`, a ctypes binding over libqwen + ggml) and of our GGUF converter
# (`gguf`). Kept apart from qtts's venv: the peer is a benchmark subject, not a dependency.
# Idempotent: a stamp file makes a second run a fast no-op.
#   bash scripts/setup_peer_env.sh            # create or verify
#   PEER_VENV=/path bash scripts/setup_peer_env.sh
# Then: .venv-peer/bin/python benchmarks/bench_peer.py --help   (docs/history/performance.md, "Peer")
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PEER_VENV:-.venv-peer}
PY=${PYTHON:-python3}
WHEEL_VERSION=0.4.2
GGUF_VERSION=0.19.0
STAMP="$VENV/.qtts-peer-env-v1-$WHEEL_VERSION-$GGUF_VERSION"
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
echo "setting up the qwentts.cpp peer environment in $VENV (once; ~140 MB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
$VPY -m pip install -q -U pip
# The wheel declares no dependencies beyond numpy; it bundles libqwen.so and the ggml CPU libraries.
$VPY -m pip install -q "realtimetts-qwen-native-cpu==$WHEEL_VERSION" "gguf==$GGUF_VERSION" "numpy>=1.24"
$VPY - <<'EOF' >&2
import gguf, qwentts_cpp_cpu
lib = qwentts_cpp_cpu.QwenLibrary()
print("qwentts.cpp peer ready:", qwentts_cpp_cpu.__version__, "libqwen", lib.version(),
      "cpu_only", lib.cpu_only(), "| gguf", gguf.__version__ if hasattr(gguf, "__version__") else "?")
EOF
touch "$STAMP"
