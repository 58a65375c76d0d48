#!/usr/bin/env bash
# What Hogwild threads do to learning, on real data: 3 epochs of HLBL (RANDOM tree, default
# recipe) on PTB with the fast engine, exact (--hogwild 1) once and with 2 lock-free threads
# (--hogwild 2) twice (they are not reproducible), then the valid perplexities side by side.
#
#   bash bench/hogwild.sh      # ~3 minutes
#
# Writes results/hogwild/{exact,hogwild2-a,hogwild2-b}.metrics.jsonl and SUMMARY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-results/hogwild}
mkdir -p "$RESULTS" runs
for run in exact hogwild2-a hogwild2-b; do
  threads=$([ "$run" = exact ] && echo 1 || echo 2)
  rm -rf "runs/hogwild-$run"
  hlbl train --data ptb --tree random --epochs 3 --hogwild "$threads" --threads 2 --quiet \
    --out "runs/hogwild-$run" > /dev/null
  cp "runs/hogwild-$run/metrics.jsonl" "$RESULTS/$run.metrics.jsonl"
done
python - "$RESULTS" > "$RESULTS/SUMMARY.md" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
names = ("exact", "hogwild2-a", "hogwild2-b")
runs = {n: [json.loads(x) for x in (root / f"{n}.metrics.jsonl").read_text().splitlines()] for n in names}
print("Produced by `bash bench/hogwild.sh` (PTB, RANDOM tree, default recipe, fast engine, 3 epochs).\n")
print("| epoch | valid ppl, exact (1 thread) | valid ppl, 2 Hogwild threads (run a) | (run b) | words/s, exact | words/s, 2 threads (a) |")
print("|---|---|---|---|---|---|")
for e, a, b in zip(*(runs[n] for n in names)):
    print(f"| {e['epoch']} | {e['valid_ppl']:.2f} | {a['valid_ppl']:.2f} | {b['valid_ppl']:.2f} "
          f"| {e['words_per_sec']:,.0f} | {a['words_per_sec']:,.0f} |")
PY
cat "$RESULTS/SUMMARY.md"
