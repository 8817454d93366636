#!/usr/bin/env bash
# The Atari work that needs a GPU machine, in one go within TOTAL_SECONDS (default 540):
#  1. the fused kernels (built once per machine), their GPU tests against the PyTorch reference, `rfwp-rl info
#     --check`, and the test that an acting step makes no host sync (-> $OUT/checks.log);
#  2. `rfwp-rl bench impala` on Pong with the paper's LSTM and RDN agents, into one table ($OUT/gpu_bench.csv):
#     48 envs with the learner on each of PONG_BENCH_DEVICES (default BENCH_DEVICES), 48 envs on cuda with eager
#     acting (no CUDA graph; the cores EAGER_CORES, default lstm,rdn; empty: not benched), and
#     each number of envs of BIG_ENVS (default 96; empty: none) on cuda, 48 envs in ale-py's vector env
#     (--env-backend ale; the cores ALE_CORES, default lstm,rdn; empty: not benched), LSTM with 48 envs in
#     each number of env batches of BATCH_SWEEP (default none) and env processes of PROCESS_SWEEP (default: three
#     quarters of ENV_PROCESSES, so that each env batch has as many envs in every process; empty: none), each with the
#     env-stepping and learner bounds; and the small vector
#     agent on both devices, and on the first one with the learner in the acting thread (--no-learner-thread; its
#     rows in the same table: the same columns, its env in the `env` column, `learner_thread` False);
#  3. `rfwp-rl bench impala --topologies local,remote,group` on Pong, `lstm` on cuda, 48 envs in all: one learner,
#     one learner fed by 2 remote actor processes, and a group of two learners, TOPOLOGY_SECONDS (default 5)
#     timed after 2 s of warm-up each (-> $OUT/topology.csv; about 60 s of the budget, at most TOPOLOGY_TIMEOUT,
#     default 120; the Pong run gets what is left);
#  4. the Pong run with the paper's settings and PONG_ENVS envs (default 96) for PONG_SECONDS (default: the
#     time that is left; 0: no training), resumed from RESUME_DIR's checkpoint if there is one (default
#     results/atari/pong_run); its newest checkpoint, and its config and TensorBoard events (pong_tb.tgz) are
#     copied to $OUT, to be committed back to RESUME_DIR (results/atari/README.md says how); then 30 greedy and
#     30 sampled games of the newest checkpoint on the training device (EVAL_SECONDS, default 150; -> the end of
#     $OUT/pong.log).
# Environment: OUT (default /tmp/gpu_atari), WHEELS (a folder of wheels to install first, e.g. gymnasium and
# ale-py where the machine lacks them: pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 -d .whl gymnasium==1.2.2 ale-py==0.12.1 farama-notifications), MOOLIB_SOURCES (a folder
# with moolib's pinned sdist and pybind11 wheel, as scripts/build_moolib.sh caches them in ~/.cache/rfwp_rl/sources:
# moolib is then built first where it is missing), ENV_PROCESSES (default:
# all cores), PONG_CORE (default lstm),
# BENCH_DEVICES (default cuda,cpu), TRAIN_DEVICE (default cuda), BENCH_SECONDS (default 10).
# The device hands back 8 files at most: device.txt, checks.log, gpu_bench.csv, topology.csv, bench.log (every
# bench's output), pong.log (the run and the games), the newest ckpt_*.pt and pong_tb.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-/tmp/gpu_atari}
TOTAL_SECONDS=${TOTAL_SECONDS:-540}
RESUME_DIR=${RESUME_DIR:-results/atari/pong_run}
PONG_CORE=${PONG_CORE:-lstm}
ENV_PROCESSES=${ENV_PROCESSES:-$(nproc)}
RUN=${RUN:-/tmp/rfwp_pong_run}
PY=${PYTHON:-python3}
BENCH_DEVICES=${BENCH_DEVICES:-cuda,cpu}
PONG_BENCH_DEVICES=${PONG_BENCH_DEVICES:-$BENCH_DEVICES}
EAGER_CORES=${EAGER_CORES-lstm,rdn}
TRAIN_DEVICE=${TRAIN_DEVICE:-cuda}
BIG_ENVS=${BIG_ENVS-96}
PONG_ENVS=${PONG_ENVS:-96}
ALE_CORES=${ALE_CORES-lstm,rdn}
BENCH_SECONDS=${BENCH_SECONDS:-10}
TOPOLOGY_SECONDS=${TOPOLOGY_SECONDS:-5}
TOPOLOGY_TIMEOUT=${TOPOLOGY_TIMEOUT:-120}
EVAL_SECONDS=${EVAL_SECONDS:-150}
BATCH_SWEEP=${BATCH_SWEEP-}
PROCESS_SWEEP=${PROCESS_SWEEP-$(( ENV_PROCESSES * 3 / 4 ))}
mkdir -p "$OUT" "$RUN"
export PYTHONUNBUFFERED=1 RFWP_CACHE=${RFWP_CACHE:-/tmp/rfwp_cache}
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
elapsed() { echo $(( $(date +%s) - START )); }
if [ -n "${MOOLIB_SOURCES:-}" ] && ! "$PY" -c "import moolib" 2>/dev/null; then
  # moolib has no wheel for every Python: built from its pinned sources (scripts/build_moolib.sh) beside the
  # kernels, before any bench, for the topology bench's remote actors and learner group
  mkdir -p "$RFWP_CACHE/sources" && cp "$MOOLIB_SOURCES"/* "$RFWP_CACHE/sources/"
  (MAX_JOBS=$(nproc) PYTHON="$PY" bash scripts/build_moolib.sh > /tmp/moolib_build.log 2>&1
   echo "moolib build: exit $?" >> /tmp/moolib_build.log) &
  MOOLIB_BUILD=$!
fi
{ nvidia-smi -L; nproc; "$PY" -c "import torch, gymnasium, ale_py; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, torch.cuda.get_device_name(), '| gymnasium', gymnasium.__version__, '| ale-py', ale_py.__version__)"; \
git log -1 --format='commit %h %cd' 2>/dev/null; } 2>&1 | tee "$OUT/device.txt"

{
  echo "== kernels ($(elapsed) s)"; "$PY" -m rfwp_rl.kernels 2>&1 | tail -3
  echo "== the CUDA kernels against the reference; an acting step makes no host sync ($(elapsed) s)"
  timeout -k 10 120 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/test_kernels_gpu.py tests/test_acting_gpu.py 2>&1 \
    | tail -15
  echo "== info --check ($(elapsed) s)"; timeout -k 10 90 "$PY" -m rfwp_rl info --check 2>&1 | tail -60
} 2>&1 | tee "$OUT/checks.log"
if [ -n "${MOOLIB_BUILD:-}" ]; then  # waited for here: the block above runs in a subshell, which cannot wait on it
  wait "$MOOLIB_BUILD"
  { echo "== moolib built ($(elapsed) s)"; tail -3 /tmp/moolib_build.log; } 2>&1 | tee -a "$OUT/checks.log"
fi

PONG=(--env Pong --num-env-processes "$ENV_PROCESSES" --seconds "$BENCH_SECONDS" --warmup-seconds 5)
BENCH=("${PONG[@]}" --env-backend process)
echo "== bench impala, Pong, 48 envs ($(elapsed) s)"
timeout -k 20 240 "$PY" -m rfwp_rl bench impala "${BENCH[@]}" --cores lstm,rdn --devices "$PONG_BENCH_DEVICES" --num-actors 48 \
  --out "$OUT/bench_48.csv" 2>&1 | tee "$OUT/bench.log"
if [ -n "$EAGER_CORES" ]; then
  echo "== bench impala, Pong, 48 envs, eager acting ($(elapsed) s)"
  timeout -k 20 150 "$PY" -m rfwp_rl bench impala "${BENCH[@]}" --cores "$EAGER_CORES" --devices "${BENCH_DEVICES%%,*}" \
    --num-actors 48 --no-acting-graph --out "$OUT/bench_48_eager.csv" 2>&1 | tee -a "$OUT/bench.log"
fi
for n in $BIG_ENVS; do  # larger acting batches: the acting step's fixed cost spread over more envs
  echo "== bench impala, Pong, $n envs ($(elapsed) s)"
  timeout -k 20 150 "$PY" -m rfwp_rl bench impala "${BENCH[@]}" --cores lstm,rdn --devices "${BENCH_DEVICES%%,*}" \
    --num-actors "$n" --out "$OUT/bench_big_$n.csv" 2>&1 | tee -a "$OUT/bench.log"
done

if [ -n "$ALE_CORES" ]; then
  echo "== bench impala, Pong, 48 envs, ale backend ($(elapsed) s)"  # ale-py's vector env: C++ threads, no workers
  timeout -k 20 150 "$PY" -m rfwp_rl bench impala "${PONG[@]}" --env-backend ale --cores "$ALE_CORES" \
    --devices "${BENCH_DEVICES%%,*}" --num-actors 48 --out "$OUT/bench_ale.csv" 2>&1 | tee -a "$OUT/bench.log"
fi

# what might close the gap to the bounds: more env batches (a batch steps while another is acted on), fewer env
# processes than cores (the main and learner threads need cores too); LSTM on the first device, one row each
sweep_row() {  # NAME WHAT OPTION VALUE: one bench with OPTION VALUE added to BENCH's, into bench_NAME_VALUE.csv
  echo "== bench impala, Pong, 48 envs in $4 $2 ($(elapsed) s)"
  timeout -k 20 90 "$PY" -m rfwp_rl bench impala "${BENCH[@]}" "$3" "$4" --cores lstm --devices "${BENCH_DEVICES%%,*}" \
    --num-actors 48 --out "$OUT/bench_$1_$4.csv" 2>&1 | tee -a "$OUT/bench.log"
}
for b in $BATCH_SWEEP; do sweep_row batches batches --num-env-batches "$b"; done
for p in $PROCESS_SWEEP; do sweep_row processes "env processes" --num-env-processes "$p"; done

echo "== bench impala, vector agent ($(elapsed) s)"
timeout -k 20 120 "$PY" -m rfwp_rl bench impala --env rfwp/DelayedRecall-easy-v0 --cores rdn --devices "$BENCH_DEVICES" \
  --env-backend process --num-actors 32 --num-env-processes 4 --batch-size 8 --unroll-length 20 --seconds "$BENCH_SECONDS" \
  --warmup-seconds 5 --out "$OUT/bench_vector.csv" 2>&1 | tee -a "$OUT/bench.log"
echo "== bench impala, vector agent, GPU learner without its thread ($(elapsed) s)"  # is the thread what costs?
timeout -k 20 60 "$PY" -m rfwp_rl bench impala --env rfwp/DelayedRecall-easy-v0 --cores rdn --devices "${BENCH_DEVICES%%,*}" \
  --env-backend process --num-actors 32 --num-env-processes 4 --batch-size 8 --unroll-length 20 --seconds "$BENCH_SECONDS" \
  --warmup-seconds 5 --set learner_thread=false --out "$OUT/bench_vector_sync.csv" 2>&1 | tee -a "$OUT/bench.log"
# one table (the device hands back 8 files at most)
parts=("$OUT"/bench_48.csv "$OUT"/bench_48_eager.csv "$OUT"/bench_big_*.csv "$OUT"/bench_ale.csv "$OUT"/bench_batches_*.csv
  "$OUT"/bench_processes_*.csv "$OUT"/bench_vector.csv "$OUT"/bench_vector_sync.csv)
{ head -1 "$OUT/bench_48.csv"; for f in "${parts[@]}"; do tail -n +2 "$f"; done; } > "$OUT/gpu_bench.csv" 2>/dev/null
rm -f "${parts[@]}"

echo "== bench impala --topologies, Pong, lstm, 48 envs ($(elapsed) s)"
timeout -k 30 "$TOPOLOGY_TIMEOUT" "$PY" -m rfwp_rl bench impala --topologies local,remote,group --env Pong --cores lstm \
  --devices "${BENCH_DEVICES%%,*}" --env-backend process --num-actors 48 --num-env-processes "$ENV_PROCESSES" \
  --remote-actors 2 --seconds "$TOPOLOGY_SECONDS" --warmup-seconds 2 --out "$OUT/topology.csv" 2>&1 | tee -a "$OUT/bench.log"

LEFT=$(( TOTAL_SECONDS - $(elapsed) - 45 - EVAL_SECONDS ))
PONG_SECONDS=${PONG_SECONDS:-$LEFT}
[ "$PONG_SECONDS" -gt "$LEFT" ] && PONG_SECONDS=$LEFT
if ls "$RESUME_DIR"/ckpt_*.pt >/dev/null 2>&1; then  # the committed state: checkpoint, config, TensorBoard events
  cp "$RESUME_DIR"/ckpt_*.pt "$RESUME_DIR"/config.json "$RUN"/ && cp -r "$RESUME_DIR"/tb "$RUN"/ 2>/dev/null
fi
: > "$OUT/pong.log"
if [ "$PONG_SECONDS" -gt 30 ]; then
  echo "== Pong, $PONG_CORE, $PONG_ENVS envs, for $PONG_SECONDS s ($(elapsed) s)" | tee -a "$OUT/pong.log"
  timeout -s INT -k 40 "$PONG_SECONDS" "$PY" -m rfwp_rl train --env Pong --core "$PONG_CORE" --device "$TRAIN_DEVICE" \
    --env-backend process --num-actors "$PONG_ENVS" --num-env-processes "$ENV_PROCESSES" --total-steps 50000000 \
    --run-dir "$RUN" --log-every 20 --checkpoint-every 120 2>&1 | tee -a "$OUT/pong.log"
  trained=1
fi
newest=$(ls "$RUN"/ckpt_*.pt 2>/dev/null | sort | tail -1)
if [ -n "${trained:-}" ] && [ -n "$newest" ]; then  # the device hands back 8 files at most
  cp "$newest" "$OUT/" && (cd "$RUN" && tar czf "$OUT/pong_tb.tgz" tb config.json)
fi
if [ -n "$newest" ] && [ "$EVAL_SECONDS" -gt 0 ]; then  # the saved agent on the device it was trained on
  echo "== eval of $(basename "$newest"), greedy and sampled ($(elapsed) s)" | tee -a "$OUT/pong.log"
  for actions in greedy sample; do
    timeout -k 10 $(( EVAL_SECONDS / 2 )) "$PY" -m rfwp_rl eval "$newest" --env Pong --core "$PONG_CORE" --device "$TRAIN_DEVICE" \
      --episodes 30 --repeats 1 --num-actors 30 --actions "$actions" --out /tmp/rfwp_pong_eval --no-tensorboard 2>&1 | tee -a "$OUT/pong.log"
  done
fi
echo "== done ($(elapsed) s)"
