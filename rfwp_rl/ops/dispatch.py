"""Choosing between an op's fused kernel and its PyTorch reference, once.

``resolve(spec, backend, dims)`` returns a callable with the reference's signature. With
``backend="reference"`` it is the reference function itself. Otherwise the choice is made
once per (device, dtype) of the inputs (and per size when ``dims`` is not given at
resolution) and cached:

- the fused kernel when the extension is built and the op's ``supported(dims, dtype,
  device)`` says it runs these sizes (float16/bfloat16 inputs are computed in float32: the
  extension converts them once and converts the results back);
- else the reference: with ``backend="auto"`` after one warning line naming the size and
  why (none when the kernels are unavailable altogether: loading them warned already); with
  ``backend="kernel"`` a one-line :class:`~rfwp_rl.errors.UserError` instead.

The first use of a fused kernel on a CUDA device (``VERIFY_DEVICE_TYPES``) in a process runs
one tiny comparison with the reference (values and gradients, a reset, a non-zero initial
state); if it fails or disagrees the reference is used, after one warning line.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rfwp_rl import kernels
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.ops import cases
from rfwp_rl.ops.base import HALF_DTYPES, Dims, OpSpec

log = logging.getLogger("rfwp_rl.ops")

BACKENDS = ("auto", "kernel", "reference")
VERIFY_DEVICE_TYPES: frozenset[str] = frozenset({"cuda"})
"""Device types whose fused kernels are compared with the reference at first use."""
VERIFY_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}
"""Largest relative error (of outputs, and of gradients) the first-use comparison accepts."""

_lock = threading.Lock()
_warned: set[str] = set()
_verified: dict[tuple, str | None] = {}


def warn_once(message: str) -> None:
    """Log ``message`` (one line) as a warning, the first time only in this process."""
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    log.warning("%s", message)


def op_site(spec: OpSpec, dims: Dims, dtype: torch.dtype, device: torch.device | None) -> str:
    """``op NAME at SIZES (DTYPE, DEVICE)``, as the warnings and errors name a call."""
    at = f"op {spec.name!r} at {dims}"
    if device is None:
        return at
    return f"{at} ({str(dtype).replace('torch.', '')}, {device})"


def refuse(where: str, reason: str) -> UserError:
    """The one-line error of backend ``'kernel'`` where the fused op cannot run ``where``."""
    return UserError(f"backend 'kernel' cannot run {where}: {reason}; use backend 'auto' or 'reference'")


class FusedCall:
    """One fused op on one kernel backend for one (dims, dtype, device): the kernel call with
    its checkpoint interval. float16/bfloat16 inputs are computed in float32 (the extension
    converts them once and converts the results and gradients back)."""

    def __init__(self, spec: OpSpec, be: Any, dims: Dims, dtype: torch.dtype, device: torch.device) -> None:
        self.spec, self.be, self.dims, self.device = spec, be, dims, device
        self.compute_dtype = torch.float32 if dtype in HALF_DTYPES else dtype
        elem = torch.empty((), dtype=self.compute_dtype).element_size()
        self.state_bytes = spec.state_elems(dims) * elem

    def chunk(self, T: int) -> int:
        """Checkpoint interval of a sequence of T steps (see :mod:`rfwp_rl.kernels`)."""
        if self.device.type != "cpu":  # the CUDA kernels: one scratch matrix per step of a chunk
            return kernels.checkpoint_interval(T)
        if not self.spec.cpu_checkpoints:
            return T
        return kernels.checkpoint_interval(T, self.state_bytes)

    def __call__(self, args: Sequence[Any], kwargs: dict) -> tuple:
        # kwargs are options of the reference (rdn's feature_map); the choice of this plan
        # already checked that the fused kernel computes the same (see OpSpec.dims_of)
        return self.spec.fused(self.be, self.chunk(args[0].shape[0]), *args)


def _naive_call(spec: OpSpec) -> Callable[[Sequence[Any], dict], tuple]:
    return lambda args, kwargs: spec.naive(*args, **kwargs)


def first_use_check(spec: OpSpec, call: FusedCall) -> str | None:
    """Compare ``call``'s kernel with the reference on tiny inputs of its sizes (values and
    gradients, a reset mid-sequence, a non-zero initial state), once per process and
    (op, sizes, dtype, device, kernel backend). None when they agree, else why not."""
    key = (spec.name, call.dims, call.compute_dtype, str(call.device), id(call.be))
    with _lock:
        if key in _verified:
            return _verified[key]
    dtype = call.compute_dtype
    tol = VERIFY_TOLERANCE[dtype]
    try:
        with torch.inference_mode(False), torch.enable_grad():
            args, reset = cases.make_inputs(
                spec.name,
                T=5,
                B=2,
                H=1,
                d=call.dims.dv,
                dk=call.dims.dk,
                dtype=dtype,
                device=call.device,
                reset_at=((2, 1),),
                seed=11,
            )
            errors = cases.max_errors(spec.name, lambda *a: spec.fused(call.be, 2, *a), args, reset)
        worst = max(errors)
        why = (
            None
            if worst <= tol
            else f"its first run disagrees with the reference (relative error {worst:.2g} > {tol:g})"
        )
    except Exception as e:  # a failed launch must not end the user's run
        first = (str(e).strip().splitlines() or [""])[0][:160]
        why = f"its first run failed ({type(e).__name__}: {first})"
    with _lock:
        _verified[key] = why
    return why


def refusal(spec: OpSpec, ext: Any, dims: Dims, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the fused ``spec`` cannot run ``dims`` in ``dtype`` on ``device`` with the built
    kernels ``ext`` (None: it can): a build without CUDA kernels, a size or device its kernels do
    not take (``spec.supported``), or, on device types in :data:`VERIFY_DEVICE_TYPES`, a first
    run that disagrees with the reference (:func:`first_use_check`, once per process)."""
    if device.type == "cuda" and not ext.has_cuda():
        return "this build has CPU kernels only"
    reason = spec.supported(dims, dtype, device)
    if reason is None and device.type in VERIFY_DEVICE_TYPES:
        reason = first_use_check(spec, FusedCall(spec, ext, dims, dtype, device))
    return reason


class ResolvedOp:
    """Op ``spec`` for backend ``"auto"`` or ``"kernel"``: a callable with the reference's
    signature (``reset`` may be a keyword). The choice between the fused kernel and the
    reference is made at the first call per (device, dtype) of the inputs (and per size when
    ``dims`` is None) and kept."""

    def __init__(self, spec: OpSpec, backend: str, dims: Dims | None = None, options: dict | None = None) -> None:
        self.spec, self.backend, self.dims = spec, backend, dims
        self.options = dict(options or {})
        self.required = backend == "kernel"
        self._plans: dict[tuple, Callable[[Sequence[Any], dict], tuple]] = {}
        self.__name__ = spec.name
        self.__doc__ = f"Op {spec.name!r} on the {backend!r} backend (the reference's signature)."

    def __repr__(self) -> str:
        dims = f" at {self.dims}" if self.dims is not None else ""
        return f"<op {self.spec.name!r}{dims}, backend {self.backend!r}>"

    # copies of a module (e.g. the acting copy of an agent) share the choice; a pickle
    # carries what to resolve, not the loaded extension
    def __deepcopy__(self, memo: dict) -> ResolvedOp:
        return self

    def __reduce__(self) -> tuple:
        return _rebuild, (self.spec.name, self.backend, self.dims, self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        if "reset" in kwargs:
            args = (*args, kwargs.pop("reset"))
        if self.options:
            kwargs = {**self.options, **kwargs}
        x = args[0]
        if self.dims is not None:
            key = (x.device, x.dtype)
        else:
            key = (x.device, x.dtype, self.spec.dims_of(args, kwargs))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(key)
        return plan(args, kwargs)

    def _plan(self, key: tuple) -> Callable[[Sequence[Any], dict], tuple]:
        spec = self.spec
        device, dtype = key[0], key[1]
        dims = self.dims if self.dims is not None else key[2]
        where = op_site(spec, dims, dtype, device)
        ext, why = kernels.load()
        if ext is None:  # loading warned once already (or the kernels are disabled on purpose)
            if self.required:
                raise refuse(where, why)
            return _naive_call(spec)
        reason = refusal(spec, ext, dims, dtype, device)
        if reason is None:
            return FusedCall(spec, ext, dims, dtype, device)
        if self.required:
            raise refuse(where, reason)
        warn_once(f"rfwp_rl: {where} runs on the PyTorch reference: {reason}")
        return _naive_call(spec)


def _rebuild(name: str, backend: str, dims: Dims | None, options: dict) -> ResolvedOp:
    from rfwp_rl import ops  # the registry, here: ops imports this module

    return ResolvedOp(ops.spec(name), backend, dims, options)


def resolve(spec: OpSpec, backend: str = "auto", dims: Dims | None = None, **options: Any) -> Callable[..., tuple]:
    """The implementation of ``spec`` for ``backend`` (see the module docstring).

    ``dims``: the sizes every call will have, when known (a sublayer knows them at
    construction); what does not depend on the device is then decided now: with
    ``backend="kernel"`` an unavailable kernel or an unsupported size is a one-line error
    here, with ``"auto"`` the reference is returned (after one warning naming the size).
    ``options`` are bound keyword options of the reference (rdn's ``feature_map``).
    """
    check_choice("backend", backend, BACKENDS)
    naive = functools.partial(spec.naive, **options) if options else spec.naive
    if backend == "reference":
        return naive
    ext, why = kernels.load()
    if ext is None:
        if backend == "kernel":
            raise UserError(
                f"backend 'kernel' requested for op {spec.name!r} but {why}; use backend 'auto' or 'reference'"
            )
        return naive
    if dims is not None:
        # the limits that hold on every device (the CPU kernels have no size limit)
        reason = spec.supported(dims, torch.float32, torch.device("cpu"))
        if reason is not None:
            where = op_site(spec, dims, torch.float32, None)
            if backend == "kernel":
                raise refuse(where, reason)
            warn_once(f"rfwp_rl: {where} runs on the PyTorch reference: {reason}")
            return naive
    return ResolvedOp(spec, backend, dims, options)
