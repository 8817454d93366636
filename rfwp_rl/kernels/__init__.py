"""Python side of ``csrc/``: builds the fused kernels and wraps them as autograd Functions.

``get(name, required)`` returns the fused implementation of op ``name`` (same signature as
:mod:`rfwp_rl.ops.reference`), or None in ``auto`` mode when the kernels are unavailable.
The returned callable itself falls back to the reference for inputs the kernels do not
support (dtypes other than float32/float64, devices without a kernel, ``rdn`` with a feature
map other than softmax); with ``required=True`` it raises a one-line
:class:`~rfwp_rl.errors.UserError` instead.

The C++ extension is built on first use (about a minute, once per source version and
machine; ``python -m rfwp_rl.kernels --build`` does it ahead of time) and cached, see
:mod:`rfwp_rl.kernels._build`. If the build fails the package still works on the reference:
one one-line warning names the reason and the build log. ``RFWP_RL_KERNELS=0`` disables the
fused kernels.

Backward memory: fast weights are checkpointed every C steps and recomputed inside each
chunk during the backward pass: O(T/C) matrices per (batch, head) are kept between forward
and backward, plus a C-matrix scratch per thread during the backward. On CPU, C is
``checkpoint_interval(T, state_bytes)``: the whole sequence (one checkpoint, the initial
state) when the T states of one (batch, head) fit in ``ONE_CHUNK_BYTES`` (then the scratch
stays in the L2 cache), else ``max(16, ceil(sqrt(T)))``; ``lt`` always keeps only the initial
state and needs no scratch (its backward rebuilds the states in place, in a forward pass).
The CUDA kernels use ``checkpoint_interval(T)`` = ``max(16, ceil(sqrt(T)))``. Settable with
:func:`set_checkpoint_interval` (not for the CPU ``lt``, which has nothing to set).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import threading
from typing import Any, Callable

import torch
from torch import Tensor

from rfwp_rl.errors import UserError, check_choice

OPS = ("lt", "delta", "delta_rnn", "rdn")
DTYPES = (torch.float32, torch.float64)

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {"loaded": False, "ext": None, "why": "", "build_seconds": 0.0}
_checkpoint_interval: int | None = None
ONE_CHUNK_BYTES = 512 * 1024
"""Largest backward scratch (T fast-weight states of one (batch, head)) for one chunk."""


# ------------------------------------------------------------------------ build / status

def _load() -> tuple[Any, str]:
    """(extension module or None, why). Builds at most once per process."""
    if _state["loaded"]:
        return _state["ext"], _state["why"]
    with _lock:
        if _state["loaded"]:
            return _state["ext"], _state["why"]
        ext, why = None, ""
        if os.environ.get("RFWP_RL_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
            why = "fused kernels disabled by RFWP_RL_KERNELS=0"
        else:
            from rfwp_rl.kernels import _build

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
    ext, why = _load()
    return ("kernel" if ext is not None else "reference"), why


def build() -> tuple[str, str]:
    """Build (or load from the cache) now; returns :func:`status`."""
    return status()


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


# ------------------------------------------------------------------------------ dispatch

def _is_softmax(fm: Any) -> bool:
    if fm is None:
        return True
    from rfwp_rl.cores import feature_maps
    from rfwp_rl.ops import reference

    return fm is feature_maps.softmax or fm is getattr(reference, "_softmax", None)


def unsupported(ext: Any, name: str, tensors: list[Tensor | None], reset: Tensor | None,
                feature_map: Any = None) -> str | None:
    """Why the fused kernel cannot run these inputs (None: it can)."""
    ts = [t for t in tensors if t is not None]
    dtype, device = ts[0].dtype, ts[0].device
    if dtype not in DTYPES:
        return f"dtype {dtype} (fused kernels: float32, float64)"
    if any(t.dtype != dtype for t in ts) or any(t.device != device for t in ts):
        return "inputs with mixed dtypes or devices"
    if device.type == "cuda":
        if not ext.has_cuda():
            return "CUDA tensors (this build has CPU kernels only)"
    elif device.type != "cpu":
        return f"device {device.type!r}"
    if reset is not None and (reset.device != device or reset.dtype not in (torch.bool, torch.uint8)):
        return "a reset mask that is not bool/uint8 on the inputs' device"
    if ts[0].dim() != 4 or ts[0].shape[0] == 0:
        return "an empty or malformed sequence"
    if name == "rdn":
        if not _is_softmax(feature_map):
            return f"rdn with feature_map {feature_map!r} (fused kernel: softmax only)"
        if tensors[8] is not None and tensors[8].shape[-1] != tensors[0].shape[-1]:
            return "rdn with a key size different from the head size"
    return None


def _state_bytes(name: str, tensors: list[Tensor | None]) -> int:
    """Bytes of the fast-weight state of one (batch, head): W [dv, dk] (and delta_rnn's R)."""
    dk, dv = tensors[0].shape[-1], tensors[2].shape[-1]
    size = dv * dk + (dv * dv if name == "delta_rnn" else 0)
    return size * tensors[0].element_size()


class FusedOp:
    """Callable with the reference signature of op ``name`` that runs the fused kernel.

    Unsupported inputs go to the reference (``required=False``) or raise UserError.
    """

    def __init__(self, name: str, required: bool) -> None:
        from rfwp_rl.ops import reference

        self.name = name
        self.required = required
        self._signature = inspect.signature(getattr(reference, name))
        self.__name__ = name
        self.__doc__ = f"Fused kernel of rfwp_rl.ops.reference.{name} (same signature)."

    def __repr__(self) -> str:
        return f"<fused {self.name} op{' (required)' if self.required else ''}>"

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        from rfwp_rl.kernels import functions
        from rfwp_rl.ops import reference

        bound = self._signature.bind(*args, **kwargs)
        feature_map = bound.arguments.pop("feature_map", None)
        args = tuple(bound.arguments.values())   # every positional parameter, in order
        ext, why = _load()
        tensors, reset = list(args[:-1]), args[-1]
        reason = why if ext is None else unsupported(ext, self.name, tensors, reset, feature_map)
        if reason is not None:
            if self.required:
                raise UserError(f"backend 'kernel' cannot run op {self.name!r}: {reason}; "
                                "use backend 'auto' or 'reference'")
            ref = getattr(reference, self.name)
            return ref(*args, feature_map=feature_map) if self.name == "rdn" else ref(*args)
        T = tensors[0].shape[0]
        if tensors[0].device.type != "cpu":   # the CUDA kernels: one scratch matrix per step of a chunk
            chunk = checkpoint_interval(T)
        elif self.name == "lt":               # the CPU lt backward reads only the initial state
            chunk = T
        else:
            chunk = checkpoint_interval(T, _state_bytes(self.name, tensors))
        return functions.FUSED[self.name](ext, chunk, *args)


_OPS_CACHE = {(n, r): FusedOp(n, r) for n in OPS for r in (False, True)}


def get(name: str, required: bool = False) -> Callable | None:
    """The fused op ``name`` (reference signature), or None when the kernels are unavailable
    and ``required`` is False; with ``required`` a one-line UserError says why."""
    check_choice("op", name, OPS)
    ext, why = _load()
    if ext is None:
        if required:
            raise UserError(f"backend 'kernel' requested for op {name!r} but {why}; "
                            "use backend 'auto' or 'reference'")
        return None
    return _OPS_CACHE[(name, required)]
