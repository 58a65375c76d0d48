#!/usr/bin/env bash
# What Hogwild threads do to learning, on real data: 3 epochs of HLBL (RANDOM tree, default
# recipe) on PTB with the fast engine, exact (--hogwild 1) once and with 2 lock-free threads
# (--hogwild 2) twice (they are not reproducible), then the valid perplexities side by side.
#
#   bash bench/hogwild.sh      # ~3 minutes
#   bash bench/hogwild.sh --quick   # a check of the script: one epoch of a synthetic corpus each
#
# Writes results/hogwild/{exact,hogwild2-a,hogwild2-b}.metrics.jsonl and SUMMARY.md (quick mode:
# under a temporary directory, see bench/_common.sh, and without the repeat hogwild2-b).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
DATA=ptb EPOCHS=3 RESULTS=${RESULTS:-results/hogwild} NAMES="exact hogwild2-a hogwild2-b"
if [ -n "$QUICK" ]; then DATA=$QDATA EPOCHS=1 RESULTS=$BENCH_OUT/hogwild NAMES="exact hogwild2-a"; fi
mkdir -p "$RESULTS" "$RUNS_DIR"
for run in $NAMES; do
  threads=$([ "$run" = exact ] && echo 1 || echo 2)
  rm -rf "$RUNS_DIR/hogwild-$run"
  hlbl train --data "$DATA" --tree random --epochs "$EPOCHS" --hogwild "$threads" --threads 2 --quiet \
    --out "$RUNS_DIR/hogwild-$run" > /dev/null
  cp "$RUNS_DIR/hogwild-$run/metrics.jsonl" "$RESULTS/$run.metrics.jsonl"
done
python - "$RESULTS" "$EPOCHS" > "$RESULTS/SUMMARY.md" <<'PY'
import json, sys
from pathlib import Path
root, epochs = Path(sys.argv[1]), sys.argv[2]
names = ("exact", "hogwild2-a", "hogwild2-b")
runs = {n: [json.loads(x) for x in (root / f"{n}.metrics.jsonl").read_text().splitlines()] for n in names[:2]}
b = root / "hogwild2-b.metrics.jsonl"  # (not in quick mode)
runs["hogwild2-b"] = [json.loads(x) for x in b.read_text().splitlines()] if b.is_file() else [{"valid_ppl": float("nan")}] * len(runs["exact"])
print(f"Produced by `bash bench/hogwild.sh` (PTB, RANDOM tree, default recipe, fast engine, {epochs} epochs).\n")
print("| epoch | valid ppl, exact (1 thread) | valid ppl, 2 Hogwild threads (run a) | (run b) | words/s, exact | words/s, 2 threads (a) |")
print("|---|---|---|---|---|---|")
for e, a, b in zip(*(runs[n] for n in names)):
    print(f"| {e['epoch']} | {e['valid_ppl']:.2f} | {a['valid_ppl']:.2f} | {b['valid_ppl']:.2f} "
          f"| {e['words_per_sec']:,.0f} | {a['words_per_sec']:,.0f} |")
PY
cat "$RESULTS/SUMMARY.md"
