#!/usr/bin/env bash
# Code execution (RFWP paper Sec. 4.2, App. B.1) with 3 variables: Linear Transformer vs the
# delta-rule family (Delta Net, Delta RNN, RDN, and Gated DeltaNet, DeltaProduct,
# SRWM), sized for a 2-core CPU: programs of
# STATEMENTS statements (paper: 100), a 2-layer model of width 64 with 4 heads (paper: 4 layers,
# width 256, 16 heads), STEPS Adam steps (paper: 200 epochs). Metrics: sequence accuracy (every
# output token of a program right) and print accuracy (the printed values), on 500 test
# programs, with the weights of the best validation sequence accuracy.
#
#   bash launch/seq_code_exec.sh                       # the seven cores, one after another
#   CORES="delta lstm" STATEMENTS=100 STEPS=30000 bash launch/seq_code_exec.sh   # closer to the paper
#   CORES="delta delta_rnn" DROPOUT=0.1 TRAIN=10000 STEPS=12000 bash launch/seq_code_exec.sh
#                                      # the paper's regularisation: dropout 0.1, 10,000 programs
#
# Each run resumes if started again (Ctrl-C saves a checkpoint); results:
# runs/seq/code_exec_v3_n$STATEMENTS/<core>/results.json, then
# results/seq/code_exec_v3_n${STATEMENTS}_steps$STEPS.csv (a later call with more STEPS continues
# the same runs and writes a new table).
set -euo pipefail
cd "$(dirname "$0")/.."

CORES=${CORES:-"lt delta delta_rnn rdn gated_delta delta_product srwm"}
STATEMENTS=${STATEMENTS:-20}
STEPS=${STEPS:-3000}
SEED=${SEED:-1}
DROPOUT=${DROPOUT:-0}
TRAIN=${TRAIN:-5000}
# The unregularised runs keep their original folder; regularised ones get their own.
TAG=""
if [ "$DROPOUT" != "0" ] || [ "$TRAIN" != "5000" ]; then TAG="_drop${DROPOUT}_train${TRAIN}"; fi
ROOT=runs/seq/code_exec_v3_n${STATEMENTS}${TAG}
OUT=results/seq/code_exec_v3_n${STATEMENTS}${TAG}_steps${STEPS}

for CORE in $CORES; do
  case $CORE in
    lstm|gru) SIZE=() ;;                     # 2 recurrent layers of width 64, no heads
    *) SIZE=(--num-heads 4 --ff-size 256) ;;
  esac
  nice -n 10 rfwp-rl seq --task code_exec --num-vars 3 --num-statements "$STATEMENTS" \
    --data-sizes "$TRAIN,500,500" --dropout "$DROPOUT" --core "$CORE" --emb-size 64 --hidden-size 64 --num-layers 2 \
    "${SIZE[@]}" --batch-size 32 --learning-rate 1e-3 --updates "$STEPS" --eval-every-updates 250 \
    --target 1.0 --seed "$SEED" --torch-threads 1 \
    --run-dir "$ROOT/$CORE" "$@"
done

python -m rfwp_rl.seq.results "$ROOT" "$OUT.csv" --curves "${OUT}_curves.png"
