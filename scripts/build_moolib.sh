#!/usr/bin/env bash
# Build moolib 0.0.9b0 from its pinned PyPI sdist (patched for Python >= 3.11 and GCC >= 12),
# cache the wheel, and pip-install it. What is patched and why: third_party/moolib/README.md.
#
# Usage: scripts/build_moolib.sh [--force] [--no-install] [--check]
#   --force       rebuild even if a cached wheel exists
#   --no-install  build (or find) the cached wheel and print its path, do not install it
#   --check       exit 0 if the matching moolib build is installed and imports, 1 if not
# Environment:
#   PYTHON        interpreter to build for (default: python3, else python)
#   RFWP_CACHE    cache root (default: ~/.cache/rfwp_rl); wheels in $RFWP_CACHE/wheels/moolib
#   USE_CUDA      1/0 (default: 1 if the installed torch is a CUDA build, else 0)
#   MAX_JOBS      parallel compile jobs (default: 2)
#
# The wheel is keyed by: moolib version, sdist/pybind11 pins, patch hash, Python tag, torch
# version (moolib links against libtorch), USE_CUDA and the machine architecture. A second run
# with the same key reuses the cached wheel; a cold build takes minutes (run it under nice on a
# busy machine).
set -euo pipefail

say() { echo "build_moolib: $*"; }
die() { echo "build_moolib: error: $*" >&2; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PINDIR="$ROOT/third_party/moolib"
[ -f "$PINDIR/source.env" ] || die "missing $PINDIR/source.env"
# shellcheck source=../third_party/moolib/source.env
. "$PINDIR/source.env"
PATCH_FILE="$PINDIR/$MOOLIB_PATCH"
[ -f "$PATCH_FILE" ] || die "missing patch $PATCH_FILE"

FORCE=0; INSTALL=1; CHECK=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --no-install) INSTALL=0 ;;
    --check) CHECK=1 ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$arg' (allowed: --force, --no-install, --check)" ;;
  esac
done

PY="${PYTHON:-$(command -v python3 || command -v python || true)}"
[ -n "$PY" ] || die "no python found; set PYTHON=/path/to/python"
PYEXE="$("$PY" -c 'import sys; print(sys.executable)')" || die "cannot run '$PY'"
for tool in cmake patch tar; do
  command -v "$tool" >/dev/null || die "'$tool' not found (Debian: apt-get install -y $tool)"
done
CMAKE_VERSION="$(cmake --version | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')"
[ "$(printf '3.18\n%s\n' "$CMAKE_VERSION" | sort -V | head -n1)" = 3.18 ] \
  || die "cmake $CMAKE_VERSION is too old; allowed: 3.18 or newer (FindPython's Development.Module)"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (Debian: apt-get install -y g++)"

# -- what we build for ----------------------------------------------------------------------
INFO="$("$PYEXE" - <<'EOF'
import platform, sys
try:
    import torch
except ImportError:
    sys.exit("torch is not installed")
cuda = int(bool(torch.cuda.is_available() or torch.version.cuda is not None))
print(f"cp{sys.version_info[0]}{sys.version_info[1]}", torch.__version__, cuda, platform.machine())
EOF
)" || die "torch is not importable by $PYEXE; moolib builds against it (install torch first)"
read -r PYTAG TORCH_VERSION TORCH_CUDA MACHINE <<<"$INFO"
USE_CUDA="${USE_CUDA:-$TORCH_CUDA}"
case "$USE_CUDA" in 0|1) ;; ON|on) USE_CUDA=1 ;; OFF|off) USE_CUDA=0 ;; *) die "USE_CUDA must be 0 or 1, got '$USE_CUDA'" ;; esac
JOBS="${MAX_JOBS:-2}"
CUDA_TAG=$([ "$USE_CUDA" = 1 ] && echo cuda || echo cpu)
PATCH_HASH="$(sha256sum "$PATCH_FILE" | cut -c1-12)"
KEY="$( { cat "$PINDIR/source.env" "$PATCH_FILE"; echo "$PYTAG $TORCH_VERSION $USE_CUDA $MACHINE"; } | sha256sum | cut -c1-16)"
CACHE="${RFWP_CACHE:-${HOME:-/tmp}/.cache/rfwp_rl}"
WHEEL_DIR="$CACHE/wheels/moolib/$MOOLIB_VERSION-$PYTAG-torch$TORCH_VERSION-$CUDA_TAG-patch$PATCH_HASH-$KEY"
SRC_CACHE="$CACHE/sources"

installed_ok() {
  "$PYEXE" - "$KEY" <<'EOF' >/dev/null 2>&1
import sys
import moolib, moolib._rfwp_build as b
sys.exit(0 if b.KEY == sys.argv[1] else 1)
EOF
}

if [ "$CHECK" = 1 ]; then
  if installed_ok; then say "moolib $MOOLIB_VERSION ($KEY) is installed"; exit 0; fi
  say "moolib $MOOLIB_VERSION ($KEY) is not installed"; exit 1
fi

mkdir -p "$CACHE/wheels/moolib" "$SRC_CACHE"
# one build at a time per cache (two shells running setup at once)
if command -v flock >/dev/null; then
  exec 9>"$CACHE/wheels/moolib/.lock"
  flock 9
fi

if [ "$INSTALL" = 1 ] && [ "$FORCE" = 0 ] && installed_ok; then
  say "moolib $MOOLIB_VERSION already installed for $PYTAG, torch $TORCH_VERSION, USE_CUDA=$USE_CUDA (key $KEY)"
  exit 0
fi

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

fetch() {  # fetch <file> <sha256> <pip download args...>: into $SRC_CACHE, verified
  local file="$1" sha="$2"; shift 2
  if sha_ok "$SRC_CACHE/$file" "$sha"; then return 0; fi
  local tmp; tmp="$(mktemp -d "$SRC_CACHE/.dl.XXXXXX")"
  say "downloading $file"
  "$PYEXE" -m pip download --quiet --no-deps --dest "$tmp" "$@" \
    || { rm -rf "$tmp"; die "pip download $* failed (network or index problem)"; }
  [ -f "$tmp/$file" ] || { ls "$tmp" >&2; rm -rf "$tmp"; die "pip download did not produce $file"; }
  local got; got="$(sha256sum "$tmp/$file" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    rm -rf "$tmp"; die "sha256 mismatch for $file: expected $sha, got $got"
  fi
  mv "$tmp/$file" "$SRC_CACHE/$file"; rm -rf "$tmp"
}

WHEEL="$(ls "$WHEEL_DIR"/moolib-*.whl 2>/dev/null | head -n1 || true)"
if [ -n "$WHEEL" ] && [ "$FORCE" = 0 ]; then
  say "using cached wheel $WHEEL"
else
  # setuptools >= 70.1 builds wheels itself; older ones need the 'wheel' package. We build
  # without build isolation because moolib's CMake must import the installed torch.
  if ! "$PYEXE" -c 'import setuptools.command.bdist_wheel' 2>/dev/null \
     && ! "$PYEXE" -c 'import wheel' 2>/dev/null; then
    say "installing setuptools>=70.1 (needed to build a wheel without build isolation)"
    "$PYEXE" -m pip install --quiet 'setuptools>=70.1' || die "could not install setuptools>=70.1"
  fi

  fetch "$MOOLIB_SDIST" "$MOOLIB_SDIST_SHA256" "moolib==$MOOLIB_VERSION" --no-binary :all:
  fetch "$PYBIND11_WHEEL" "$PYBIND11_WHEEL_SHA256" "pybind11==$PYBIND11_VERSION" --only-binary :all:

  BUILD="$CACHE/build/moolib-$KEY"
  rm -rf "$BUILD"; mkdir -p "$BUILD"
  tar -xzf "$SRC_CACHE/$MOOLIB_SDIST" -C "$BUILD"
  SRC="$BUILD/moolib-$MOOLIB_VERSION"
  [ -d "$SRC" ] || die "unexpected sdist layout (no moolib-$MOOLIB_VERSION/ inside)"

  # The sdist ships stray build products (a macOS _C.so, __pycache__, editor backups).
  find "$SRC" \( -name '__pycache__' -o -name '*.so' -o -name '*~' -o -name '.!*' \) -prune -exec rm -rf {} +

  # Swap the bundled pybind11 2.9 headers (predate Python 3.11) for the pinned release.
  "$PYEXE" - "$SRC_CACHE/$PYBIND11_WHEEL" "$SRC/third_party/pybind11/include" <<'EOF' || die "could not unpack pybind11 headers"
import pathlib, shutil, sys, zipfile
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
shutil.rmtree(dest / "pybind11")
prefix = "pybind11/include/pybind11/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit("no headers in " + wheel)
    for n in names:
        out = dest / "pybind11" / n[len(prefix):]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(n))
EOF

  say "applying $(basename "$PATCH_FILE")"
  (cd "$SRC" && patch -p1 --forward --batch --silent < "$PATCH_FILE") || die "patch did not apply to the pinned sdist"

  cat > "$SRC/py/moolib/_rfwp_build.py" <<EOF
"""Written by rfwp_rl's scripts/build_moolib.sh: what this moolib build was made from."""
KEY = "$KEY"
MOOLIB_VERSION = "$MOOLIB_VERSION"
PYBIND11_VERSION = "$PYBIND11_VERSION"
PATCH = "$MOOLIB_PATCH"
PATCH_SHA256_PREFIX = "$PATCH_HASH"
PYTHON_TAG = "$PYTAG"
TORCH_VERSION = "$TORCH_VERSION"
USE_CUDA = $USE_CUDA
EOF

  LOG="$BUILD/build.log"
  # A CUDA torch's CMake config needs the CUDA toolkit (found from nvcc) and its NVRTC. Where nvcc is a wrapper
  # outside the toolkit, use /usr/local/cuda; where the toolkit has no NVRTC, the one torch itself loads (its
  # pip package), linked under the name CMake looks for.
  if [ "$TORCH_CUDA" = 1 ]; then
    NVCC="$(command -v nvcc || true)"
    CUDA_ROOT="${CUDA_PATH:-}"
    if [ -z "$CUDA_ROOT" ] && [ -n "$NVCC" ]; then CUDA_ROOT="$(cd "$(dirname "$NVCC")/.." && pwd)"; fi
    if [ ! -f "$CUDA_ROOT/include/cuda_runtime.h" ] && [ -f /usr/local/cuda/include/cuda_runtime.h ]; then
      CUDA_ROOT=/usr/local/cuda
      export CUDA_PATH="$CUDA_ROOT"
      say "CUDA toolkit: $CUDA_ROOT (nvcc $NVCC is outside it)"
    fi
    if [ ! -e "$CUDA_ROOT/lib64/libnvrtc.so" ] && [ ! -e "$CUDA_ROOT/lib/libnvrtc.so" ]; then
      NVRTC="$("$PYEXE" -c 'import glob, os, torch
root = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia")
print(min(glob.glob(os.path.join(root, "**", "libnvrtc.so.[0-9]*"), recursive=True), default=""))')"
      [ -n "$NVRTC" ] || die "the CUDA toolkit at $CUDA_ROOT has no NVRTC, and torch's pip packages none either"
      mkdir -p "$BUILD/nvrtc" && ln -sf "$NVRTC" "$BUILD/nvrtc/libnvrtc.so"
      export CMAKE_LIBRARY_PATH="$BUILD/nvrtc${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}"
      say "NVRTC: $NVRTC (the toolkit at $CUDA_ROOT has none)"
    fi
  fi
  say "building moolib $MOOLIB_VERSION for $PYTAG, torch $TORCH_VERSION, USE_CUDA=$USE_CUDA with $JOBS jobs (several minutes; log: $LOG)"
  START=$(date +%s)
  # CMake runs `python -c "import torch"`: put this interpreter first on PATH.
  # LDFLAGS=-s strips the debug info of the RelWithDebInfo build (a much smaller wheel).
  # CMAKE_POLICY_VERSION_MINIMUM: CMake >= 4 refuses the bundled libuv's cmake_minimum_required(< 3.5) without it
  if ! env PATH="$(dirname "$PYEXE"):$PATH" USE_CUDA="$USE_CUDA" MAX_JOBS="$JOBS" \
       CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" CMAKE_POLICY_VERSION_MINIMUM=3.5 LDFLAGS="${LDFLAGS:-} -s" \
       "$PYEXE" -m pip wheel -v --no-deps --no-build-isolation --no-cache-dir \
       --wheel-dir "$BUILD/dist" "$SRC" >"$LOG" 2>&1; then
    echo "---- last 40 lines of $LOG ----" >&2; tail -n 40 "$LOG" >&2
    die "moolib build failed (full log: $LOG)"
  fi
  say "built in $(( $(date +%s) - START )) s"
  BUILT="$(ls "$BUILD"/dist/moolib-*.whl 2>/dev/null | head -n1 || true)"
  [ -n "$BUILT" ] || die "the build produced no wheel (log: $LOG)"
  rm -rf "$WHEEL_DIR"; mkdir -p "$WHEEL_DIR"
  mv "$BUILT" "$WHEEL_DIR/"
  WHEEL="$WHEEL_DIR/$(basename "$BUILT")"
  rm -rf "$BUILD"
  say "cached wheel $WHEEL"
fi

if [ "$INSTALL" = 0 ]; then echo "$WHEEL"; exit 0; fi

say "installing $(basename "$WHEEL")"
"$PYEXE" -m pip install --quiet --no-deps --force-reinstall "$WHEEL" || die "pip install of $WHEEL failed"

# Smoke test in a fresh interpreter: import, and an Rpc listening on loopback.
if ! "$PYEXE" - <<'EOF'; then
import moolib
rpc = moolib.Rpc()
rpc.set_name("build_check")
rpc.listen("127.0.0.1:0")
del rpc
EOF
  die "moolib was installed but does not work (see the error above)"
fi
installed_ok || die "moolib installed but its build key does not match ($KEY)"
say "moolib $MOOLIB_VERSION installed and working (key $KEY)"
