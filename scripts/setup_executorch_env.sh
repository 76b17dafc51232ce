#!/usr/bin/env bash
# Create .venv-et: ExecuTorch 1.5.1 (XNNPACK) + torchao next to torch 2.13 CPU, plus qtts (editable,
# the [executorch] extra), for `qtts export executorch`, plans with impl "executorch", the tests that
# run them (scripts/test.sh calls this) and benchmarks/executorch_row.py. Separate from .venv because
# executorch pulls ~1.5 GB (torchao, coremltools, pandas, ...). Idempotent: a stamp file makes a
# second run a fast no-op.
#   bash scripts/setup_executorch_env.sh          # < 30 s with uv (scripts/pyinstall.sh), 70 s with pip, idle 2-core VM
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
    source scripts/pyinstall.sh  # pyinstall: uv where it can be had, else pip
    pyinstall "$VENV/bin/python" -e ".[executorch,reference]"
    pyinstall "$VENV/bin/python" --no-deps qwen-tts==0.1.1
  fi
}
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  official
  exit 0
fi
echo "setting up the ExecuTorch environment in $VENV (once; ~1.5 GB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
source scripts/pyinstall.sh  # pyinstall: uv where it can be had, else pip
# not byte-compiled whole (~40 s of CPU): the ready check below compiles what an export and a say import
export PYINSTALL_COMPILE=0
# executorch declares no torch dependency: pin the CPU torch qtts uses so no other torch is pulled
pyinstall $VPY executorch==1.5.1 torch==2.13.0
pyinstall $VPY -e ".[executorch]"
PYTHONDONTWRITEBYTECODE= $VPY -c "from executorch.runtime import Runtime; import qtts.cli.main, qtts.cli.say, \
qtts.cli.export_et, qtts.export.executorch, qtts.backends.executorch, executorch.exir, \
executorch.backends.xnnpack.partition.xnnpack_partitioner; print('executorch ready:', Runtime.get().backend_registry.registered_backend_names)" >&2
touch "$STAMP"
official
