#!/usr/bin/env bash
# Sweep IMPALA runs over games x cores, one run directory each, JOBS runs at a time.
#
#   GAMES="Pong Breakout Seaquest" CORES="lstm rdn" JOBS=1 bash launch/sweep_atari.sh
#   GAMES="Pong" CORES="ff lstm gru lt delta delta_rnn rdn" STEPS=50000000 bash launch/sweep_atari.sh --seed 2
#
# Each run is `rfwp-rl train --env <game> --core <core>` in $RUNS/ALE-<game>-v5_<core>_s<SEED>
# (RUNS defaults to runs/impala; log: <run dir>.log). Resumable: re-running the same command skips finished runs (the trainer
# sees the step target reached in a second) and resumes the others from their newest
# checkpoint. Ctrl-C stops the running trainers (each saves a checkpoint). Extra arguments go to
# every `rfwp-rl train`. Split the CPUs: each run gets ENV_PROCS env workers and NUM_ACTORS envs.
# Afterwards: `rfwp-rl eval` each run, then `rfwp-rl compare --runs $RUNS --model rdn --baseline lt`.
{ # read to the end before running: an edit to this file cannot change a sweep under way
set -euo pipefail
cd "$(dirname "$0")/.."

GAMES=${GAMES:-"Pong Breakout Seaquest SpaceInvaders Qbert BeamRider Enduro"}
CORES=${CORES:-"lstm rdn"}
STEPS=${STEPS:-50000000}
SEED=${SEED:-1}
JOBS=${JOBS:-1}
NUM_ACTORS=${NUM_ACTORS:-48}
ENV_PROCS=${ENV_PROCS:-$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))}
DEVICE=${DEVICE:-$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")}
RUNS=${RUNS:-runs/impala}
mkdir -p "$RUNS"

pids=()
trap 'kill -INT "${pids[@]}" 2>/dev/null; wait' INT TERM
failed=0
for game in $GAMES; do
  for core in $CORES; do
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || failed=$((failed + 1)); done
    run_dir="$RUNS/ALE-${game}-v5_${core}_s${SEED}"
    echo "$(date +%T) start $game $core -> $run_dir" >&2
    rfwp-rl train --env "$game" --core "$core" --seed "$SEED" --total-steps "$STEPS" --run-dir "$run_dir" \
      --num-actors "$NUM_ACTORS" --num-env-processes "$ENV_PROCS" --device "$DEVICE" "$@" >> "$run_dir.log" 2>&1 &
    pids+=($!)
  done
done
while (( $(jobs -rp | wc -l) > 0 )); do wait -n || failed=$((failed + 1)); done
echo "$(date +%T) sweep done; $failed run(s) exited with an error (see $RUNS/*.log); re-run to resume" >&2
(( failed == 0 ))
exit
}
