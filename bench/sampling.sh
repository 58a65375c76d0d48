#!/usr/bin/env bash
# The PTB runs of results/sampling: the LBL with NCE and sampled-softmax output layers, k = 5, 25,
# 100 noise words, the default recipe (momentum SGD, lr 1e-3 then 3e-5, early stopping), one
# thread, one run after another (k = 25 first), then the table.
#
#   HLBL_DATA=../shared/data bash bench/sampling.sh            # a few minutes to ~30 per run
#   RUNS="nce-25 sampled-25" bash bench/sampling.sh            # a subset
#
# Each run trains in runs/sampling/<name> (checkpoints: not committed); its metrics.jsonl, the
# command's output (perplexities, self-normalisation) and the command line are copied to
# results/sampling/<name>.{metrics.jsonl,txt}. Then `bench/sampling.py speed` measures training
# words/s side by side with the flat LBL, and `bench/sampling.py table` writes
# results/sampling/sampling.{md,json}.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-results/sampling}
WORK=${WORK:-runs/sampling}
RUNS=${RUNS:-"nce-25 sampled-25 nce-5 nce-100 sampled-5 sampled-100"}
mkdir -p "$RESULTS" "$WORK"
for name in $RUNS; do
  kind=${name%%-*}; rest=${name#*-}; k=${rest%%-*}
  extra=()
  case "$rest" in *-a*) extra=(--noise-power "${rest#*-a}");; esac  # e.g. nce-25-a0.75
  cmd=(python -m hlbl train --data ptb --output "$kind" --samples "$k" "${extra[@]}" --out "$WORK/$name" --threads 1 --quiet)
  if [ -f "$WORK/$name/state.json" ]; then cmd+=(--resume); fi
  echo "${cmd[*]}" | sed 's/ --resume$//' > "$RESULTS/$name.command.txt"
  "${cmd[@]}" > "$RESULTS/$name.txt"
  cp "$WORK/$name/metrics.jsonl" "$RESULTS/$name.metrics.jsonl"
  cp "$RESULTS/$name.command.txt" "$WORK/$name/command.txt"
  cat "$RESULTS/$name.txt"
done
if [ -z "${NO_SPEED:-}" ]; then
  python bench/sampling.py speed --threads 1 --rounds 5 --out "$RESULTS/speed.json"
fi
python bench/sampling.py table --runs "$WORK" --out "$RESULTS"
