#!/usr/bin/env bash
# The training recipe's checks (docs/reproduction.md) that no other script writes: the validation-set tuning of the
# default recipe on PTB (RANDOM tree) and the Brown --min-count comparison. One thread, so every
# number is deterministic under the seed and reruns give the same perplexities.
#
#   bash bench/recipe_checks.sh        # ~10 minutes; PTB and Brown from $HLBL_DATA or the cache
#   bash bench/recipe_checks.sh --quick    # a check of the script: two of the runs, one epoch of a synthetic corpus
#
# Writes results/recipe/SUMMARY.md (one row per run: the flags, valid and test perplexity, the
# vocabulary) and each run's printed JSON line and metrics.jsonl beside it. Tuning reads only
# the validation perplexity; test is printed by `hlbl train` and kept for the record. Quick mode
# (bench/_common.sh): the default run and brown-min1 only (the others differ by their flags),
# one epoch each on a synthetic corpus standing in for PTB and Brown, under a temporary directory.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
RESULTS=${RESULTS:-results/recipe}
if [ -n "$QUICK" ]; then RESULTS=$BENCH_OUT/recipe; fi
mkdir -p "$RESULTS" "$RUNS_DIR"
run() {  # run NAME DATA FLAGS...: train, keep the last JSON line and the metrics
  local name=$1 data=$2; shift 2
  local corpus=$data quick=()
  if [ -n "$QUICK" ]; then
    case $name in default | brown-min1) ;; *) return 0 ;; esac
    corpus=$QDATA quick=(--epochs 1)
  fi
  rm -rf "$RUNS_DIR/recipe-$name"
  hlbl train --data "$corpus" --out "$RUNS_DIR/recipe-$name" --threads 1 --quiet "$@" "${quick[@]}" > "$RESULTS/$name.txt"
  cp "$RUNS_DIR/recipe-$name/metrics.jsonl" "$RESULTS/$name.metrics.jsonl"
  python - "$RESULTS/$name.txt" "$RUNS_DIR/recipe-$name/vocab.json" "$name" "$data" "$*" >> "$RESULTS/SUMMARY.md" <<'PY'
import json, sys
path, vocab, name, data, flags = sys.argv[1:]
res = json.loads(next(l for l in open(path) if l.startswith("{")))
words = len(json.load(open(vocab))["words"])
unk = 100 * res["test_oov"] / res["test_tokens"]
print(f"| {name} | {data} | `{flags}` | {res['valid_perplexity']:.1f} | {res['test_perplexity']:.1f} | {words:,} | {unk:.1f}% |")
PY
  tail -1 "$RESULTS/SUMMARY.md"
}
{
  echo "Produced by \`bash bench/recipe_checks.sh\` at commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\`."
  echo
  echo "| run | data | flags | valid ppl | test ppl | words | test tokens read as <unk> |"
  echo "|---|---|---|---|---|---|---|"
} > "$RESULTS/SUMMARY.md"
run default ptb --tree random
run lr3e-3 ptb --tree random --lr 3e-3
run lr3e-4 ptb --tree random --lr 3e-4
run lrfinal1e-4 ptb --tree random --lr-final 1e-4
run lrfinal3e-4 ptb --tree random --lr-final 3e-4
run lrfinal1e-5 ptb --tree random --lr-final 1e-5
run l2x3 ptb --tree random --weight-decay-words 3e-4 --weight-decay 3e-5
run l2x0.3 ptb --tree random --weight-decay-words 3e-5 --weight-decay 3e-6
run brown-auto brown --tree random --epochs 2
run brown-min1 brown --tree random --epochs 2 --min-count 1
