#!/usr/bin/env bash
# Install everything the test suite needs into .venv (idempotent), lint, and run it.
# This is the README test command; .ci/run calls it on a clean checkout. Everything the tests read
# is in the repository (tests/data/reference, src/qtts/data): nothing outside the checkout is needed.
#   bash scripts/test.sh                               the whole suite (CI)
#   bash scripts/test.sh -m "not parity and not slow"  the fast lane for everyday work
#   QTTS_TEST_WORKERS=0 bash scripts/test.sh ...       one process instead of two workers
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
T0=$(date +%s)
phase() { echo "scripts/test.sh: $1 after $(( $(date +%s) - T0 )) s" >&2; }  # where CI's minutes go

# -- prerequisites, checked before anything is downloaded --------------------------------------
die() { echo "scripts/test.sh: $*" >&2; exit 2; }
command -v "$PY" >/dev/null 2>&1 || die "$PY not found; install Python >= 3.10 (or set PYTHON=/path/to/python3)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "$PY is $("$PY" -V 2>&1); qtts needs Python >= 3.10 (set PYTHON=/path/to/python3.11)"
"$PY" -c 'import venv, ensurepip' 2>/dev/null \
  || die "$PY cannot make virtual environments; install its venv module (Debian: apt-get install python3-venv)"
command -v git >/dev/null 2>&1 || die "git not found (the fresh-clone test clones this checkout); install git"
free_mb=$(df -Pm . | awk 'NR == 2 {print $4}')
[ "${free_mb:-0}" -ge 6000 ] || die "only ${free_mb} MB free here; the environments and test files need ~6 GB"
need_chromium=0
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    need_chromium=1
  else
    die "chromium is missing (the web-page tests drive it through Playwright) and cannot be installed" \
        "here (needs root + apt-get); install Debian's 'chromium' package first"
  fi
fi
# The optional compiled kernels (src/qtts/kernels, `qtts kernels build`) are tested with and
# without the library, so CI needs a C compiler: Debian's gcc, installed here when none is found.
need_cc=0
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1 && ! command -v clang >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    need_cc=1
  else
    die "no C compiler (cc, gcc or clang): the tests build the optional kernels (src/qtts/kernels);" \
        "install Debian's 'gcc' package first"
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "scripts/test.sh: first run: creating .venv with torch 2.13.0 (CPU) and the test extras," \
       "qwen-tts 0.1.1 (parity), the RKNN converter env .venv-rknn, the ExecuTorch env .venv-et$([ $need_chromium = 1 ] && echo ', and Debian chromium via apt')" \
       "— several minutes and ~5 GB; later runs reuse them" >&2
fi

# -- installs (idempotent) --------------------------------------------------------------------
# The RKNN and ExecuTorch environments share nothing with .venv: they install in the background
# while .venv does (clean clone on the shared 2-core VM: every install 110-133 s this way against
# 172 s one after another) and are waited on before the suite; a failure of either still fails
# this script, with its log.
LOGS=$(mktemp -d)
bg_pids=() bg_names=()
background() {  # background NAME SCRIPT: run an environment's setup script into $LOGS/NAME.log
  [ -f "$2" ] || return 0
  bash "$2" >"$LOGS/$1.log" 2>&1 &
  bg_pids+=($!) bg_names+=("$1")
}
background rknn scripts/setup_rknn_env.sh
# ExecuTorch 1.5.1 + torchao (~1.5 GB, 1-5 min): tests/backends/test_executorch.py drives .venv-et/bin/python
background executorch scripts/setup_executorch_env.sh
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
source scripts/pyinstall.sh  # pyinstall: uv where it can be had, else pip
# torch: the local CPU wheel on the project machines (one install with the extras: one resolution)
pyinstall $VPY torch==2.13.0 -e ".[torch,export,serve,wyoming,hub,plot,reference,dev,qnn,peer,ray]"
# The web-page test drives Debian's Chromium through Playwright (never 'playwright install').
if [ $need_chromium = 1 ]; then
  echo "scripts/test.sh: installing Debian's chromium (apt-get, as root) for the web-page tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ $need_cc = 1 ]; then
  echo "scripts/test.sh: no C compiler found: installing Debian's gcc (apt-get, as root) for the optional kernels" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi
# Compile the kernels once now (~2 s; cached in ~/.cache/qtts/kernels): a compiler that cannot build
# them fails here with its own message rather than in the middle of the suite.
$VPY -m qtts kernels build || die "the optional kernels did not build (above); the tests need them"
# The official package, for parity tests, and the official forced aligner (tests/parity/test_aligner*.py),
# in one install; --no-deps: qwen-tts's declared deps (sox, torchaudio, gradio, onnxruntime pins) are
# not needed on the 12 Hz path (see tests/support/official.py), and qwen-asr pins transformers 4.57.6.
pyinstall $VPY --no-deps qwen-tts==0.1.1 qwen-asr==0.0.6
phase ".venv ready"
for i in "${!bg_pids[@]}"; do
  if ! wait "${bg_pids[$i]}"; then
    tail -n 40 "$LOGS/${bg_names[$i]}.log" >&2
    die "the ${bg_names[$i]} environment did not install (its log's end above; rerun scripts/setup_${bg_names[$i]}_env.sh alone to see all of it)"
  fi
  grep -E "^(setting up|rknn-toolkit2 ready|executorch ready|adding)" "$LOGS/${bg_names[$i]}.log" >&2 || true
done
rm -rf "$LOGS"
phase "the RKNN and ExecuTorch environments ready"

# -- lint, then the suite ---------------------------------------------------------------------
$VPY -m ruff check -q src tests scripts benchmarks examples || die "ruff check failed (above); '.venv/bin/ruff check --fix' mends most"
phase "lint passed; the suite starts"
# Two worker processes, one test file each at a time (pytest-xdist --dist loadfile: module
# fixtures such as a file's exported bundle stay in one process), handed out in collection order
# (--no-loadscope-reorder: tests/conftest.py collects the longest modules first, LONGEST_FIRST). 1101 tests took 674 s this way
# against 1122 s in one process on the 2-core VM (an earlier run); 1605 tests took 987 s with two
# workers while other jobs held the VM at load 4-7. QTTS_TEST_WORKERS=0 runs them in one process.
if [ "${QTTS_TEST_WORKERS:-2}" = 0 ]; then
  exec $VPY -m pytest -q "$@"
fi
exec $VPY -m pytest -q -n "${QTTS_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
