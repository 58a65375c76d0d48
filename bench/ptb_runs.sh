#!/usr/bin/env bash
# The README's PTB rows that `hlbl reproduce` does not write: HLBL on a RANDOM and on a Huffman
# tree trained by `hlbl train` (one thread: deterministic), and the HLBL x4 + KN5 mixture.
#
#   bash bench/ptb_runs.sh                                # ~3 minutes; PTB from $HLBL_DATA or the cache
#   WORK=runs/reproduce-ptb bash bench/ptb_runs.sh     # where `hlbl reproduce --work` left its runs
#
# Writes results/ptb_train/{random,huffman}.txt (the command's output: perplexities, test token
# count, top words, sample) with each run's metrics.jsonl, and x4_kn5.json (`hlbl eval` of the
# reproduction's x4 run mixed with KN5, weight tuned on valid) when that run exists.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-results/ptb_train}
WORK=${WORK:-runs/reproduce-ptb}
mkdir -p "$RESULTS" runs
for tree in random huffman; do
  rm -rf "runs/ptb-$tree"
  hlbl train --data ptb --tree "$tree" --out "runs/ptb-$tree" --threads 1 --quiet > "$RESULTS/$tree.txt"
  cp "runs/ptb-$tree/metrics.jsonl" "$RESULTS/$tree.metrics.jsonl"
  cat "$RESULTS/$tree.txt"
done
hlbl ngram train --data ptb --order 5 --out runs/kn5.arpa
if [ -d "$WORK/runs/T7" ]; then
  hlbl eval "$WORK/runs/T7" --interpolate runs/kn5.arpa --weight auto | tee "$RESULTS/x4_kn5.json"
else
  echo "no $WORK/runs/T7 (run hlbl reproduce first, or set WORK): the mixture is skipped" >&2
fi
