#!/usr/bin/env bash
# The PTB runs of results/sampling: the LBL with NCE and sampled-softmax output layers, k = 5, 25,
# 100 noise words, the default recipe (momentum SGD, lr 1e-3 then 3e-5, early stopping), one
# thread, one run after another (k = 25 first), then the table.
#
#   HLBL_DATA=../shared/data bash bench/sampling.sh            # a few minutes to ~30 per run
#   RUNS="nce-25 sampled-25" bash bench/sampling.sh            # a subset
#   bash bench/sampling.sh --quick      # a check of the script: NCE k = 5, one epoch of a synthetic corpus
#
# Each run trains in runs/sampling/<name> (checkpoints: not committed); its metrics.jsonl, the
# command's output (perplexities, self-normalisation) and the command line are copied to
# results/sampling/<name>.{metrics.jsonl,txt}. Then `bench/sampling.py speed` measures training
# words/s side by side with the flat LBL, and `bench/sampling.py table` writes
# results/sampling/sampling.{md,json}. Quick mode (bench/_common.sh): the run nce-5 for one epoch
# of a synthetic corpus, then speed and table on it (`bench/sampling.py --quick` sizes), all under
# a temporary directory.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
DATA=ptb RESULTS=${RESULTS:-results/sampling}
WORK=${WORK:-runs/sampling}
RUNS=${RUNS:-"nce-25 sampled-25 nce-5 nce-100 sampled-5 sampled-100"}
SPEED=(--threads 1 --rounds 5)
if [ -n "$QUICK" ]; then
  DATA=$QDATA RESULTS=$BENCH_OUT/sampling WORK=$RUNS_DIR/sampling RUNS=nce-5
  SPEED=(--threads 1 --rounds 1 --tokens 2000 --flat-tokens 1000 --samples 5 --steps 3 --data "$QDATA")
fi
mkdir -p "$RESULTS" "$WORK"
for name in $RUNS; do
  kind=${name%%-*}; rest=${name#*-}; k=${rest%%-*}
  extra=()
  case "$rest" in *-a*) extra=(--noise-power "${rest#*-a}");; esac  # e.g. nce-25-a0.75
  if [ -n "$QUICK" ]; then extra+=(--epochs 1); fi
  cmd=(python -m hlbl train --data "$DATA" --output "$kind" --samples "$k" "${extra[@]}" --out "$WORK/$name" --threads 1 --quiet)
  if [ -f "$WORK/$name/state.json" ]; then cmd+=(--resume); fi
  echo "${cmd[*]}" | sed 's/ --resume$//' > "$RESULTS/$name.command.txt"
  "${cmd[@]}" > "$RESULTS/$name.txt"
  cp "$WORK/$name/metrics.jsonl" "$RESULTS/$name.metrics.jsonl"
  cp "$RESULTS/$name.command.txt" "$WORK/$name/command.txt"
  cat "$RESULTS/$name.txt"
done
if [ -z "${NO_SPEED:-}" ]; then
  python bench/sampling.py speed "${SPEED[@]}" --out "$RESULTS/speed.json"
fi
python bench/sampling.py table --runs "$WORK" --out "$RESULTS"
