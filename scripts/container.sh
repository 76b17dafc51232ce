#!/usr/bin/env bash
# Build the qtts images (Dockerfile) and check them end to end on this machine (docs/container.md):
# a tiny random checkpoint -> the `plan` image builds its int8 ONNX plan into a volume -> the
# runtime image serves it on 127.0.0.1 -> GET /health and one POST /v1/audio/speech (must be WAV)
# -> the Wyoming service answers `describe`. Everything it starts is removed at the end; the images
# stay (--rmi removes them too). --compose: then the same checks on compose.yaml's three services,
# run by podman-compose (installed with apt if missing). Not part of CI: a first run takes minutes.
#
# Podman with runc and cgroupfs, ulimits at or below the current ones, a local Debian base image
# (debootstrap) and wheels downloaded on the host: the recipe for hosts where base-image registries
# are unreachable and pip cannot verify TLS inside a build. Environment:
#   QTTS_BASE         base image to use instead of building localhost/debian-base:bookworm
#   QTTS_TORCH        torch requirement of the plan image (default: torch)
#   QTTS_TORCH_INDEX  where CPU torch wheels come from (default https://download.pytorch.org/whl/cpu;
#                     unreachable: QTTS_TORCH must name a CPU wheel pip finds elsewhere, e.g. torch==2.13.0+cpu)
#   QTTS_ONLINE=1     let pip inside the build use the package index (no host wheel download)
set -euo pipefail
cd "$(dirname "$0")/.."

RMI=0
COMPOSE=0
for arg in "$@"; do
  case "$arg" in
    --rmi) RMI=1 ;;
    --compose) COMPOSE=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "scripts/container.sh: unknown argument $arg (use --compose, --rmi or --help)" >&2; exit 2 ;;
  esac
done

BASE=${QTTS_BASE:-localhost/debian-base:bookworm}
IMAGE=localhost/qtts:dev
PLAN_IMAGE=localhost/qtts-plan:dev
TORCH=${QTTS_TORCH:-torch}
TORCH_INDEX=${QTTS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1000:1000)
P=(podman --runtime runc --cgroup-manager cgroupfs)
WHEELS=.wheels
TAG=qtts-check-$$
T0=$(date +%s)
STEPS=()

say() { echo "container.sh: $*"; }
die() { echo "container.sh: error: $*" >&2; exit "${2:-1}"; }
now() { date +%s.%N; }
lap() {  # lap NAME START: say and keep how long step NAME took
  local s; s=$(awk -v a="$2" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  STEPS+=("$1 $s s"); say "$1: $s s"
}

# -- prerequisites: say what will be installed before spending minutes ------------------------------
missing=()
for tool in podman runc curl python3; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ $COMPOSE = 1 ] && ! command -v podman-compose >/dev/null 2>&1; then missing+=(podman-compose); fi
if [ -z "${QTTS_BASE:-}" ] && ! command -v debootstrap >/dev/null 2>&1; then missing+=(debootstrap); fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]}) and run again" 2
  fi
  say "installing with apt-get: ${missing[*]} (about 1 min)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
fi
need_base=0
"${P[@]}" image exists "$BASE" || need_base=1
need_wheels=0
# the download is redone when pyproject.toml, the torch requirement or the base image change
wheels_key=$( (cat pyproject.toml; echo "$TORCH $BASE") | sha256sum | cut -c1-16)
[ -n "${QTTS_ONLINE:-}" ] || [ "$(cat "$WHEELS/.complete" 2>/dev/null)" = "$wheels_key" ] || need_wheels=1
say "this run will:"
[ $need_base = 1 ] && say "  - build the base image $BASE with debootstrap (Debian bookworm minbase + python3; ~1.5 min, ~200 MB)"
[ $need_wheels = 1 ] && say "  - download wheels into $WHEELS/ (torch CPU + onnx + runtime deps, ~260 MB)"
say "  - build $IMAGE and $PLAN_IMAGE (first time: a few minutes), start containers on 127.0.0.1, then remove them"
[ $COMPOSE = 1 ] && say "  - run compose.yaml's services with podman-compose (tags the images qtts:latest, qtts-plan:latest)"

# -- base image ---------------------------------------------------------------------------------------
if [ $need_base = 1 ]; then
  [ "$(id -u)" = 0 ] || die "building $BASE needs root (debootstrap); run as root or set QTTS_BASE" 2
  t=$(now)
  rootfs=$(mktemp -d /tmp/qtts-rootfs.XXXXXX)
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" >/dev/null
  # what python:3.12-slim leaves out too: package caches and lists, docs, man pages
  rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
         "$rootfs"/usr/share/man/* "$rootfs"/var/log/*
  tar -C "$rootfs" -c . | "${P[@]}" import - "$BASE" >/dev/null
  rm -rf "$rootfs"
  lap base "$t"
fi
PYV=$("${P[@]}" run --rm "${ULIMITS[@]}" "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
say "base image $BASE: Python $PYV"

# -- wheels on the host (pip in a build cannot verify TLS here) ---------------------------------------
build_args=(--build-arg "BASE=$BASE")
if [ -z "${QTTS_ONLINE:-}" ]; then
  build_args+=(--build-arg "WHEELS=$WHEELS")
  if [ $need_wheels = 1 ]; then
    t=$(now)
    rm -rf "$WHEELS"; mkdir -p "$WHEELS"
    # the project's own requirements (core + serve + wyoming + export without torch) and its build backend
    mapfile -t reqs < <(python3 - <<'PY'
try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip vendors
    from pip._vendor import tomli as tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
reqs = list(p["project"]["dependencies"]) + list(p["build-system"]["requires"])
for extra in ("serve", "wyoming", "export"):
    reqs += p["project"]["optional-dependencies"][extra]
print("\n".join(sorted({r for r in reqs if not r.startswith("torch")})))
PY
    )
    pipdl=(python3 -m pip download -q -d "$WHEELS" --only-binary=:all: --python-version "$PYV")
    if curl -sSf -m 10 -o /dev/null "$TORCH_INDEX/torch/" 2>/dev/null; then
      "${pipdl[@]}" --index-url "$TORCH_INDEX" "$TORCH"
    else
      say "$TORCH_INDEX is unreachable: taking $TORCH from pip's configured sources"
      "${pipdl[@]}" "$TORCH"
    fi
    ls "$WHEELS" | grep -q '^torch-.*+cpu' \
      || die "the torch wheel in $WHEELS is not a CPU build ($(ls "$WHEELS" | grep '^torch-' || echo none)); set QTTS_TORCH=torch==VERSION+cpu"
    "${pipdl[@]}" "${reqs[@]}"
    echo "$wheels_key" > "$WHEELS/.complete"
    lap wheels "$t"
  fi
  say "wheels: $(du -sh "$WHEELS" | cut -f1) in $WHEELS/"
else
  build_args+=(--build-arg "TORCH=$TORCH" --build-arg "TORCH_INDEX=$TORCH_INDEX")
fi

# -- images -------------------------------------------------------------------------------------------
t=$(now)
"${P[@]}" build -q "${ULIMITS[@]}" "${build_args[@]}" -t "$IMAGE" . >/dev/null
lap "build runtime" "$t"
t=$(now)
"${P[@]}" build -q "${ULIMITS[@]}" "${build_args[@]}" --target plan -t "$PLAN_IMAGE" . >/dev/null
lap "build plan" "$t"

# -- run: checkpoint, plan, server, wyoming ----------------------------------------------------------
work=$(mktemp -d /tmp/qtts-container.XXXXXX)
chmod 755 "$work"
cleanup() {
  "${P[@]}" rm -f -v "$TAG-serve" "$TAG-wyoming" "${TAG}_plan_1" "${TAG}_qtts_1" "${TAG}_wyoming_1" >/dev/null 2>&1 || true
  "${P[@]}" volume rm -f "$TAG-cache" "$TAG-voices" "${TAG}_cache" "${TAG}_voices" >/dev/null 2>&1 || true
  "${P[@]}" network rm -f "${TAG}_default" >/dev/null 2>&1 || true
  rm -rf "$work"
  if [ $RMI = 1 ]; then "${P[@]}" rmi -f "$IMAGE" "$PLAN_IMAGE" localhost/qtts:latest localhost/qtts-plan:latest >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
mkdir -p "$work/models"
run=("${P[@]}" run --rm "${ULIMITS[@]}")
mounts=(-v "$work/models:/models:ro" -v "$TAG-cache:/cache")

t=$(now)
"${run[@]}" --user 0 -v "$work/models:/models" --entrypoint python3 "$PLAN_IMAGE" \
  -m qtts random-checkpoint /models/tiny --kind custom_voice
lap checkpoint "$t"
t=$(now)
"${run[@]}" "${mounts[@]}" -e QTTS_MODEL=/models/tiny "$PLAN_IMAGE"
lap plan "$t"
t=$(now)
"${run[@]}" "${mounts[@]}" -e QTTS_MODEL=/models/tiny "$PLAN_IMAGE"   # second start: finds the bundle
lap "plan again" "$t"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_health() {  # wait_health CONTAINER PORT: until /health is 200 (bounded), then say its answer
  for _ in $(seq 120); do
    curl -sf -m 5 -o /dev/null "http://127.0.0.1:$2/health" && break
    "${P[@]}" container exists "$1" || break
    sleep 1
  done
  health=$(curl -sfS -m 5 "http://127.0.0.1:$2/health") || { "${P[@]}" logs "$1" 2>&1 | tail -20; die "$1: no /health answer"; }
  say "GET /health -> $health"
}
check_speech() {  # check_speech CONTAINER PORT: one POST /v1/audio/speech, must answer a WAV
  local code magic bytes t; t=$(now)
  code=$(curl -sS -m 120 -o "$work/speech.wav" -w '%{http_code}' "http://127.0.0.1:$2/v1/audio/speech" \
    -H 'Content-Type: application/json' \
    -d '{"model": "qtts", "input": "Hello from a container.", "voice": "vivian", "response_format": "wav", "max_frames": 40}')
  lap "speech ($1)" "$t"
  magic=$(head -c 12 "$work/speech.wav" | tr -c 'A-Za-z' '.')
  bytes=$(wc -c < "$work/speech.wav")
  say "POST /v1/audio/speech -> HTTP $code, $bytes bytes, starts with $magic"
  [ "$code" = 200 ] && [ "${magic:0:4}" = RIFF ] && [ "${magic:8:4}" = WAVE ] \
    || { "${P[@]}" logs "$1" 2>&1 | tail -20; die "$1: the speech answer is not a WAV"; }
  python3 - "$work/speech.wav" <<'PY'
import os, sys, wave
with wave.open(sys.argv[1]) as w:  # a streamed WAV's header has no length: count the bytes after it
    rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
samples = (os.path.getsize(sys.argv[1]) - 44) // (width * channels)
print(f"container.sh: speech: {samples / rate:.2f} s of audio, {rate} Hz, {channels} channel(s), {8 * width}-bit")
PY
}
check_wyoming() {  # check_wyoming CONTAINER PORT: `describe` must answer `info` (bounded wait)
  python3 - "$2" <<'PY' || { "${P[@]}" logs "$1" 2>&1 | tail -20; die "$1: the Wyoming service did not answer describe"; }
import json, socket, sys, time
deadline = time.monotonic() + 120
while True:  # the service listens once the plan is loaded
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
        s.sendall(b'{"type": "describe"}\n')
        header = json.loads(s.makefile("rb").readline())
        break
    except (OSError, ValueError):
        if time.monotonic() > deadline:
            raise
        time.sleep(1)
assert header["type"] == "info", header
print(f"container.sh: Wyoming describe -> {header['type']} event")
PY
}

port=$(free_port)
t=$(now)
"${P[@]}" run -d --name "$TAG-serve" "${ULIMITS[@]}" -p "127.0.0.1:$port:8000" "${mounts[@]}" \
  -v "$TAG-voices:/voices" "$IMAGE" serve --model /models/tiny --plan /cache/tiny-int8/plan.json \
  --host 0.0.0.0 --voices /voices >/dev/null
wait_health "$TAG-serve" "$port"
lap "serve ready" "$t"
check_speech "$TAG-serve" "$port"
say "the server runs as user '$("${P[@]}" exec "$TAG-serve" id -un)'"
"${P[@]}" rm -f -v "$TAG-serve" >/dev/null

wport=$(free_port)
t=$(now)
"${P[@]}" run -d --name "$TAG-wyoming" "${ULIMITS[@]}" -p "127.0.0.1:$wport:10200" "${mounts[@]}" \
  -v "$TAG-voices:/voices:ro" "$IMAGE" wyoming --model /models/tiny --plan /cache/tiny-int8/plan.json \
  --uri tcp://0.0.0.0:10200 --voices /voices >/dev/null
check_wyoming "$TAG-wyoming" "$wport"
lap "wyoming ready" "$t"
"${P[@]}" rm -f -v "$TAG-wyoming" >/dev/null

# -- --compose: compose.yaml itself, through podman-compose --------------------------------------------
if [ $COMPOSE = 1 ]; then
  # podman-compose calls plain `podman`: runc, cgroupfs and the ulimits come from a containers.conf
  printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n' \
    > "$work/containers.conf"
  export CONTAINERS_CONF=$work/containers.conf QTTS_MODEL=tiny QTTS_PORT=$(free_port) QTTS_WYOMING_PORT=$(free_port)
  "${P[@]}" tag "$IMAGE" localhost/qtts:latest
  "${P[@]}" tag "$PLAN_IMAGE" localhost/qtts-plan:latest
  cp compose.yaml "$work/compose.yaml"   # ./models beside it: the tiny checkpoint
  compose=(podman-compose -f "$work/compose.yaml" -p "$TAG")
  t=$(now)
  # podman-compose 1.0 starts services without waiting for depends_on conditions: plan first
  "${compose[@]}" up -d plan >/dev/null 2>&1
  for _ in $(seq 300); do
    [ "$("${P[@]}" inspect -f '{{.State.Status}}' "${TAG}_plan_1")" = exited ] && break
    sleep 1
  done
  "${P[@]}" logs "${TAG}_plan_1" 2>&1 | grep '^qtts-plan'
  [ "$("${P[@]}" inspect -f '{{.State.ExitCode}}' "${TAG}_plan_1")" = 0 ] || die "compose: the plan service failed"
  lap "compose plan" "$t"
  t=$(now)
  "${compose[@]}" up -d >/dev/null 2>&1
  wait_health "${TAG}_qtts_1" "$QTTS_PORT"
  lap "compose qtts ready" "$t"
  "${P[@]}" healthcheck run "${TAG}_qtts_1" >/dev/null 2>&1 || die "compose: the qtts health check failed"
  say "compose: the qtts service's health check passes"
  check_speech "${TAG}_qtts_1" "$QTTS_PORT"
  check_wyoming "${TAG}_wyoming_1" "$QTTS_WYOMING_PORT"
  "${P[@]}" ps -a --format '  {{.Names}} {{.Status}}' | grep "$TAG"
fi

# -- report -------------------------------------------------------------------------------------------
say "images:"
"${P[@]}" images --format '  {{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "qtts|debian-base" || true
say "timings: $(IFS=';'; echo "${STEPS[*]}" | sed 's/;/; /g')"
say "OK in $(( $(date +%s) - T0 )) s"
