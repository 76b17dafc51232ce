#!/usr/bin/env bash
# The issue-10 table in one go (docs/history/performance.md, "Two cores, 1-frame first chunk, shared vocoder
# weights"): official fp32, qtts int4 and int8 (pipelined and serial), the qwentts.cpp peer, the 1.7B
# rows, peak RSS per plan in fresh processes, and the vocoder fidelity gate. Run it on an IDLE machine
# from the repository root (it takes ~1 h on the 2-core VM, most of it exports and the official code):
#
#     bash benchmarks/same_run_table.sh [WORKDIR]          # default WORKDIR /tmp/bench10
#
# Checkpoints: $M06 / $M17 (default WORKDIR/full06, WORKDIR/full17) are made when missing, with the real
# Qwen2 tokenizer (the peer needs merges). Output: WORKDIR/table.md (the same-run table), WORKDIR/rss.txt,
# WORKDIR/verify-*.md, docs/performance-same-run.png.
set -euo pipefail
W=${1:-/tmp/bench10}
M06=${M06:-$W/full06}
M17=${M17:-$W/full17}
TOK=${TOK:-tests/data/reference/configs/text-tokenizer-qwen2}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=.venv/bin/python
QTTS="$PY -m qtts"
mkdir -p "$W"

checkpoint() {  # OUT LAYOUT
    [ -f "$1/config.json" ] || $QTTS random-checkpoint "$1" --size full --kind base --layout "$2" --tokenizer "$TOK"
}
bundle() {  # MODEL OUT WEIGHTS: every component (talker, predictor, vocoder B=1 + B=8 sharing one weight file, encoders)
    [ -f "$2/plan.json" ] || $QTTS export onnx -m "$1" -o "$2" --weights "$3"
}

checkpoint "$M06" 0.6b
checkpoint "$M17" 1.7b
for w in int4 int8; do
    bundle "$M06" "$W/b06-$w" "$w"
    bundle "$M17" "$W/b17-$w" "$w"
done

# fidelity: the vocoder rows of these plans must stay >= 80 dB against torch fp32
for w in int4 int8; do
    $QTTS verify plan -m "$M06" --plan "$W/b06-$w/plan.json" --report "$W/verify-06-$w.md" >/dev/null || true
done

# peak RSS per plan, each in a fresh process (load, warm-up-free 16-frame pipelined run)
: >"$W/rss.txt"
for b in b06-int4 b06-int8 b17-int4 b17-int8; do
    m=$M06; [[ $b == b17-* ]] && m=$M17
    $PY benchmarks/perf/plan_rss.py --model "$m" --plan "$W/$b/plan.json" --frames 16 | tee -a "$W/rss.txt"
done

# the same-run table: qtts plans pipelined and serial + the official code, then the peer, then 1.7B
$QTTS bench -m "$M06" --plan "$W/b06-int4/plan.json" --plan "$W/b06-int8/plan.json" --pipeline both \
    --frames 64 --repeats 3 --threads 2 --compare-official --json "$W/bench06.json"
if [ ! -x .venv-peer/bin/python ]; then bash scripts/setup_peer_env.sh; fi
.venv-peer/bin/python benchmarks/peer_gguf.py "$M06" "$W/peer" --type Q4_K_M Q8_0
.venv-peer/bin/python benchmarks/bench_peer.py run --gguf-dir "$W/peer" --type Q4_K_M Q8_0 \
    --frames 64 --repeats 3 --threads 2 --idle-gate 0.1 --json "$W/peer.json" || echo "peer: no rows (see above)"
$QTTS bench -m "$M17" --plan "$W/b17-int4/plan.json" --plan "$W/b17-int8/plan.json" --pipeline on \
    --frames 64 --repeats 3 --threads 2 --json "$W/bench17.json"
files=("$W/bench06.json")
[ -f "$W/peer.json" ] && files+=("$W/peer.json")
files+=("$W/bench17.json")
$PY benchmarks/bench_peer.py table "${files[@]}" --plot docs/performance-same-run.png | tee "$W/table.md"
grep -h "vocoder" "$W"/verify-06-*.md | head -n 8 || true
