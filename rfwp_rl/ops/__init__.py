"""Fast-weight recurrences: the sequential part of each fast-weight core.

Every op has a plain PyTorch reference in :mod:`rfwp_rl.ops.reference` and a fused
implementation (C++ on CPU, CUDA on GPU) in :mod:`rfwp_rl.kernels`, with the same signature.
``get(name, backend)`` picks one:

- ``"reference"``: always the PyTorch reference;
- ``"kernel"``: the fused kernel, or a one-line error saying why it is unavailable;
- ``"auto"``: the fused kernel when it is built and supports the inputs, else the reference.

Shapes (time-major, heads split; T steps, B batch, H heads, d head size; all inputs have the
same dtype/device; ``reset`` is bool ``[T, B]``: True zeroes entry b's state *before* step t):

- ``lt(q, k, v, W0, reset) -> (y, W)``: q, k ``[T,B,H,dk]``, v ``[T,B,H,dv]``,
  W0 ``[B,H,dv,dk]``; y ``[T,B,H,dv]``, W the final fast weights.
- ``delta(q, k, v, beta, W0, reset) -> (y, W)``: as ``lt`` plus beta ``[T,B,H]``.
- ``delta_rnn(q, k, v, beta, kr, vr, beta_r, W0, R0, y0, reset) -> (y, W, R)``:
  kr, vr ``[T,B,H,d]``, beta_r ``[T,B,H]``, R0 ``[B,H,d,d]``, y0 ``[B,H,d]``.
- ``rdn(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0, reset) -> (y, W)``: the slow
  projections xq, xk, xv ``[T,B,H,d]``, xb ``[T,B,H]``; recurrent slow weights Rq, Rk, Rv
  ``[H,d,d]``, rb ``[H,d]``; W0 ``[B,H,d,d]``, y0 ``[B,H,d]``.
"""

from __future__ import annotations

from typing import Callable

from rfwp_rl.errors import check_choice
from rfwp_rl.ops import reference

OPS = ("lt", "delta", "delta_rnn", "rdn")
BACKENDS = ("auto", "kernel", "reference")


def get(name: str, backend: str = "auto") -> Callable:
    """The implementation of op ``name`` for ``backend`` (see module docstring)."""
    check_choice("op", name, OPS)
    check_choice("backend", backend, BACKENDS)
    if backend == "reference":
        return getattr(reference, name)
    from rfwp_rl import kernels

    fused = kernels.get(name, required=(backend == "kernel"))
    return fused if fused is not None else getattr(reference, name)
