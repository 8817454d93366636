"""Fast-weight recurrences: the sequential part of each fast-weight core.

One folder per op (``lt``, ``delta``, ``delta_rnn``, ``rdn``, ``gated_delta``,
``delta_product``, ``srwm``, ``fwm``, the LSTM layer ``lstm``, Mamba's selective SSM
``mamba``): ``naive.py`` (the plain PyTorch reference), ``fused.py`` (its autograd Function
over the C++/CUDA kernels of ``csrc/``, and ``supported``: the sizes the fused kernel runs)
and ``__init__.py`` (its :class:`~rfwp_rl.ops.base.OpSpec`). Layers: cores -> ops -> kernels (build, load).

``get(name, backend)`` (or ``resolve(name, backend, dims)`` when the sizes are known, once
at construction) picks an implementation with the reference's signature:

- ``"reference"``: the PyTorch reference;
- ``"kernel"``: the fused kernel, or a one-line error saying why it cannot run;
- ``"auto"``: the fused kernel when it is built and runs the inputs' sizes, dtype and device,
  else the reference (with one warning naming the size).

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
- ``gated_delta(q, k, v, alpha, beta, S0, reset) -> (o, S)``: as ``delta`` plus the decays
  alpha ``[T,B,H]``.
- ``delta_product(q, k, v, beta, S0, reset) -> (o, S)``: n_h keys, values and β per step:
  k ``[T,B,H,n_h,dk]``, v ``[T,B,H,n_h,dv]``, beta ``[T,B,H,n_h]``.
- ``srwm(x, W_init, dW0, reset) -> (y, dW)``: x ``[T,B,H,D]``, the slow initial weights
  W_init ``[H,3d+4,D]``, the state dW0 ``[B,H,3d+4,D]`` (the change from W_init).
- ``fwm(w, r, F0, reset) -> (y, F)``: the FWM controller's slow projections w ``[T,B,H,3m+1]``
  (write keys, value, strength) and r ``[T,B,H,(1+N_r)m]`` (read keys), before tanh / σ; the
  fast tensor F0 ``[B,H,m,m,m]``; y ``[T,B,H,m]``. Fused on CPU only (no CUDA kernel).
- ``lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, reset) -> (y, h, c)``: one LSTM layer with
  torch.nn.LSTM's parameters (gates i, f, g, o): x ``[T,B,I]``, h0, c0 ``[B,H]``, w_ih
  ``[4H,I]``, w_hh ``[4H,H]``, b_ih, b_hh ``[4H]``; y ``[T,B,H]``; Dims (dk, dv) = (I, H).
  Fused on CPU only (on a GPU the cores run cuDNN's nn.LSTM).
- ``mamba(u, delta, A, B, C, h0, reset) -> (y, h)``: Mamba's selective SSM, u, delta
  ``[T,B,D]``, A ``[D,N]``, B, C ``[T,B,N]``, h0 ``[B,D,N]``; y ``[T,B,D]``; Dims (dk, dv) =
  (N, D). Fused on CPU and CUDA (where it cannot run, the core runs its chunked PyTorch form).

Recurrences without a fused kernel (parallel in PyTorch: as a scan, or in chunks of the unroll)
have a folder with ``naive.py`` beside the parallel form and no :class:`OpSpec`:

- ``diagonal_scan(a, b, h0, reset) -> (h, h_T)``: ``h_t = a_t ⊙ h_{t-1} + b_t`` (real or
  complex), b ``[T,B,*S]``, a broadcastable to b, h0 ``[B,*S]``.
- ``mlstm(q, k, v, i_pre, f_pre, C0, n0, m0, reset) -> (h, C, n, m)``: xLSTM's matrix memory
  (``mlstm_naive``; ``mlstm_chunked``, the parallel form over chunks of the unroll): q, k
  ``[T,B,H,dk]``, v ``[T,B,H,dv]``, the gate pre-activations ``[T,B,H]``, the stabilised state
  C0 ``[B,H,dv,dk]``, n0 ``[B,H,dk]``, m0 ``[B,H]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rfwp_rl.errors import check_choice
from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.dispatch import BACKENDS
from rfwp_rl.ops.dispatch import resolve as _resolve


def _register(*names: str) -> dict[str, OpSpec]:
    return {name: importlib.import_module(f"rfwp_rl.ops.{name}").OP for name in names}


OPS: dict[str, OpSpec] = _register(
    "lt", "delta", "delta_rnn", "rdn", "gated_delta", "delta_product", "srwm", "fwm", "lstm", "mamba"
)
"""Every op by name; adding an op adds its folder's name here."""

__all__ = ["BACKENDS", "Dims", "OPS", "OpSpec", "get", "naive", "resolve", "spec"]


def spec(name: str) -> OpSpec:
    """The :class:`OpSpec` of op ``name`` (a one-line error for an unknown name)."""
    return OPS[check_choice("op", name, OPS)]


def naive(name: str) -> Callable[..., tuple]:
    """The plain PyTorch reference of op ``name``."""
    return spec(name).naive


def resolve(name: str, backend: str = "auto", dims: Dims | None = None, **options: Any) -> Callable[..., tuple]:
    """Op ``name`` for ``backend``, chosen once (see :func:`rfwp_rl.ops.dispatch.resolve`).

    ``dims`` (:class:`Dims`): the key and value sizes of every call, when known.
    ``options``: keyword options of the reference bound now (rdn's ``feature_map``).
    """
    return _resolve(spec(name), backend, dims, **options)


def get(name: str, backend: str = "auto") -> Callable[..., tuple]:
    """Op ``name`` for ``backend``, the sizes taken from each call (see :func:`resolve`)."""
    return _resolve(spec(name), backend)
