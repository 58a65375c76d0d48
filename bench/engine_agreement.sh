#!/usr/bin/env bash
# The claim (docs/engine.md) that the fast engine takes the PyTorch path's steps, on real data: 3 epochs
# of HLBL (RANDOM tree, default recipe, one thread) on PTB with each engine, then their valid
# perplexities and times side by side.
#
#   bash bench/engine_agreement.sh      # ~4 minutes (the torch engine is the slow one)
#
# Writes results/engines/{fast,torch}.txt (each run's printed result) and .metrics.jsonl, and
# SUMMARY.md with the per-epoch valid perplexities and training minutes of both.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-results/engines}
mkdir -p "$RESULTS" runs
for engine in fast torch; do
  rm -rf "runs/engine-$engine"
  hlbl train --data ptb --tree random --epochs 3 --engine "$engine" --threads 1 --quiet \
    --out "runs/engine-$engine" > "$RESULTS/$engine.txt"
  cp "runs/engine-$engine/metrics.jsonl" "$RESULTS/$engine.metrics.jsonl"
done
python - "$RESULTS" > "$RESULTS/SUMMARY.md" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
runs = {e: [json.loads(x) for x in (root / f"{e}.metrics.jsonl").read_text().splitlines()] for e in ("fast", "torch")}
print("Produced by `bash bench/engine_agreement.sh` (PTB, RANDOM tree, default recipe, 3 epochs, 1 thread).\n")
print("| epoch | valid ppl, fast | valid ppl, torch | relative difference | minutes, fast | minutes, torch |")
print("|---|---|---|---|---|---|")
for f, t in zip(runs["fast"], runs["torch"]):
    print(f"| {f['epoch']} | {f['valid_ppl']:.8f} | {t['valid_ppl']:.8f} | {abs(f['valid_ppl'] / t['valid_ppl'] - 1):.1e} "
          f"| {f['epoch_minutes']:.2f} | {t['epoch_minutes']:.2f} |")
PY
cat "$RESULTS/SUMMARY.md"
