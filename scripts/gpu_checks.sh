#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one go (results/gpu/README.md says how long): build the CUDA kernels,
# run tests/test_kernels_gpu.py, `rfwp-rl info --check`, the CUDA kernel benchmark and a short
# IMPALA run with --device cuda. Writes its logs and tables to $OUT (default results/gpu).
# Needs torch with CUDA and gymnasium; moolib is not needed (the IMPALA run steps envs locally).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RFWP_CACHE=${RFWP_CACHE:-/tmp/rfwp_cache}
PY=${PYTHON:-python3}
{ nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/device.txt"
echo "== build"; "$PY" -m rfwp_rl.kernels 2>&1 | tail -5 | tee "$OUT/build.log"
echo "== GPU tests"; "$PY" -m pytest -p no:cacheprovider -o addopts="" -q tests/test_kernels_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
echo "== info --check"; "$PY" -m rfwp_rl info --check 2>&1 | tee "$OUT/info_check.txt" | tail -40
echo "== bench kernels --device cuda"; "$PY" -m rfwp_rl bench kernels --device cuda --repeats 20 --out "$OUT/kernels_cuda.csv" 2>&1 | tee "$OUT/bench_kernels_cuda.txt"
echo "== IMPALA --device cuda"
timeout "${IMPALA_SECONDS:-150}" "$PY" -m rfwp_rl train --env rfwp/DelayedRecall-easy-v0 --core rdn --device cuda \
  --env-backend local --total-steps "${IMPALA_STEPS:-100000}" --run-dir "${RUN_DIR:-/tmp/rfwp_cuda_run}" --log-every 10 2>&1 \
  | tee "$OUT/impala_cuda.txt" | tail -25
