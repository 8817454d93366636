#!/usr/bin/env bash
# The paper's comparison at a scale that fits a CPU: MinAtar (Young & Tian 2019; pip install -e '.[minatar]')
# games x cores x seeds, each `rfwp-rl train --env MinAtar/<Game>-v1 --core C --seed S --total-steps N` with the
# defaults and the atari profile (PROFILE; about the returns of the vector profile, which auto picks for these
# grids, on Breakout and Space Invaders, at three times the env steps per second: results/minatar/README.md).
# Their paper reports at 5M frames (no frame skip: 5M env steps). Tables, IQM and profile:
# rfwp-rl minatar-results --runs $RUNS.
#
#   JOBS=2 bash launch/minatar.sh                                   # everything: 5 games x 7 cores x 3 seeds
#   STEPS=1000000 SEEDS=1 CORES="ff lstm rdn" bash launch/minatar.sh  # a first look
#
# Run directories: $RUNS/<game>/<core>_s<seed> (TensorBoard tb/, config.json, checkpoints), console logs beside
# them; then the tables of OUT (default results/minatar) with `rfwp-rl minatar-results`. Order: seed 1 of
# everything first. Re-running resumes every run from its newest checkpoint; finished runs return at once, and
# a run with a record in $OUT/records/ (written as each run finishes, kept with the tables) is not run again. Ctrl-C /
# kill -TERM saves first.
{ # read to the end before running: an edit to this file cannot change a sweep under way
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-5000000}
GAMES=${GAMES:-"Asterix Breakout Freeway Seaquest SpaceInvaders"}
CORES=${CORES:-"ff lstm gru lt delta delta_rnn rdn"}
SEEDS=${SEEDS:-"1 2 3"}
JOBS=${JOBS:-1}
RUNS=${RUNS:-runs/minatar}
OUT=${OUT:-results/minatar}
THREADS=${THREADS:-1}
PROFILE=${PROFILE:-atari}
EXTRA=${EXTRA:-}
python3 -c "import minatar" 2>/dev/null || { echo "minatar is not installed: pip install -e '.[minatar]'" >&2; exit 2; }
mkdir -p "$RUNS"

source launch/records.sh

one_run() {  # K/N GAME CORE SEED
  local dir="$RUNS/$2/$3_s$4" what="$1 $2 $3 seed $4" start=$SECONDS
  if kept "$OUT/records/$2/$3_s$4.json"; then echo "kept    $what ($OUT/records/$2/$3_s$4.json)"; return 0; fi
  mkdir -p "$dir"
  OMP_NUM_THREADS=$THREADS python3 -m rfwp_rl train --env "MinAtar/$2-v1" --core "$3" --seed "$4" \
    --total-steps "$STEPS" --run-dir "$dir" --num-env-processes 1 --torch-threads "$THREADS" --log-every 30 \
    --profile "$PROFILE" $EXTRA >> "$dir.log" 2>&1 || { echo "FAILED  $what (exit $?; log $dir.log)"; return 0; }
  recorded "$what ($(( (SECONDS - start) / 60 )) min)" "$dir" minatar-results
}
export -f one_run kept recorded
export RUNS OUT STEPS THREADS PROFILE EXTRA

for seed in $SEEDS; do
  for game in $GAMES; do
    for core in $CORES; do
      echo "$game $core $seed"
    done
  done
done | numbered | xargs -P "$JOBS" -L 1 bash -c 'one_run "$0" "$1" "$2" "$3"'

python3 -m rfwp_rl minatar-results --runs "$RUNS" --out "$OUT"
exit
}
