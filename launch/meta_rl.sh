#!/usr/bin/env bash
# The FWM paper's meta-RL experiment (Sec. 4.2, Fig. 5, App. I): A2C on random 5-location
# POMDP graphs, 600 training / 600 unseen test graphs, batch 600, 30-step episodes, full BPTT.
# Trains the FWM agent (LSTM 32 + 16x16x16 fast tensor, 3 reads) and the LSTM baselines, then
# draws results/meta_rl/curves.png (+ curves.csv, summary.csv) with python -m rfwp_rl.meta_rl.plot.
#
#   bash launch/meta_rl.sh                                  # fwm, then lstm512, then the plot
#   AGENTS="fwm lstm512 lstm1024" STEPS=1080000000 bash launch/meta_rl.sh   # env steps
#   PARALLEL=1 bash launch/meta_rl.sh                       # all agents at once (>= 2 free cores)
#   nohup bash launch/meta_rl.sh > runs/meta_rl/logs/launch.log 2>&1 &   # survive logout
#
# Agents are the presets agents/meta_rl_<name>.toml. Run directories: runs/meta_rl/<name>_s<SEED>
# (metrics.csv, TensorBoard tb/, checkpoints); console logs: runs/meta_rl/logs/<name>_s<SEED>.log.
# Re-running the script resumes every run from its newest checkpoint (Ctrl-C or kill -TERM
# saves one first); finished runs return at once. Two trainers never share a run directory
# (the second one stops with an error naming the first one's pid).
# CPU time per update of each agent: results/meta_rl/README.md (`rfwp-rl bench meta_rl`).
set -euo pipefail
cd "$(dirname "$0")/.."

AGENTS=${AGENTS:-"fwm lstm512"}
STEPS=${STEPS:-1080000000}  # env steps: the paper's 60,000 updates, each one 30-step episode of 600 agents
SEED=${SEED:-1}
THREADS=${THREADS:-1}
PARALLEL=${PARALLEL:-0}
NICE=${NICE:-10}
mkdir -p runs/meta_rl/logs

pids=()
for AGENT in $AGENTS; do
  cmd=(nice -n "$NICE" python -m rfwp_rl meta-rl --preset "agents/meta_rl_${AGENT}.toml"
       --total-steps "$STEPS" --seed "$SEED" --torch-threads "$THREADS" --eval-actions both "$@")
  log="runs/meta_rl/logs/${AGENT}_s${SEED}.log"
  echo "$(date '+%F %T') ${cmd[*]} >> $log"
  if [ "$PARALLEL" = 1 ]; then
    "${cmd[@]}" >> "$log" 2>&1 &
    pids+=($!)
  else
    "${cmd[@]}" >> "$log" 2>&1
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done

python -m rfwp_rl.meta_rl.plot runs/meta_rl/*_s"$SEED" --out results/meta_rl
