#!/usr/bin/env bash
# The claim (docs/engine.md) that the fast engine takes the PyTorch path's steps, on real data: 3 epochs
# of HLBL (RANDOM tree, default recipe, one thread) on PTB with each engine, then their valid
# perplexities and times side by side.
#
#   bash bench/engine_agreement.sh      # ~4 minutes (the torch engine is the slow one)
#   bash bench/engine_agreement.sh --quick   # a check of the script: one epoch of a synthetic corpus
#
# Writes results/engines/{fast,torch}.txt (each run's printed result) and .metrics.jsonl, and
# SUMMARY.md with the per-epoch valid perplexities and training minutes of both (quick mode: under
# a temporary directory, see bench/_common.sh).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
DATA=ptb EPOCHS=3 RESULTS=${RESULTS:-results/engines}
if [ -n "$QUICK" ]; then DATA=$QDATA EPOCHS=1 RESULTS=$BENCH_OUT/engines; fi
mkdir -p "$RESULTS" "$RUNS_DIR"
for engine in fast torch; do
  rm -rf "$RUNS_DIR/engine-$engine"
  hlbl train --data "$DATA" --tree random --epochs "$EPOCHS" --engine "$engine" --threads 1 --quiet \
    --out "$RUNS_DIR/engine-$engine" > "$RESULTS/$engine.txt"
  cp "$RUNS_DIR/engine-$engine/metrics.jsonl" "$RESULTS/$engine.metrics.jsonl"
done
python - "$RESULTS" "$EPOCHS" > "$RESULTS/SUMMARY.md" <<'PY'
import json, sys
from pathlib import Path
root, epochs = Path(sys.argv[1]), sys.argv[2]
runs = {e: [json.loads(x) for x in (root / f"{e}.metrics.jsonl").read_text().splitlines()] for e in ("fast", "torch")}
print(f"Produced by `bash bench/engine_agreement.sh` (PTB, RANDOM tree, default recipe, {epochs} epochs, 1 thread).\n")
print("| epoch | valid ppl, fast | valid ppl, torch | relative difference | minutes, fast | minutes, torch |")
print("|---|---|---|---|---|---|")
for f, t in zip(runs["fast"], runs["torch"]):
    print(f"| {f['epoch']} | {f['valid_ppl']:.8f} | {t['valid_ppl']:.8f} | {abs(f['valid_ppl'] / t['valid_ppl'] - 1):.1e} "
          f"| {f['epoch_minutes']:.2f} | {t['epoch_minutes']:.2f} |")
PY
cat "$RESULTS/SUMMARY.md"
