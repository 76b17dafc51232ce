#!/usr/bin/env bash
# One plan's `qtts bench` row from an older commit (its code and its own plan cache) and from this
# checkout, alternated in fresh processes: what the product of that day did against what it does
# now, on the same machine within minutes (docs/performance.md, "The bf16 vocoder"). Run it on an
# IDLE machine from the repository root:
#
#     bash benchmarks/ab_commits.sh REV OLD_CACHE MODEL [PAIRS] [FRAMES] [PLAN]
#     bash benchmarks/ab_commits.sh bd5d3d2 /tmp/oldcache /tmp/full06 8 64 fast
#
# REV is checked out once into /tmp/qtts-ab-REV (a git worktree); OLD_CACHE is a QTTS_CACHE holding
# the plan REV built (`cd /tmp/qtts-ab-REV && QTTS_CACHE=OLD_CACHE PYTHONPATH=src python -m qtts cache
# build -m MODEL --plan fast`); this checkout uses $QTTS_CACHE (default ~/.cache/qtts). Neither side
# builds (--no-build). Prints each side's row per pair, then every pair's RTF ratio (new / old).
set -euo pipefail
REV=${1:?usage: ab_commits.sh REV OLD_CACHE MODEL [PAIRS] [FRAMES] [PLAN]}
OLD_CACHE=${2:?the QTTS_CACHE that holds the plan REV built}
MODEL=${3:?a checkpoint folder}
PAIRS=${4:-8}
FRAMES=${5:-64}
PLAN=${6:-fast}
PY=${PY:-$PWD/.venv/bin/python}
OLD=/tmp/qtts-ab-$REV
[ -d "$OLD/src/qtts" ] || git worktree add -f "$OLD" "$REV" >/dev/null
OUT=$(mktemp)

row() {  # SIDE DIR CACHE
    (cd "$2" && QTTS_CACHE=$3 PYTHONPATH=src "$PY" -m qtts bench -m "$MODEL" --no-build --plan "$PLAN" \
        --frames "$FRAMES" --repeats 3 --threads 2 2>&1 | grep -E "^\| $PLAN" | sed "s/^/$1 /") | tee -a "$OUT"
}

for _ in $(seq "$PAIRS"); do
    row old "$OLD" "$OLD_CACHE"
    row new "$PWD" "${QTTS_CACHE:-$HOME/.cache/qtts}"
done
echo "RTF old, new, new / old per pair:"
awk -F'|' '{print $8}' "$OUT" | paste - - | awk '{printf "%s %s %.3f\n", $1, $2, $2 / $1}' | sort -k3 -n
rm -f "$OUT"
