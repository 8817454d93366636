#!/usr/bin/env bash
# Associative retrieval (Secretly-FWP Sec. 6.1): capacity of the sum update rule (Linear
# Transformer, `lt`) vs the delta rule (Delta Net, `delta`) as the number of associations S
# grows past the key dimension. Model: the paper's single-layer fast-weight memory
# (`--model memory`: keys W_K [e(k); one-hot v], query W_Q e(q), fixed one-hot values, squared
# error), whose writes run through the same rfwp_rl.ops as the lt/delta cores. Training as in
# the paper: batch 32, Adam 1e-3, until the validation loss is below 0.001 or has not improved
# for 1,000 steps (here: at most STEPS steps); evaluation on 20 sequences x every query.
#
#   bash launch/seq_assoc_capacity.sh                 # setting 1, d_key 16 (times: results/seq/README.md)
#   SETTING=2 KEYS="4 8 16 24 32" bash launch/seq_assoc_capacity.sh
#   D_KEY=32 KEYS="16 32 48 64 96" bash launch/seq_assoc_capacity.sh
#
# Each run resumes if started again; results: runs/seq/assoc_s$SETTING_d$D_KEY/<core>_S<S>/results.json,
# then results/seq/assoc_setting$SETTING_d$D_KEY.csv and .png (test loss and accuracy vs S).
set -euo pipefail
cd "$(dirname "$0")/.."

SETTING=${SETTING:-1}
D_KEY=${D_KEY:-16}
KEYS=${KEYS:-"4 8 12 16 20 24 32 48 64"}
CORES=${CORES:-"lt delta"}
STEPS=${STEPS:-5000}
SEED=${SEED:-1}
FEATURE_MAP=${FEATURE_MAP:-elu_sum}
ROOT=runs/seq/assoc_s${SETTING}_d${D_KEY}
OUT=results/seq/assoc_setting${SETTING}_d${D_KEY}

for S in $KEYS; do
  for CORE in $CORES; do
    nice -n 10 rfwp-rl seq --task assoc --model memory --setting "$SETTING" --num-keys "$S" \
      --core "$CORE" --hidden-size "$D_KEY" --emb-size 64 --feature-map "$FEATURE_MAP" \
      --batch-size 32 --learning-rate 1e-3 --updates "$STEPS" --eval-every-updates 100 \
      --target 0.001 --patience 10 --seed "$SEED" --torch-threads 1 \
      --run-dir "$ROOT/${CORE}_S${S}" "$@"
  done
done

python -m rfwp_rl.seq.results "$ROOT" "$OUT.csv" --plot "$OUT.png" --x num_keys \
  --y test_loss --group core --xline "$D_KEY" --xline-label "d_key = $D_KEY" --logy \
  --title "assoc setting $SETTING, d_key $D_KEY ($FEATURE_MAP): test loss vs associations S"
python -m rfwp_rl.seq.results "$ROOT" "$OUT.csv" --plot "${OUT}_acc.png" --x num_keys \
  --y test_seq_acc --group core --xline "$D_KEY" --xline-label "d_key = $D_KEY" \
  --title "assoc setting $SETTING, d_key $D_KEY ($FEATURE_MAP): test accuracy vs associations S"
