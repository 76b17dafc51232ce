#!/usr/bin/env bash
# The aarch64 lane: qtts on an emulated arm64 Debian (qemu-user), compared with x86-64 (issue 39).
#
#   sudo bash benchmarks/arm.sh                 # everything; the summary ends in $ARM_CACHE/last/summary.md
#   sudo bash benchmarks/arm.sh --no-rknn       # without the RKNN board-runtime step
#   ARM_CACHE=/path ARM_CPU=cortex-a72 sudo -E bash benchmarks/arm.sh
#
# Steps (cached under $ARM_CACHE, default /var/cache/qtts-arm, so a rerun takes ~5 min, not ~10):
#  1. host: apt-get install qemu-user-static debootstrap binfmt-support; the aarch64 binfmt handler;
#  2. an arm64 Debian bookworm root (debootstrap --foreign, then the second stage under qemu) with
#     python3, venv, pip and gcc; its python is 3.11, the --python-version of step 3;
#  3. aarch64 wheels fetched on the host with `pip download --platform`: the qtts wheel built from this
#     checkout with its core deps plus serve and wyoming (no torch), pytest, and rknn-toolkit-lite2;
#  4. x86-64: a tiny random CustomVoice checkpoint, fp32 and int8 ONNX bundles (qtts export onnx), a
#     vocoder step compiled for rk3588 (qtts export rknn in .venv-rknn); benchmarks/arm_lane.py run and
#     benchmarks/arm_probe.py run;
#  5. arm64 (chroot, CPU $ARM_CPU, default cortex-a76): a venv from those wheels only (--no-index),
#     tests/kernels (the NEON / C paths built by the emulated gcc), the same two scripts on the x86
#     bundles, then the RKNN board recipe of docs/arm.md up to where it needs the NPU (arm_rknn.py);
#  6. compare (arm_lane.py compare, arm_probe.py compare): codes and audio, arm64 against x86-64.
# The x86 side needs a python with qtts[export] ($QTTS_X86_PYTHON, default .venv/bin/python, which
# scripts/test.sh creates; otherwise one is made in $ARM_CACHE/x86-venv). Emulated times say nothing
# about arm64 speed: the lane checks results, never speed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CACHE=${ARM_CACHE:-/var/cache/qtts-arm}
ROOT=$CACHE/root
X86=$CACHE/x86
LAST=$CACHE/last
WHEELS=$CACHE/wheels
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYVER=3.11 # bookworm's python3
BUNDLES="--bundle fp32=bundle-fp32 --bundle int8=bundle-int8"
MOUNTS=()

log() { printf '\n=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
in_arm() { chroot "$ROOT" /usr/bin/env -i QEMU_CPU="$QEMU_CPU" HOME=/root LANG=C.UTF-8 PATH=/opt/qtts/bin:/usr/bin:/bin "$@"; }
cleanup() { for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[i]}" 2>/dev/null || true; done; }

host_tools() {
  log "host: qemu-user-static, debootstrap, binfmt"
  if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static debootstrap binfmt-support >/dev/null
  fi
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
  grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64
}

make_root() {
  [ -f "$ROOT/.qtts-root-ok" ] && return
  log "arm64 root: debootstrap bookworm (first stage on the host, second stage emulated: ~5 min)"
  rm -rf "$ROOT.partial"
  debootstrap --arch=arm64 --foreign --variant=minbase \
    --include=python3,python3-venv,python3-pip,gcc,libc6-dev,ca-certificates bookworm "$ROOT.partial" "$MIRROR"
  chroot "$ROOT.partial" /debootstrap/debootstrap --second-stage
  mv "$ROOT.partial" "$ROOT"
  touch "$ROOT/.qtts-root-ok"
}

# The emulated CPU: a Cortex-A76 by default (the big core of the RK3588 and the Raspberry Pi 5; its
# HWCAP has NEON and the dot product, no SVE). qemu-user 7.2 shows programs the HOST's /proc/cpuinfo,
# whose x86 text makes onnxruntime's cpuinfo library crash at import (SIGSEGV); a real arm64 kernel
# shows its own, so the lane bind-mounts the /proc/cpuinfo of that CPU over the root's.
mount_root() {
  trap cleanup EXIT
  mountpoint -q "$ROOT/proc" || { mount -t proc proc "$ROOT/proc" && MOUNTS+=("$ROOT/proc"); }
  mountpoint -q "$ROOT/sys" || { mount -t sysfs sys "$ROOT/sys" && MOUNTS+=("$ROOT/sys"); }
  mountpoint -q "$ROOT/dev" || { mount --bind /dev "$ROOT/dev" && MOUNTS+=("$ROOT/dev"); }
  export QEMU_CPU=${ARM_CPU:-cortex-a76}
  case $QEMU_CPU in
    cortex-a76) PART=0xd0b VARIANT=0x4 ;; cortex-a72) PART=0xd08 VARIANT=0x0 ;; neoverse-n1) PART=0xd0c VARIANT=0x3 ;;
    cortex-a57) PART=0xd07 VARIANT=0x1 ;; cortex-a53) PART=0xd03 VARIANT=0x0 ;;
    *) echo "ARM_CPU=$QEMU_CPU: use cortex-a76 (default), cortex-a72, cortex-a57, cortex-a53 or neoverse-n1" >&2; exit 2 ;;
  esac
  FEATURES=$(in_arm /usr/bin/python3 -c "import ctypes; h = ctypes.CDLL(None).getauxval(16); \
names = 'fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve'.split(); \
print(' '.join(n for i, n in enumerate(names) if h >> i & 1))")
  for i in 0 1; do
    printf 'processor\t: %s\nBogoMIPS\t: 50.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: 0\n\n' \
      "$i" "$FEATURES" "$VARIANT" "$PART"
  done >"$CACHE/cpuinfo-$QEMU_CPU"
  if ! grep -q "CPU part" "$ROOT/proc/cpuinfo"; then
    mount --bind "$CACHE/cpuinfo-$QEMU_CPU" "$ROOT/proc/cpuinfo"
    MOUNTS+=("$ROOT/proc/cpuinfo")
  fi
}

x86_python() {
  X86_PY=${QTTS_X86_PYTHON:-$REPO/.venv/bin/python}
  "$X86_PY" -c "import qtts, torch, onnx" 2>/dev/null && return
  X86_PY=$CACHE/x86-venv/bin/python
  "$X86_PY" -c "import qtts, torch, onnx" 2>/dev/null && return
  log "x86: a venv with qtts[export,serve,wyoming] in $CACHE/x86-venv (once)"
  python3 -m venv "$CACHE/x86-venv"
  "$X86_PY" -m pip install -q -U pip wheel
  "$X86_PY" -m pip install -q torch==2.13.0 -e "$REPO[export,serve,wyoming]"
}

fetch_wheels() {
  log "wheels: qtts from this checkout + aarch64 dependencies (pip download --platform)"
  rm -rf "$WHEELS/qtts-"*.whl "$CACHE/qtts-wheel" && mkdir -p "$WHEELS"
  "$X86_PY" -m pip wheel -q --no-deps --no-build-isolation "$REPO" -w "$CACHE/qtts-wheel"
  QWHL=$(ls "$CACHE"/qtts-wheel/qtts-*.whl)
  local dl=(-m pip download -q -d "$WHEELS" --only-binary=:all: --python-version "$PYVER" --implementation cp
    --platform manylinux_2_36_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64
    --platform linux_aarch64)
  "$X86_PY" "${dl[@]}" "$QWHL[serve,wyoming]" pytest
  [ "$RKNN" = 0 ] || "$X86_PY" "${dl[@]}" rknn-toolkit-lite2
  cp "$QWHL" "$WHEELS/"
}

x86_side() {
  if [ ! -f "$X86/.ok" ]; then
    log "x86: tiny checkpoint, fp32 + int8 bundles"
    rm -rf "$X86" && mkdir -p "$X86"
    "$X86_PY" -m qtts random-checkpoint "$X86/tiny-cv" --size tiny --kind custom_voice
    for w in fp32 int8; do
      "$X86_PY" -m qtts export onnx -m "$X86/tiny-cv" -o "$X86/bundle-$w" --weights $w \
        --components talker predictor vocoder --no-batch-graphs
    done
    touch "$X86/.ok"
  fi
  if [ "$RKNN" = 1 ] && [ ! -f "$X86/rknn/voc8.rknn.json" ]; then
    log "x86: vocoder step -> rk3588 .rknn (rknn-toolkit2 in .venv-rknn)"
    bash scripts/setup_rknn_env.sh
    mkdir -p "$X86/rknn"
    "$X86_PY" -m qtts export vocoder -m "$X86/tiny-cv" --chunk-frames 8 -o "$X86/rknn/voc8.onnx"
    # the tiny random vocoder's fp16 limit is ~46 dB (docs/vocoder.md), under the default gate of 50
    "$X86_PY" -m qtts export rknn --onnx "$X86/rknn/voc8.onnx" --target rk3588 -o "$X86/rknn/voc8.rknn" --gate 40 \
      --python "$REPO/.venv-rknn/bin/python"
  fi
  log "x86: the lane's commands"
  rm -rf "$X86/out"
  (cd "$X86" && "$X86_PY" "$REPO/benchmarks/arm_lane.py" run out --model tiny-cv $BUNDLES \
    && "$X86_PY" "$REPO/benchmarks/arm_probe.py" run out/probe.npz --model tiny-cv $BUNDLES) | tee "$LAST/x86.log"
}

arm_install() {
  log "arm64: copy the x86 bundles, codes, wheels, tests and lane scripts into the root's /lane"
  rm -rf "$ROOT/lane" && mkdir -p "$ROOT/lane/tests" "$ROOT/lane/benchmarks" "$ROOT/lane/x86-codes"
  cp -r "$X86/tiny-cv" "$X86/bundle-fp32" "$X86/bundle-int8" "$WHEELS" "$ROOT/lane/"
  [ "$RKNN" = 0 ] || cp -r "$X86/rknn" "$ROOT/lane/"
  cp "$X86"/out/codes-*.npz "$ROOT/lane/x86-codes/"
  cp tests/conftest.py "$ROOT/lane/tests/" && cp -r tests/kernels "$ROOT/lane/tests/"
  cp benchmarks/arm_lane.py benchmarks/arm_compare.py benchmarks/arm_rknn.py benchmarks/arm_probe.py "$ROOT/lane/benchmarks/"
  log "arm64: the emulated CPU and the toolchain"
  in_arm /bin/sh -c 'uname -m; gcc --version | head -1; python3 --version; ldd --version | head -1' | tee "$LAST/arm-env.txt"
  echo "emulated CPU: QEMU_CPU=$QEMU_CPU (MIDR part $PART), HWCAP: $FEATURES" | tee -a "$LAST/arm-env.txt"
  qemu-aarch64-static --version | head -1 | tee -a "$LAST/arm-env.txt"
  log "arm64: a fresh venv from the wheels only (no index, no torch)"
  rm -rf "$ROOT/opt/qtts" && in_arm python3 -m venv /opt/qtts
  in_arm python -m pip install -q --no-index --find-links /lane/wheels "qtts[serve,wyoming]" pytest
  in_arm python -m pip install -q --no-index --no-deps --force-reinstall "/lane/wheels/$(basename "$QWHL")"
  in_arm python -m pip freeze | tee "$LAST/arm-freeze.txt"
  if in_arm python -c "import torch" 2>/dev/null; then echo "torch is in the arm64 venv: not a core install" >&2; exit 1; fi
}

arm_checks() { # sets KTESTS, LANE, RK (exit statuses); never exits on a failed check
  log "arm64: tests/kernels (built by the emulated gcc)"
  in_arm /bin/sh -c 'cd /lane && QTTS_CACHE=/lane/kcache python -m pytest -q -p no:cacheprovider tests/kernels' 2>&1 \
    | tee "$LAST/arm-kernel-tests.log" && KTESTS=0 || KTESTS=$?
  log "arm64: the lane's commands on the x86 bundles"
  in_arm /bin/sh -c "cd /lane && python benchmarks/arm_lane.py run out --model tiny-cv $BUNDLES --codes-from x86-codes --timeout 1200 \
    && python benchmarks/arm_probe.py run out/probe.npz --model tiny-cv $BUNDLES" 2>&1 | tee "$LAST/arm.log" && LANE=0 || LANE=$?
  RK=0
  [ "$RKNN" = 1 ] || return 0
  log "arm64: the RKNN board recipe (docs/arm.md) up to the device"
  in_arm python -m pip install -q --no-index --find-links /lane/wheels rknn-toolkit-lite2
  in_arm /bin/sh -c 'cd /lane && python benchmarks/arm_rknn.py --model tiny-cv --bundle bundle-fp32 --rknn rknn/voc8.rknn \
    --codes out/codes-fp32.npz' 2>&1 | tee "$LAST/arm-rknn.log" && RK=0 || RK=$?
}

report() {
  log "compare: x86-64 vs arm64"
  "$X86_PY" benchmarks/arm_lane.py compare "$X86/out" "$ROOT/lane/out" --markdown "$LAST/compare.md" && CMP=0 || CMP=$?
  "$X86_PY" benchmarks/arm_probe.py compare "$X86/out/probe.npz" "$ROOT/lane/out/probe.npz" | tee "$LAST/probe.txt" || CMP=1
  cp "$X86/out/results.json" "$LAST/x86-results.json" && cp "$ROOT/lane/out/results.json" "$LAST/arm-results.json"
  {
    local dirty && dirty=$(git -C "$REPO" diff --quiet HEAD -- src pyproject.toml || echo " + uncommitted edits in src")
    echo "# aarch64 lane, $(date -u +%Y-%m-%dT%H:%MZ), qtts $(git -C "$REPO" rev-parse --short HEAD)$dirty"
    echo && echo '```' && cat "$LAST/arm-env.txt" && echo '```' && echo
    echo "kernel tests (arm64): $(tail -1 "$LAST/arm-kernel-tests.log")" && echo
    cat "$LAST/compare.md"
    echo && echo "graphs on fixed random inputs (benchmarks/arm_probe.py), x86-64 vs arm64:"
    echo '```' && cat "$LAST/probe.txt" && echo '```'
    if [ "$RKNN" = 1 ]; then echo && echo '```' && grep -E '^(step|stop)' "$LAST/arm-rknn.log"; echo '```'; fi
    echo && echo "exit: kernel tests $KTESTS, lane $LANE, rknn $RK, compare $CMP"
  } >"$LAST/summary.md"
  cat "$LAST/summary.md"
}

main() {
  RKNN=1
  [ "${1:-}" = "--no-rknn" ] && RKNN=0
  [ "$(id -u)" = 0 ] || { echo "benchmarks/arm.sh: run as root (apt-get, debootstrap, chroot)" >&2; exit 2; }
  mkdir -p "$CACHE" "$LAST"
  host_tools
  make_root
  mount_root
  x86_python
  fetch_wheels
  x86_side
  arm_install
  arm_checks
  report
  [ "$KTESTS" = 0 ] && [ "$LANE" = 0 ] && [ "$RK" = 0 ] && [ "$CMP" = 0 ]
}

main "$@"; exit # one line: bash has parsed every function before main runs, and reads nothing after it
