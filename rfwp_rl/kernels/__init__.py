"""Python side of ``csrc/``: builds and loads the fused kernels (the raw extension handles).

This layer knows nothing of ops or cores: :mod:`rfwp_rl.ops` wraps the extension's functions
in autograd Functions and decides, per op and size, whether the fused kernel or the PyTorch
reference runs. ``load()`` returns the extension (or None and why); ``status()`` says which
backend is active for ``rfwp-rl info``.

The C++ extension is built on first use (about a minute, once per source version and
machine; ``python -m rfwp_rl.kernels`` does it ahead of time) and cached, see
:mod:`rfwp_rl.kernels._build`. If the build fails the package still works on the reference:
one one-line warning names the reason and the build log. ``RFWP_RL_KERNELS=0`` disables the
fused kernels.

Backward memory: fast weights are checkpointed every C steps and recomputed inside each
chunk during the backward pass: O(T/C) matrices per (batch, head) are kept between forward
and backward, plus a C-matrix scratch per thread during the backward. On CPU, C is
``checkpoint_interval(T, state_bytes)``: the whole sequence (one checkpoint, the initial
state) when the T states of one (batch, head) fit in ``ONE_CHUNK_BYTES`` (then the scratch
stays in the L2 cache), else ``max(16, ceil(sqrt(T)))``; the CPU ``lt`` always keeps only the
initial state and needs no scratch (its backward rebuilds the states in place, in a forward
pass). The CUDA kernels use ``checkpoint_interval(T)`` = ``max(16, ceil(sqrt(T)))``. Settable
with :func:`set_checkpoint_interval` (not for the CPU ``lt``, which has nothing to set).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

from rfwp_rl.errors import UserError
from rfwp_rl.kernels import _build

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {"loaded": False, "ext": None, "why": "", "build_seconds": 0.0}
_checkpoint_interval: int | None = None
ONE_CHUNK_BYTES = 512 * 1024
"""Largest backward scratch (T fast-weight states of one (batch, head)) for one chunk."""


# ------------------------------------------------------------------------ build / status


def load() -> tuple[Any, str]:
    """(the extension module, or None when the kernels are unavailable; why).

    Builds at most once per process (nothing when cached). The extension's functions are
    ``<op>_forward`` / ``<op>_backward`` (``csrc/bindings.cpp``) and ``has_cuda()``.
    """
    if _state["loaded"]:
        return _state["ext"], _state["why"]
    with _lock:
        if _state["loaded"]:
            return _state["ext"], _state["why"]
        ext, why = None, ""
        if os.environ.get("RFWP_RL_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
            why = "fused kernels disabled by RFWP_RL_KERNELS=0"
        else:
            cuda_note = ""
            try:
                if _build.torch_has_cuda():
                    try:
                        ext, secs = _build.load_extension(with_cuda=True)
                    except _build.BuildError as e:
                        cuda_note = f"; CUDA kernels unavailable: {e} (log: {e.log})"
                        ext, secs = _build.load_extension(with_cuda=False)
                else:
                    ext, secs = _build.load_extension(with_cuda=False)
                _state["build_seconds"] = secs
                devices = "CPU + CUDA" if ext.has_cuda() else "CPU"
                built = f"built in {secs:.0f} s" if secs > 0 else "cached"
                why = f"fused C++ kernels ({devices}; {built} in {_build.cache_root()}){cuda_note}"
            except _build.BuildError as e:
                ext = None
                where = f"; log: {e.log}" if e.log else ""
                why = f"fused kernels unavailable: {e}{where}"
                log.warning("rfwp_rl: %s; using the PyTorch reference", why)
        _state.update(loaded=True, ext=ext, why=why)
        return ext, why


def status() -> tuple[str, str]:
    """(active backend, why) for ``rfwp-rl info``: ``("kernel", ...)`` or ``("reference", ...)``.

    Builds the kernels if they are not cached yet.
    """
    ext, why = load()
    return ("kernel" if ext is not None else "reference"), why


# ------------------------------------------------------------------ checkpoint interval


def checkpoint_interval(T: int, state_bytes: int | None = None) -> int:
    """Steps between stored fast-weight checkpoints for a sequence of ``T`` steps.

    ``state_bytes``: size of the fast-weight state of one (batch, head) (all its matrices).
    When given and ``T * state_bytes <= ONE_CHUNK_BYTES`` the whole sequence is one chunk:
    the forward stores only the initial state and the backward recomputes all T states once
    into a per-thread scratch of at most ONE_CHUNK_BYTES (checkpoint writes to memory cost
    more than the recomputation they would save).
    """
    if _checkpoint_interval is not None:
        return _checkpoint_interval
    if state_bytes is not None and T * state_bytes <= ONE_CHUNK_BYTES:
        return T
    # at least 16: every checkpoint is a write of B*H matrices to cold memory in the forward
    # (costlier than a step); the backward's per-chunk scratch (16 x dv x dk) stays in cache
    return max(16, math.ceil(math.sqrt(T)))


def set_checkpoint_interval(every: int | None) -> None:
    """Fix the checkpoint interval (``None``: the default of :func:`checkpoint_interval`).
    Results do not depend on it beyond rounding."""
    global _checkpoint_interval
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise UserError(f"checkpoint interval {every!r} is invalid; allowed: a positive integer or None")
    _checkpoint_interval = every
