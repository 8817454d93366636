#!/usr/bin/env bash
# Several IMPALA learners training one model: a moolib broker plus N learners (rfwp-rl train
# --broker --group), each with its own actors; gradients are averaged before every optimizer step.
#
#   NUM_LEARNERS=2 GAME=Pong CORE=rdn bash launch/multi_learner.sh                 # all on this machine
#   LEARNER_HOSTS="node1 node2 node3" BROKER_HOST=$(hostname) bash launch/multi_learner.sh
#
# Loopback (default): the broker listens on 127.0.0.1:$PORT and NUM_LEARNERS learners run here.
# LEARNER_HOSTS: one learner per host, started with ssh (the repo must be at the same path and
# `rfwp-rl` installed there); the broker runs here and listens on 0.0.0.0:$PORT, and the learners
# reach it at BROKER_HOST (default: this host's name). Learner i uses --seed $((SEED + i)) (each
# learner needs its own seed, else their actors play the same episodes) and writes its own run
# directory runs/impala/ALE-<GAME>-v5_<CORE>_s<seed> on its host. STEPS counts env steps trained
# by the whole group. Learners may join later (start this script's learner command on another
# host) and may leave; re-running resumes every learner from its run directory (the learner with
# the most updates leads and hands its model to the others). Extra arguments go to every learner.
# Every learner proves the shared key KEY_FILE to the broker and to each other (made here if
# missing, mode 600; copied to each of LEARNER_HOSTS over ssh). With LEARNER_HOSTS, set BROKER_ADDRESS
# to this host's address on a private network (default 0.0.0.0:$PORT: every interface); see the
# README's "Threat model". Logs: $RUN_LOGS/{broker,learner-*}.log. The broker stops when the last learner has finished.
set -euo pipefail
cd "$(dirname "$0")/.."

GAME=${GAME:-Pong}
CORE=${CORE:-rdn}
STEPS=${STEPS:-200000000}
SEED=${SEED:-1}
PORT=${PORT:-4432}
GROUP=${GROUP:-${GAME}_${CORE}_s${SEED}}
NUM_LEARNERS=${NUM_LEARNERS:-2}         # learner processes on this machine (ignored with LEARNER_HOSTS)
LEARNER_HOSTS=${LEARNER_HOSTS:-}
BROKER_HOST=${BROKER_HOST:-$(hostname)}
ACTORS=${ACTORS:-48}                    # environments per learner
DEVICE=${DEVICE:-$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")}
EXTRA=${EXTRA:-}                        # options for every learner, e.g. "--set core_config.hidden_size=64"
RUN_LOGS=${RUN_LOGS:-runs/logs/multi_learner_${GROUP}}
mkdir -p "$RUN_LOGS"
source launch/auth_key.sh  # KEY_FILE (made if missing) and copy_key HOST

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

if [[ -n "$LEARNER_HOSTS" ]]; then
  address=${BROKER_ADDRESS:-0.0.0.0:$PORT}
  connect=$BROKER_HOST:${address##*:}
else
  address=127.0.0.1:$PORT
  connect=$address
fi
rfwp-rl broker --address "$address" --auth-key-file "$KEY_FILE" > "$RUN_LOGS/broker.log" 2>&1 &
broker=$!
pids+=("$broker")
waited=0  # tenths of a second: the learners join once the broker listens (it says so; at most 60 s)
until grep -q "broker listening on" "$RUN_LOGS/broker.log"; do
  kill -0 "$broker" 2>/dev/null || { echo "the broker stopped: $RUN_LOGS/broker.log" >&2; cat "$RUN_LOGS/broker.log" >&2; exit 1; }
  (( waited++ < 600 )) || { echo "the broker is not listening after 60 s: $RUN_LOGS/broker.log" >&2; exit 1; }
  sleep 0.1
done

learner_args="--env $GAME --core $CORE --total-steps $STEPS --num-actors $ACTORS --batch-size 32 --unroll-length 50"
learner_args+=" --auth-key-file $KEY_FILE --device $DEVICE --broker $connect --group $GROUP --snapshot-steps 50000000,200000000 $EXTRA"
learners=()
if [[ -n "$LEARNER_HOSTS" ]]; then
  i=0
  for host in $LEARNER_HOSTS; do
    copy_key "$host"
    # shellcheck disable=SC2029
    ssh "$host" "cd $(pwd) && exec rfwp-rl train $learner_args --seed $((SEED + i)) $*" \
      > "$RUN_LOGS/learner-$host.log" 2>&1 &
    learners+=($!)
    i=$((i + 1))
  done
else
  for i in $(seq 0 $((NUM_LEARNERS - 1))); do
    # shellcheck disable=SC2086
    rfwp-rl train $learner_args --seed "$((SEED + i))" "$@" > "$RUN_LOGS/learner-$i.log" 2>&1 &
    learners+=($!)
  done
fi
pids+=("${learners[@]}")
echo "broker pid $broker on $address, ${#learners[@]} learners in group $GROUP; logs in $RUN_LOGS" >&2
status=0
for p in "${learners[@]}"; do
  wait "$p" || status=$?
done
kill -TERM "$broker" 2>/dev/null || true
wait "$broker" || true
exit "$status"
