#!/usr/bin/env bash
# Single-machine IMPALA run in the RFWP paper's Atari setting (App. C): 48 actors, batch 32,
# unroll 50, RMSProp 6e-4 decayed linearly to 0, V-trace with rho-bar = c-bar = 1, entropy 0.01,
# baseline 0.5, discount 0.99, rewards clipped to [-1, 1], snapshots at 50M and 200M steps.
#
# Edit GAME / CORE / STEPS (or set them in the environment), e.g.
#   GAME=Seaquest CORE=lstm bash launch/train_atari.sh
#   CORE=delta_rnn STEPS=50000000 bash launch/train_atari.sh --set core_config.backend=reference
# Extra arguments go to `rfwp-rl train` as they are. Re-running the same command resumes the run
# (runs/impala/ALE-<GAME>-v5_<CORE>_s<SEED>); Ctrl-C saves a checkpoint and stops.
# Cores: ff lstm gru lt delta delta_rnn rdn fwm (agents/atari_<core>.toml).
# Throughput: a GPU learner is what makes 200M steps feasible (the paper: 2 GPUs, ~1.5 days
# per game); on a CPU-only machine measure first with `rfwp-rl bench impala`.
set -euo pipefail
cd "$(dirname "$0")/.."

GAME=${GAME:-Pong}
CORE=${CORE:-rdn}
STEPS=${STEPS:-200000000}
SEED=${SEED:-1}
DEVICE=${DEVICE:-$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")}
NUM_ACTORS=${NUM_ACTORS:-48}
ENV_PROCS=${ENV_PROCS:-$(nproc)}

exec rfwp-rl train \
  --env "$GAME" \
  --core "$CORE" \
  --seed "$SEED" \
  --total-steps "$STEPS" \
  --num-actors "$NUM_ACTORS" \
  --num-env-processes "$ENV_PROCS" \
  --batch-size 32 \
  --unroll-length 50 \
  --device "$DEVICE" \
  --snapshot-steps 50000000,200000000 \
  "$@"
