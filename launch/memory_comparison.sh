#!/usr/bin/env bash
# The extended comparison of memory cores, from one command: every agent core
# (rfwp_rl.memory.health.agent_cores(): the registered cores with an agents/vector_<core>.toml preset) on every
# env of the comparison (rfwp_rl.memory.comparison.ENVS: the suite's six easy and six medium ids, then popgym's
# RepeatFirstEasy, RepeatPreviousEasy, CountRecallEasy and AutoencodeEasy, then MiniGrid-MemoryS7: the cheap
# suite envs first), 3 seeds, 1M env steps each: 17 envs x (number of agent cores) x 3 seeds runs, one
# `rfwp-rl train` each with the defaults; then the tables of OUT with `rfwp-rl memory-results --bench comparison`
# (runs.csv with each run's wall-clock minutes, summary.csv, aggregate.csv with the IQM per core over all 17
# envs and its 95% stratified-bootstrap interval, performance_profile.png, curves.png, OUT/README.md).
#
# Needs popgym and minigrid: pip install '.[envs]' (or pip install popgym minigrid).
#
#   JOBS=2 bash launch/memory_comparison.sh                  # everything: runs/memory/comparison -> results/memory/comparison
#   DRY=1 bash launch/memory_comparison.sh                   # list the runs ("env core seed") and their count; trains nothing
#   nohup bash launch/memory_comparison.sh > runs/memory/comparison.log 2>&1 &   # survive logout
#   SEEDS=1 CORES="lstm rdn" bash launch/memory_comparison.sh                  # a subset
#
# It is launch/memory_suite.sh with these defaults (the same variables: STEPS, CORES, SEEDS, JOBS, RUNS, OUT,
# IDS, THREADS, EXTRA, DRY): run directories $RUNS/<env>/<core>_s<seed> with console logs beside them, seed 1
# of everything first, and re-running resumes every run from its newest checkpoint (finished runs return at once).
set -euo pipefail
cd "$(dirname "$0")/.."

export STEPS=${STEPS:-1000000}
export SEEDS=${SEEDS:-"1 2 3"}
export RUNS=${RUNS:-runs/memory/comparison}
export OUT=${OUT:-results/memory/comparison}
export CORES=${CORES:-$(python3 -c "from rfwp_rl.memory.health import agent_cores; print(' '.join(agent_cores()))")}
export IDS=${IDS:-$(python3 -c "from rfwp_rl.memory import comparison; print(' '.join(comparison.ENVS))")}
export BENCH=comparison

if [ -z "${DRY:-}" ]; then
  for module in $(printf '%s\n' $IDS | sed -n 's/^\([A-Za-z0-9_.]*\):.*/\1/p' | sort -u); do
    python3 -c "import $module" 2>/dev/null \
      || { echo "$module is not installed (needed by IDS): pip install '.[envs]'" >&2; exit 2; }
  done
fi
exec bash launch/memory_suite.sh
