#!/usr/bin/env bash
# The memory-task evidence: cores x rfwp/ memory tasks x seeds at a fixed env-step budget, then the
# tables of OUT (runs.csv, summary.csv, aggregate.csv, curves.png, performance_profile.png and the
# tables in OUT/README.md) with `rfwp-rl memory-results`. The defaults reproduce the current
# easy-suite table, results/memory/easy_suite/ (every agent core, the six easy tasks, 3 seeds, 300k
# steps; ffm, lru, mlstm and mamba came after that table, so the defaults add their runs to it);
# results/memory/README.md names the command of every other table.
#
#   JOBS=2 bash launch/memory_suite.sh                       # results/memory/easy_suite/
#   STEPS=1000000 LEVELS="easy medium" RUNS=runs/memory/all OUT=runs/memory/all/tables bash launch/memory_suite.sh
#   CORES="lt delta" IDS="rfwp/AssociativeRecallReassign-medium-v0" RUNS=... OUT=... bash launch/memory_suite.sh
#   nohup bash launch/memory_suite.sh > runs/memory/launch.log 2>&1 &          # survive logout
#   EXTRA="--max-kl 0" RUNS=runs/memory/no_kl OUT=runs/memory/no_kl_tables bash launch/memory_suite.sh
#   DRY=1 bash launch/memory_suite.sh                        # list the runs ("env core seed") and their count
#
# Every run uses the defaults of `rfwp-rl train` for vector envs (the vector profile and the
# agents/vector_<core>.toml presets); one run = one command of the form
#   rfwp-rl train --env rfwp/DelayedRecall-easy-v0 --core rdn --seed 1 --total-steps 300000
# Run directories: $RUNS/<env>/<core>_s<seed> (TensorBoard tb/, config.json, checkpoints);
# console logs next to them (<core>_s<seed>.log). Order: seed 1 of everything first, then seed 2,
# ...: a partial sweep still gives a complete first-seed table. Re-running the script resumes every
# run from its newest checkpoint; finished runs return at once, and a run with a record in $OUT/records/
# (written as each run finishes, committed with the tables) is not run again, so the tables outlive the run
# directories. Ctrl-C / kill -TERM saves first.
# BENCH: the `memory-results --bench` of the tables (suite; launch/memory_comparison.sh sets comparison).
{ # read to the end before running: an edit to this file cannot change a sweep under way
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-300000}
CORES=${CORES:-"ff lstm gru lt delta delta_rnn rdn fwm gated_delta delta_product ffm lru mlstm mamba"}
LEVELS=${LEVELS:-easy}
SEEDS=${SEEDS:-"1 2 3"}
JOBS=${JOBS:-1}
RUNS=${RUNS:-runs/memory/easy_suite}
OUT=${OUT:-results/memory/easy_suite}
THREADS=${THREADS:-1}
EXTRA=${EXTRA:-}
BENCH=${BENCH:-suite}
DRY=${DRY:-}
IDS=${IDS:-$(python3 -c "import sys; from rfwp_rl.memory import suite; print(' '.join(i for l in sys.argv[1:] for i in suite.suite_ids(l)))" $LEVELS)}

plan() {  # one "ENV CORE SEED" line per run, seed 1 of everything first
  for seed in $SEEDS; do
    for id in $IDS; do
      for core in $CORES; do
        echo "$id $core $seed"
      done
    done
  done
}
if [ -n "$DRY" ]; then
  plan
  echo "# $(plan | wc -l) runs of $STEPS env steps in $RUNS/<env>/<core>_s<seed>; tables: memory-results --bench $BENCH --out $OUT"
  exit 0
fi
mkdir -p "$RUNS"

source launch/records.sh

one_run() {  # K/N ENV CORE SEED
  local name="$(echo "$2" | tr -c 'A-Za-z0-9.+\n-' '-')/$3_s$4"
  local dir="$RUNS/$name" what="$1 $2 $3 seed $4" start=$SECONDS
  if kept "$OUT/records/$name.json"; then echo "kept    $what ($OUT/records/$name.json)"; return 0; fi
  mkdir -p "$dir"
  OMP_NUM_THREADS=$THREADS python3 -m rfwp_rl train --env "$2" --core "$3" --seed "$4" --total-steps "$STEPS" \
    --run-dir "$dir" --num-env-processes 1 --torch-threads "$THREADS" --log-every 30 $EXTRA >> "$dir.log" 2>&1 \
    || { echo "FAILED  $what (exit $?; log $dir.log)"; return 0; }
  recorded "$what ($(( (SECONDS - start) / 60 )) min)" "$dir" memory-results --bench "$BENCH"
}
export -f one_run kept recorded
export RUNS OUT STEPS THREADS EXTRA BENCH

plan | numbered | xargs -P "$JOBS" -L 1 bash -c 'one_run "$0" "$1" "$2" "$3"'

python3 -m rfwp_rl memory-results --bench "$BENCH" --runs "$RUNS" --out "$OUT"
exit
}
