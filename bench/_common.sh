# Sourced by the shell benchmarks (bench/*.sh): the repository root as the working directory, and
# quick mode, asked for by --quick as the script's first argument or by QUICK=1 in the environment.
#
# Quick mode is a check of the script itself, in seconds: it sets QUICK=1, BENCH_OUT (a temporary
# directory, $HLBL_BENCH_OUT if that is set; see bench/_common.py), HLBL_CACHE under it, QDATA (a
# small synthetic corpus written there) and RUNS_DIR (run directories there, not runs/). Each
# script then trains for an epoch on QDATA and writes its RESULTS under BENCH_OUT, never over
# results/. Normally RUNS_DIR is runs/ and QUICK is empty.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUICK=${QUICK:-}
if [ "${1:-}" = --quick ]; then
  QUICK=1
  shift
fi
RUNS_DIR=runs
if [ -n "$QUICK" ]; then
  BENCH_OUT=$(python bench/_common.py quick-dir)
  export HLBL_BENCH_OUT=$BENCH_OUT HLBL_CACHE=$BENCH_OUT/cache
  QDATA=$(python bench/_common.py corpus "$BENCH_OUT/corpus")
  RUNS_DIR=$BENCH_OUT/runs
  echo "quick mode: a synthetic corpus, one epoch a run, everything under $BENCH_OUT" >&2
fi
