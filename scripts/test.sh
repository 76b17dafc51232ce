#!/usr/bin/env bash
# Install everything the test suite needs into .venv (idempotent) and run it.
# This is the README test command; .ci/run calls it on a clean checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
$VPY -m pip install -q -U pip wheel
$VPY -m pip install -q torch==2.13.0            # local CPU wheel on the project machines
$VPY -m pip install -q -e ".[torch,export,serve,wyoming,hub,plot,reference,dev,qnn,peer,ray]"
# The web-page test drives Debian's Chromium through Playwright (never 'playwright install').
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "scripts/test.sh: chromium is missing and cannot be installed here (needs root + apt-get);" \
         "install Debian's 'chromium' package, or tests/test_web_page.py fails" >&2
  fi
fi
# The official package, for parity tests; --no-deps: its declared deps (sox, torchaudio,
# gradio, onnxruntime pins) are not needed on the 12 Hz path (see tests/official.py).
$VPY -m pip install -q --no-deps qwen-tts==0.1.1
if [ -f scripts/setup_rknn_env.sh ]; then
  bash scripts/setup_rknn_env.sh
fi
# Two worker processes, one test file each at a time (pytest-xdist --dist loadfile: module
# fixtures such as a file's exported bundle stay in one process). 1101 tests took 674 s this way
# against 1122 s in one process on the 2-core VM; QTTS_TEST_WORKERS=0 runs them in one process.
exec $VPY -m pytest -q -n "${QTTS_TEST_WORKERS:-2}" --dist loadfile "$@"
