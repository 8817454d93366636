#!/usr/bin/env bash
# Set up rfwp_rl on a fresh machine (idempotent; a second run takes seconds):
#  1. torch==2.13.0 first where torch is missing, so CPU machines never pull CUDA wheels; an
#     older torch than the package needs (rfwp_rl.MIN_TORCH) stops the set-up, in one line;
#  2. moolib 0.0.9b0 from its pinned, hash-checked source with our small patch, built once
#     into a cached wheel (scripts/build_moolib.sh, third_party/moolib/README.md);
#  3. the package itself (editable) with its test dependencies;
#  4. the fused C++ kernels, built once into the cache (the package falls back to the
#     PyTorch reference with one warning if this fails).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0"
  "$PY" -m pip install -q "torch==2.13.0" numpy
fi
# the checkout's own rule (rfwp_rl/__init__.py); its last line says what is wrong and what to do
if ! out=$("$PY" -c "import rfwp_rl" 2>&1); then
  line=${out##*$'\n'}
  echo "[setup] error: ${line#ImportError: }" >&2
  exit 1
fi
echo "[setup] moolib"
PYTHON="$PY" bash scripts/build_moolib.sh
echo "[setup] rfwp_rl (editable) + test dependencies"
"$PY" -m pip install -q -e ".[test]"
echo "[setup] fused kernels"
"$PY" -m rfwp_rl.kernels || echo "[setup] kernel build failed: the PyTorch reference will be used"
echo "[setup] done"
