#!/usr/bin/env bash
# The README's PTB rows that `hlbl reproduce` does not write: HLBL on a RANDOM and on a Huffman
# tree trained by `hlbl train` (one thread: deterministic), and the HLBL x4 + KN5 mixture.
#
#   bash bench/ptb_runs.sh                                # ~3 minutes; PTB from $HLBL_DATA or the cache
#   WORK=runs/reproduce-ptb bash bench/ptb_runs.sh     # where `hlbl reproduce --work` left its runs
#   bash bench/ptb_runs.sh --quick      # a check of the script: one epoch of a synthetic corpus each
#
# Writes results/ptb_train/{random,huffman}.txt (the command's output: perplexities, test token
# count, top words, sample) with each run's metrics.jsonl, and x4_kn5.json (`hlbl eval` of the
# reproduction's x4 run mixed with KN5, weight tuned on valid) when that run exists. Quick mode
# (bench/_common.sh) trains the RANDOM row only, writes under a temporary directory and mixes that
# run with KN5 instead.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
DATA=ptb EPOCHS=() RESULTS=${RESULTS:-results/ptb_train} TREES="random huffman"
WORK=${WORK:-runs/reproduce-ptb}
if [ -n "$QUICK" ]; then
  DATA=$QDATA EPOCHS=(--epochs 1) RESULTS=$BENCH_OUT/ptb_train WORK=$BENCH_OUT/reproduce TREES=random
fi
mkdir -p "$RESULTS" "$RUNS_DIR"
for tree in $TREES; do
  rm -rf "$RUNS_DIR/ptb-$tree"
  hlbl train --data "$DATA" --tree "$tree" --out "$RUNS_DIR/ptb-$tree" --threads 1 --quiet "${EPOCHS[@]}" > "$RESULTS/$tree.txt"
  cp "$RUNS_DIR/ptb-$tree/metrics.jsonl" "$RESULTS/$tree.metrics.jsonl"
  cat "$RESULTS/$tree.txt"
done
hlbl ngram train --data "$DATA" --order 5 --out "$RUNS_DIR/kn5.arpa"
if [ -n "$QUICK" ]; then  # no reproduction here: the mixture step with the RANDOM run
  hlbl eval "$RUNS_DIR/ptb-random" --interpolate "$RUNS_DIR/kn5.arpa" --weight auto | tee "$RESULTS/x4_kn5.json"
elif [ -d "$WORK/runs/T7" ]; then
  hlbl eval "$WORK/runs/T7" --interpolate "$RUNS_DIR/kn5.arpa" --weight auto | tee "$RESULTS/x4_kn5.json"
else
  echo "no $WORK/runs/T7 (run hlbl reproduce first, or set WORK): the mixture is skipped" >&2
fi
