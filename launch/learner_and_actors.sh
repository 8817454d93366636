#!/usr/bin/env bash
# One IMPALA learner plus remote actors (rfwp-rl actor) that feed it over moolib RPC.
#
#   NUM_REMOTE=2 GAME=Pong CORE=rdn bash launch/learner_and_actors.sh           # all on this machine
#   ACTOR_HOSTS="node1 node2" LISTEN=0.0.0.0:4431 bash launch/learner_and_actors.sh
#
# Loopback (default): the learner listens on 127.0.0.1:$PORT and NUM_REMOTE actor processes run
# here. ACTOR_HOSTS: one actor per host, started with ssh (the repo must be at the same path and
# `rfwp-rl` installed there); they connect to LEARNER_HOST (default: this host's name).
# The learner keeps LOCAL_ACTORS envs of its own (0: remote rollouts only). Actors must use the
# learner's env/core options (checked on connect), so both get the same GAME/CORE/EXTRA.
# No moolib broker is needed (one learner; the actors connect to it directly).
# Lost actors are tolerated; actors retry until the learner is back, and exit when it finishes.
# Every actor proves the shared key KEY_FILE (made here if missing, mode 600; copied to each of
# ACTOR_HOSTS over ssh). With ACTOR_HOSTS, set LISTEN to the learner's address on a private network
# (e.g. LISTEN=10.0.0.5:4431); see the README's "Threat model" for what an open address exposes.
# Re-running resumes the learner's run directory (runs/impala/ALE-<GAME>-v5_<CORE>_s<SEED>).
# Extra arguments go to the learner (`rfwp-rl train`). Logs: $RUN_LOGS/{learner,actor-*}.log.
set -euo pipefail
cd "$(dirname "$0")/.."

GAME=${GAME:-Pong}
CORE=${CORE:-rdn}
STEPS=${STEPS:-200000000}
SEED=${SEED:-1}
PORT=${PORT:-4431}
LISTEN=${LISTEN:-127.0.0.1:$PORT}
LEARNER_HOST=${LEARNER_HOST:-$(hostname)}
ACTOR_HOSTS=${ACTOR_HOSTS:-}
NUM_REMOTE=${NUM_REMOTE:-2}             # actor processes on loopback (ignored with ACTOR_HOSTS)
ACTOR_ENVS=${ACTOR_ENVS:-32}            # environments per actor process
ACTOR_PROCS=${ACTOR_PROCS:-2}           # EnvPool worker processes per actor
LOCAL_ACTORS=${LOCAL_ACTORS:-0}         # the learner's own environments
DEVICE=${DEVICE:-$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")}
EXTRA=${EXTRA:-}                        # agent options for learner AND actors, e.g. "--set core_config.hidden_size=64"
RUN_LOGS=${RUN_LOGS:-runs/logs/learner_and_actors_${GAME}_${CORE}_s${SEED}}
mkdir -p "$RUN_LOGS"
source launch/auth_key.sh  # KEY_FILE (made if missing) and copy_key HOST

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# shellcheck disable=SC2086
rfwp-rl train --env "$GAME" --core "$CORE" --seed "$SEED" --total-steps "$STEPS" \
  --num-actors "$LOCAL_ACTORS" --listen "$LISTEN" --auth-key-file "$KEY_FILE" --batch-size 32 --unroll-length 50 --device "$DEVICE" \
  --snapshot-steps 50000000,200000000 $EXTRA "$@" > >(tee "$RUN_LOGS/learner.log") 2>&1 &
learner=$!

actor_args="--auth-key-file $KEY_FILE --env $GAME --core $CORE --num-actors $ACTOR_ENVS --num-env-processes $ACTOR_PROCS $EXTRA"
if [[ -n "$ACTOR_HOSTS" ]]; then
  port=${LISTEN##*:}
  for host in $ACTOR_HOSTS; do
    copy_key "$host"
    # shellcheck disable=SC2029
    ssh "$host" "cd $(pwd) && exec rfwp-rl actor --connect $LEARNER_HOST:$port --name actor-$host $actor_args" \
      > "$RUN_LOGS/actor-$host.log" 2>&1 &
    pids+=($!)
  done
else
  for i in $(seq 1 "$NUM_REMOTE"); do
    # shellcheck disable=SC2086
    rfwp-rl actor --connect "$LISTEN" --name "actor-$i" --seed "$((SEED * 1000 + i))" $actor_args \
      > "$RUN_LOGS/actor-$i.log" 2>&1 &
    pids+=($!)
  done
fi
echo "learner pid $learner, ${#pids[@]} actors; logs in $RUN_LOGS" >&2
wait "$learner"
