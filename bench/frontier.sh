#!/usr/bin/env bash
# The PTB runs of the quality-vs-time frontier (results/ptb/frontier.md) that `hlbl reproduce`
# and bench/sampling.sh do not make, in order, then the table. One thread per run, seed 0, the
# default recipe unless a row says otherwise. Takes a few hours on one free core.
#
#   HLBL_DATA=../shared/data bash bench/frontier.sh
#   bash bench/frontier.sh --quick     # a check of the script: every step, one epoch of a synthetic corpus
#
# Quick mode (bench/_common.sh): every run trains one epoch on a synthetic corpus, run directories,
# rows, speeds and the table go under a temporary directory, and the speed step leaves out the
# class files that this script does not make.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
R=$RUNS_DIR DATA=ptb OUT=results/ptb EXTRA_CLASSES=() FLAGS=()
if [ -n "$QUICK" ]; then
  DATA=$QDATA OUT=$BENCH_OUT/frontier FLAGS=(--quick)
else
  EXTRA_CLASSES=(freq100=runs/freq100.json km100=runs/km100.json km100-it2=runs/km100-it2.json
    km100-it2-e01=runs/km100-it2-e01.json km100-it3-e01=runs/km100-it3-e01.json)
fi
ROWS=$OUT/frontier_runs.json
mkdir -p "$R/exp" "$R/trees" "$OUT"
T="hlbl train --data $DATA --threads 1"
SPEED_QUICK=()
if [ -n "$QUICK" ]; then T="$T --epochs 1" SPEED_QUICK=(--rounds 1 --tokens 2000 --flat-tokens 1000 --samples 5); fi
row() { python bench/frontier.py row --rows "$ROWS" "$@"; }

# The RANDOM-tree run whose word features seed every learned tree (the README's quickstart).
[ -e $R/ptb-random/state.json ] || $T --tree random --out $R/ptb-random
hlbl tree build --from $R/ptb-random --policy adaptive:0.4 --copies 4 --seed 7 --out $R/trees/x4.json
hlbl tree build --from $R/ptb-random --policy adaptive:0.4 --seed 7 --out $R/trees/a04.json
hlbl tree build --from $R/ptb-random --policy adaptive:0.4 --seed 7 --senses --out $R/trees/a04-senses.json
# (for the speed of the paper's other trees: the same rules over the same features)
hlbl tree build --from $R/ptb-random --policy balanced --seed 7 --out $R/trees/balanced.json
hlbl tree build --from $R/ptb-random --policy adaptive --seed 7 --out $R/trees/adaptive.json
hlbl tree build --from $R/ptb-random --policy adaptive:0.25 --seed 7 --out $R/trees/a025.json
hlbl tree build --from $R/ptb-random --policy adaptive:0.4 --copies 2 --seed 7 --out $R/trees/x2.json

# Recipe: the paper's two-rate schedule, the halving schedule, stronger L2 on C and the nodes.
$T --tree $R/trees/x4.json --out $R/exp/x4-tworate
$T --tree $R/trees/x4.json --lr-schedule halve --out $R/exp/x4-halve
$T --tree $R/trees/x4.json --weight-decay 1e-4 --out $R/exp/x4-wd1e-4

# Iterated bootstrap with warm start: rebuild from the last model, keep its R and C.
hlbl tree build --from $R/exp/x4-tworate --policy adaptive:0.4 --copies 4 --seed 8 --out $R/trees/x4-r1.json
$T --tree $R/trees/x4-r1.json --init-from $R/exp/x4-tworate --out $R/exp/x4-boot1
hlbl tree build --from $R/exp/x4-boot1 --policy adaptive:0.4 --copies 4 --seed 9 --out $R/trees/x4-r2.json
$T --tree $R/trees/x4-r2.json --init-from $R/exp/x4-boot1 --out $R/exp/x4-boot2
hlbl tree build --from $R/exp/x4-boot2 --policy adaptive:0.4 --copies 4 --seed 10 --out $R/trees/x4-r3.json
$T --tree $R/trees/x4-r3.json --init-from $R/exp/x4-boot2 --out $R/exp/x4-boot3
# Round 3 again, with two vectors for frequent words.
hlbl tree build --from $R/exp/x4-boot2 --policy adaptive:0.4 --copies 4 --seed 10 --senses \
    --out $R/trees/x4-r3-senses.json
$T --tree $R/trees/x4-r3-senses.json --init-from $R/exp/x4-boot2 --out $R/exp/x4-boot3-senses
hlbl tree build --from $R/exp/x4-boot3-senses --policy adaptive:0.4 --copies 4 --seed 11 --senses \
    --out $R/trees/x4-r4-senses.json
$T --tree $R/trees/x4-r4-senses.json --init-from $R/exp/x4-boot3-senses --out $R/exp/x4-boot4-senses
# Two-level classes (k-means on round 2's features), warm from round 2's R and C.
hlbl tree build --from $R/exp/x4-boot2 --classes 100 --eps 0.1 --max-codes 2 --seed 0 --out $R/trees/km100-boot2.json
$T --output classes --tree $R/trees/km100-boot2.json --init-from $R/exp/x4-boot2 --out $R/exp/classes-boot2
# Round 3 for classes: k-means on the warm class model's features, warm from it.
hlbl tree build --from $R/exp/classes-boot2 --classes 100 --eps 0.1 --max-codes 2 --seed 0 --out $R/trees/km100-boot3.json
$T --output classes --tree $R/trees/km100-boot3.json --init-from $R/exp/classes-boot2 --out $R/exp/classes-boot3
# Exchange moves on the class models' own training NLL, then on from every weight at the final rate:
# the warm class model, and frequency classes from scratch.
$T --output classes --tree $R/trees/km100-boot2.json --init-from $R/exp/classes-boot2 --keep-output --lr 3e-5 \
    --out $R/exp/classes-cont  # the control: on from every weight, no moves
hlbl tree refine --from $R/exp/classes-boot2 --sweeps 4 --out $R/trees/km100-boot2-ref.json
$T --output classes --tree $R/trees/km100-boot2-ref.json --init-from $R/exp/classes-boot2 --keep-output --lr 3e-5 \
    --out $R/exp/classes-ref
$T --output classes --out $R/exp/freq100
hlbl tree refine --from $R/exp/freq100 --sweeps 4 --out $R/trees/freq100-ref.json
$T --output classes --tree $R/trees/freq100-ref.json --init-from $R/exp/freq100 --keep-output --lr 3e-5 \
    --out $R/exp/freq100-ref
# The exchange moves' estimates against the training NLL measured after them (results/ptb/exchange.json).
python bench/exchange.py "${FLAGS[@]}" --run $R/exp/freq100

# Several context vectors per word, against the same rule without them.
$T --tree $R/trees/a04.json --out $R/exp/a04
$T --tree $R/trees/a04-senses.json --out $R/exp/a04-senses

# The Huffman tree (frequency only) for the table.
$T --tree huffman --out $R/exp/huffman

# The two-level class models (their own rows: results/ptb/classes.json) are made as
# results/ptb/classes.md lists; the speed step below reads their class files from $R/.

# KN5 and the mixtures.
hlbl ngram train --data $DATA --order 5 --out $R/kn5.arpa

# Rows (exact test/valid perplexity of each run's best weights), speed side by side, the table.
row --run $R/exp/x4-tworate --name "HLBL ADAPTIVE(0.4) x4 (rebuilt, two-rate)" --speed-key tree:adaptive0.4x4 \
    --command "$T --tree $R/trees/x4.json --out $R/exp/x4-tworate"
row --run $R/exp/x4-halve --name "HLBL ADAPTIVE(0.4) x4, halving schedule" --speed-key tree:adaptive0.4x4 \
    --command "$T --tree $R/trees/x4.json --lr-schedule halve --out $R/exp/x4-halve"
row --run $R/exp/x4-wd1e-4 --name "HLBL ADAPTIVE(0.4) x4, L2 1e-4 on C and nodes" --speed-key tree:adaptive0.4x4 \
    --command "$T --tree $R/trees/x4.json --weight-decay 1e-4 --out $R/exp/x4-wd1e-4"
row --run $R/exp/x4-boot1 --name "HLBL ADAPTIVE(0.4) x4, bootstrap round 1 (warm)" --speed-key tree:x4-r1 \
    --command "$T --tree $R/trees/x4-r1.json --init-from $R/exp/x4-tworate --out $R/exp/x4-boot1"
row --run $R/exp/x4-boot2 --name "HLBL ADAPTIVE(0.4) x4, bootstrap round 2 (warm)" --speed-key tree:x4-r2 \
    --command "$T --tree $R/trees/x4-r2.json --init-from $R/exp/x4-boot1 --out $R/exp/x4-boot2"
row --run $R/exp/a04 --name "HLBL ADAPTIVE(0.4) (rebuilt)" --speed-key tree:a04 \
    --command "$T --tree $R/trees/a04.json --out $R/exp/a04"
row --run $R/exp/a04-senses --name "HLBL ADAPTIVE(0.4), two vectors per frequent word" --speed-key tree:a04-senses \
    --command "$T --tree $R/trees/a04-senses.json --out $R/exp/a04-senses"
row --run $R/exp/x4-boot3 --name "HLBL ADAPTIVE(0.4) x4, bootstrap round 3 (warm)" --speed-key tree:x4-r3 \
    --command "$T --tree $R/trees/x4-r3.json --init-from $R/exp/x4-boot2 --out $R/exp/x4-boot3"
row --run $R/exp/x4-boot3-senses --name "HLBL ADAPTIVE(0.4) x4, bootstrap round 3 with two vectors per frequent word" \
    --speed-key tree:x4-r3-senses \
    --command "$T --tree $R/trees/x4-r3-senses.json --init-from $R/exp/x4-boot2 --out $R/exp/x4-boot3-senses"
row --run $R/exp/x4-boot4-senses --name "HLBL ADAPTIVE(0.4) x4, bootstrap round 4 with two vectors per frequent word" \
    --speed-key tree:x4-r4-senses --note "warm start from round 3 with two vectors; 60 x4 epochs in all" \
    --command "$T --tree $R/trees/x4-r4-senses.json --init-from $R/exp/x4-boot3-senses --out $R/exp/x4-boot4-senses"
row --run $R/exp/classes-boot2 --model tree \
    --name "LBL, two-level classes (k-means on bootstrap round 2's features), warm from round 2" \
    --speed-key classes:km100-boot2 \
    --note "C = 100, 11% of the words in two classes; R and C from the x4 tree model of bootstrap round 2 (38 x4 epochs before it)" \
    --command "$T --output classes --tree $R/trees/km100-boot2.json --init-from $R/exp/x4-boot2 --out $R/exp/classes-boot2"
row --run $R/exp/classes-boot3 --model tree \
    --name "LBL, two-level classes, round 3 (k-means on the warm class model's features), warm from it" \
    --speed-key classes:km100-boot3 --note "R and C from the warm class model of round 2" \
    --command "$T --output classes --tree $R/trees/km100-boot3.json --init-from $R/exp/classes-boot2 --out $R/exp/classes-boot3"
row --run $R/exp/classes-cont --model tree \
    --name "LBL, two-level classes warm from round 2, then on at lr 3e-5 from every weight (no moves)" \
    --speed-key classes:km100-boot2 --note "the control for the exchange-move rows" \
    --command "$T --output classes --tree $R/trees/km100-boot2.json --init-from $R/exp/classes-boot2 --keep-output --lr 3e-5 --out $R/exp/classes-cont"
row --run $R/exp/classes-ref --model tree \
    --name "LBL, two-level classes warm from round 2, after exchange moves (4 sweeps), then lr 3e-5" \
    --speed-key classes:km100-boot2-ref \
    --note "every weight from the warm class model; classes by hlbl tree refine --from $R/exp/classes-boot2 --sweeps 4" \
    --command "$T --output classes --tree $R/trees/km100-boot2-ref.json --init-from $R/exp/classes-boot2 --keep-output --lr 3e-5 --out $R/exp/classes-ref"
row --run $R/exp/freq100-ref --model tree \
    --name "LBL, frequency classes after exchange moves (4 sweeps), then lr 3e-5" --speed-key classes:freq100-ref \
    --note "every weight from the frequency-class model (143.9); classes by hlbl tree refine --from $R/exp/freq100 --sweeps 4" \
    --command "$T --output classes --tree $R/trees/freq100-ref.json --init-from $R/exp/freq100 --keep-output --lr 3e-5 --out $R/exp/freq100-ref"
row --run $R/exp/huffman --name "HLBL Huffman" --speed-key tree:huffman --command "$T --tree huffman --out $R/exp/huffman"
for run in x4-boot1 x4-boot2; do
    python bench/frontier.py mix --rows "$ROWS" --run $R/exp/$run --run-name $R/exp/$run --arpa $R/kn5.arpa \
        --arpa-name $R/kn5.arpa --name "HLBL x4 bootstrap round ${run#x4-boot} + KN5"
done
python bench/frontier.py mix --rows "$ROWS" --run $R/exp/classes-boot2 --run-name $R/exp/classes-boot2 --arpa $R/kn5.arpa \
    --arpa-name $R/kn5.arpa --name "LBL two-level classes (warm from round 2) + KN5"
python bench/frontier.py mix --rows "$ROWS" --run $R/exp/x4-boot2 --run-name $R/exp/x4-boot2 --with $R/exp/x4-tworate \
    --with $R/exp/a04-senses --arpa $R/kn5.arpa --arpa-name $R/kn5.arpa \
    --name "three HLBL models (x4 bootstrap round 2, x4, ADAPTIVE(0.4) two vectors) + KN5" \
    --note "an ensemble: three tree models and KN5 mixed per token, the four weights tuned on valid"
python bench/frontier.py speed --data "$DATA" --threads 1 --rounds 5 --trees random=random huffman=huffman \
    balanced=$R/trees/balanced.json adaptive=$R/trees/adaptive.json adaptive0.25=$R/trees/a025.json \
    adaptive0.4x2=$R/trees/x2.json a04=$R/trees/a04.json a04-senses=$R/trees/a04-senses.json \
    adaptive0.4x4=$R/trees/x4.json x4-r1=$R/trees/x4-r1.json x4-r2=$R/trees/x4-r2.json \
    x4-r3=$R/trees/x4-r3.json x4-r3-senses=$R/trees/x4-r3-senses.json x4-r4-senses=$R/trees/x4-r4-senses.json \
    --classes km100-boot2=$R/trees/km100-boot2.json km100-boot3=$R/trees/km100-boot3.json \
    km100-boot2-ref=$R/trees/km100-boot2-ref.json freq100-ref=$R/trees/freq100-ref.json "${EXTRA_CLASSES[@]}" \
    --out "$OUT/frontier_speed.json" "${SPEED_QUICK[@]}"
if [ -n "$QUICK" ]; then
  python bench/frontier.py table --out "$OUT" --rows "$ROWS" --speed "$OUT/frontier_speed.json" --sampling none
else
  python bench/frontier.py table
fi
