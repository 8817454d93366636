#!/usr/bin/env bash
# Word-level language modelling (RFWP paper Sec. 4.1, Table 1 and App. A.1), sized for a
# 2-core CPU, on the corpus the package builds itself (the docstrings of the installed Python
# standard library; no download): ~232k training tokens, words seen fewer than 3 times ->
# <unk> (vocabulary 4,598). Every model: embedding 128, 2 layers, dropout 0.1, segments of
# 128 tokens, batch 16, Adam 1e-3 with 200 warm-up steps, STEPS steps, the weights of the best
# validation perplexity. Sizes are chosen for equal total parameters (~1.59-1.65M): width 128
# with 4 heads and FF 512 (transformer, lt, delta), FF 448 for rdn, an LSTM of width 144, a
# Delta LSTM of width 104 (its fast LSTM has four fast matrices per head); CORES="gru": a GRU of
# width 156 (1,591,230 against the LSTM's 1,580,118).
#
# CONTEXT=carried (default; the paper's "+ full context"): the recurrent models carry their
# state from segment to segment in training (gradients stop at segment borders) and in the
# evaluation (the whole text read once, batch 1). The transformer cannot carry a state: it is
# trained on independent segments and evaluated with the sliding window of 128 tokens
# (every token scored with 127 tokens of context), as the paper's limited-context rows.
# CONTEXT=independent trains every model on independent segments with the sliding window.
#
#   bash launch/seq_lm.sh
#   CONTEXT=independent CORES="lt delta rdn" bash launch/seq_lm.sh
#
# Runs resume if started again; results: runs/seq/lm_builtin_$CONTEXT/<core>/results.json,
# then results/seq/lm_builtin_${CONTEXT}_steps$STEPS.csv.
set -euo pipefail
cd "$(dirname "$0")/.."

CORES=${CORES:-"lstm transformer lt delta rdn delta_lstm"}
CONTEXT=${CONTEXT:-carried}
STEPS=${STEPS:-1500}
SEED=${SEED:-1}
ROOT=runs/seq/lm_builtin_${CONTEXT}
OUT=results/seq/lm_builtin_${CONTEXT}_steps${STEPS}

for CORE in $CORES; do
  case $CORE in
    lstm) SIZE=(--hidden-size 144) ;;
    gru) SIZE=(--hidden-size 156) ;;
    rdn) SIZE=(--hidden-size 128 --num-heads 4 --ff-size 448) ;;
    delta_lstm) SIZE=(--hidden-size 104 --num-heads 4 --ff-size 512) ;;
    *) SIZE=(--hidden-size 128 --num-heads 4 --ff-size 512) ;;
  esac
  RUN_CONTEXT=$CONTEXT
  if [ "$CORE" = transformer ]; then RUN_CONTEXT=independent; fi
  nice -n 10 rfwp-rl seq --task lm --data builtin --tokens word --min-count 3 --core "$CORE" \
    --emb-size 128 --num-layers 2 "${SIZE[@]}" --dropout 0.1 --seg-len 128 \
    --context "$RUN_CONTEXT" --batch-size 16 --learning-rate 1e-3 --warmup-updates 200 --updates "$STEPS" \
    --eval-every-updates 100 --seed "$SEED" --torch-threads 1 \
    --run-dir "$ROOT/$CORE" "$@"
done

python -m rfwp_rl.seq.results "$ROOT" "$OUT.csv" --curves "${OUT}_curves.png" --curve-tags valid/ppl
