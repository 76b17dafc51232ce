#!/usr/bin/env bash
# Create .venv-et: ExecuTorch 1.5.1 (XNNPACK) + torchao next to torch 2.13 CPU, plus qtts (editable,
# the [executorch] extra), for `qtts export executorch`, plans with impl "executorch", the tests that
# run them (scripts/test.sh calls this) and benchmarks/executorch_row.py. Separate from .venv because
# executorch pulls ~1.5 GB (torchao, coremltools, pandas, ...). Idempotent: a stamp file makes a
# second run a fast no-op.
#   bash scripts/setup_executorch_env.sh          # 70 s on an idle 2-core machine, 4.5 min under load 6
#   ET_VENV=/path bash scripts/setup_executorch_env.sh
#   ET_OFFICIAL=1 bash scripts/setup_executorch_env.sh   # also the official qwen-tts 0.1.1 (+ its
#       reference deps), so that `qtts bench --compare-official` runs in the same process and run as
#       the ExecuTorch plans (docs/performance.md); not needed by the tests
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ET_VENV:-.venv-et}
PY=${PYTHON:-python3}
STAMP="$VENV/.qtts-et-env-v1"
official() {
  if [ "${ET_OFFICIAL:-0}" = 1 ] && ! "$VENV/bin/python" -c "import qwen_tts" 2>/dev/null; then
    echo "adding the official qwen-tts 0.1.1 to $VENV (for qtts bench --compare-official)" >&2
    "$VENV/bin/python" -m pip install -q -e ".[executorch,reference]"
    "$VENV/bin/python" -m pip install -q --no-deps qwen-tts==0.1.1
  fi
}
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  official
  exit 0
fi
echo "setting up the ExecuTorch environment in $VENV (once; ~1.5 GB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
$VPY -m pip install -q -U pip wheel
# executorch declares no torch dependency: pin the CPU torch qtts uses so no other torch is pulled
$VPY -m pip install -q executorch==1.5.1 torch==2.13.0
$VPY -m pip install -q -e ".[executorch]"
$VPY -c "from executorch.runtime import Runtime; import qtts; print('executorch ready:', Runtime.get().backend_registry.registered_backend_names)" >&2
touch "$STAMP"
official
