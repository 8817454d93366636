"""Plain PyTorch reference of the fast-weight recurrences (one Python loop over time).

These are the numbers every fused kernel (``csrc/``) and every core is checked against, so
they are written to be read, not to be fast: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place.

Conventions shared by all ops (see also :mod:`rfwp_rl.ops`):

- time-major, heads split: ``T`` steps, ``B`` batch, ``H`` heads, ``d`` head size;
- a fast weight matrix maps keys to values: ``W [B, H, d_value, d_key]`` so that the read
  out is ``W @ q`` and a write is an outer product ``v ⊗ k`` (value rows, key columns);
- keys and queries arrive already passed through their feature map φ (the caller's job),
  except where an op says otherwise (the recurrent query of ``delta_rnn``; ``rdn``);
- ``reset [T, B]`` bool (or None for no resets): ``reset[t, b]`` sets entry ``b``'s state
  (fast weights, and for the recurrent ops the carried output ``y``) to zero *before* step
  ``t``. No gradient flows through a reset to earlier steps.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["lt", "delta", "delta_rnn", "rdn", "read", "delta_update"]


# ---------------------------------------------------------------------------------------
# Small helpers (``read`` and ``delta_update`` are public: other modules build their own
# recurrences from them, e.g. the Delta LSTM of rfwp_rl.cores.lm_cores)
# ---------------------------------------------------------------------------------------

def _reset_flags(reset: Tensor | None, T: int) -> list[bool]:
    """Per step: does any batch entry reset there? (one host sync for the whole sequence)."""
    if reset is None:
        return [False] * T
    return reset.any(dim=1).tolist()


def _zero_where(x: Tensor, reset_t: Tensor) -> Tensor:
    """``x`` with the entries ``b`` where ``reset_t[b]`` is True replaced by zeros.

    x: ``[B, ...]``, reset_t: ``[B]`` bool. ``torch.where`` (not a multiplication) so that
    no gradient, and no NaN/inf, crosses the reset.
    """
    mask = reset_t.view(-1, *([1] * (x.dim() - 1)))
    return torch.where(mask, torch.zeros((), dtype=x.dtype, device=x.device), x)


def read(W: Tensor, q: Tensor) -> Tensor:
    """Read a fast weight matrix with a query: ``W q`` (RFWP paper Eq. 7; Secretly-FWP Eq. 25).

    W ``[B, H, dv, dk]``, q ``[B, H, dk]`` (already through its feature map) ->
    ``[B, H, dv]``, per batch entry and head.
    """
    return torch.matmul(W, q.unsqueeze(-1)).squeeze(-1)


def _outer(v: Tensor, k: Tensor) -> Tensor:
    """``v ⊗ k``: v ``[B,H,dv]``, k ``[B,H,dk]`` -> ``[B,H,dv,dk]``."""
    return v.unsqueeze(-1) * k.unsqueeze(-2)


def delta_update(W: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """One delta-rule write (RFWP paper Eq. 8 and 10; Secretly-FWP Eq. 23-24).

    ``v̄ = W k``;  ``W' = W + β (v - v̄) ⊗ k``.

    W ``[B, H, dv, dk]``, k ``[B, H, dk]`` (already through its feature map), v ``[B, H, dv]``,
    beta ``[B, H]`` (already through the sigmoid, RFWP Eq. 9) -> the new W ``[B, H, dv, dk]``
    (a new tensor; W is not modified).
    """
    v_bar = read(W, k)                                          # RFWP Eq. 10: v̄ = W_{t-1} k
    return W + beta[..., None, None] * _outer(v - v_bar, k)     # RFWP Eq. 8


def _softmax(x: Tensor) -> Tensor:
    return torch.softmax(x, dim=-1)


# ---------------------------------------------------------------------------------------
# The four ops
# ---------------------------------------------------------------------------------------

def lt(q: Tensor, k: Tensor, v: Tensor, W0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Linear Transformer / purely additive fast weights (RFWP paper Eq. 6-7).

    ``W_t = W_{t-1} + v_t ⊗ k_t``;  ``y_t = W_t q_t``.

    Args:
        q, k: ``[T, B, H, dk]`` feature-mapped queries and keys.
        v: ``[T, B, H, dv]`` values.
        W0: ``[B, H, dv, dk]`` fast weights before step 0.
        reset: ``[T, B]`` bool or None.
    Returns:
        y ``[T, B, H, dv]`` and the final fast weights ``W_T [B, H, dv, dk]``.
    """
    T = q.shape[0]
    flags = _reset_flags(reset, T)
    W = W0
    ys = []
    for t in range(T):
        if flags[t]:
            W = _zero_where(W, reset[t])
        W = W + _outer(v[t], k[t])        # RFWP Eq. 6
        ys.append(read(W, q[t]))          # RFWP Eq. 7
    return torch.stack(ys), W


def delta(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor,
          reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Delta Net: fast weights written by the delta rule (RFWP paper Eq. 8-10).

    ``v̄_t = W_{t-1} k_t``;  ``W_t = W_{t-1} + β_t (v_t - v̄_t) ⊗ k_t``;  ``y_t = W_t q_t``.

    Args:
        q, k: ``[T, B, H, dk]`` feature-mapped queries and keys.
        v: ``[T, B, H, dv]`` values.
        beta: ``[T, B, H]`` write strengths (already through the sigmoid, RFWP Eq. 9).
        W0: ``[B, H, dv, dk]``.
        reset: ``[T, B]`` bool or None.
    Returns:
        y ``[T, B, H, dv]`` and ``W_T [B, H, dv, dk]``.
    """
    T = q.shape[0]
    flags = _reset_flags(reset, T)
    W = W0
    ys = []
    for t in range(T):
        if flags[t]:
            W = _zero_where(W, reset[t])
        W = delta_update(W, k[t], v[t], beta[t])    # RFWP Eq. 8, 10
        ys.append(read(W, q[t]))                    # RFWP Eq. 7
    return torch.stack(ys), W


def delta_rnn(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, kr: Tensor, vr: Tensor,
              beta_r: Tensor, W0: Tensor, R0: Tensor, y0: Tensor,
              reset: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Delta RNN, version B (RFWP paper Eq. 12 with f = softmax; App. A.2).

    Two fast weight matrices, both written by the delta rule (RFWP Eq. 8, 10):
    the feedforward ``W`` from ``(k, v, β)`` and the recurrent ``R`` from ``(kr, vr, β_r)``.
    The output is ``y_t = W_t q_t + R_t softmax(y_{t-1})``; the recurrent query
    ``softmax(y_{t-1})`` is computed here (softmax over the head dimension). After a reset
    ``y_{t-1}`` is zero, so the recurrent query is uniform (1/d).

    Args:
        q, k: ``[T, B, H, dk]`` feature-mapped; v ``[T, B, H, d]``; beta ``[T, B, H]``.
        kr: ``[T, B, H, d]`` feature-mapped recurrent keys; vr ``[T, B, H, d]``;
            beta_r ``[T, B, H]``.
        W0: ``[B, H, d, dk]``; R0: ``[B, H, d, d]``; y0: ``[B, H, d]`` (previous raw output).
        reset: ``[T, B]`` bool or None (zeroes W, R and y).
    Returns:
        y ``[T, B, H, d]``, ``W_T``, ``R_T``. The carried output state is ``y[-1]``.
    """
    T = q.shape[0]
    flags = _reset_flags(reset, T)
    W, R, y = W0, R0, y0
    ys = []
    for t in range(T):
        if flags[t]:
            W, R, y = (_zero_where(s, reset[t]) for s in (W, R, y))
        W = delta_update(W, k[t], v[t], beta[t])        # RFWP Eq. 8 for W
        R = delta_update(R, kr[t], vr[t], beta_r[t])    # RFWP Eq. 8 for R
        y = read(W, q[t]) + read(R, _softmax(y))        # RFWP Eq. 12
        ys.append(y)
    return torch.stack(ys), W, R


def rdn(xq: Tensor, xk: Tensor, xv: Tensor, xb: Tensor, Rq: Tensor, Rk: Tensor, Rv: Tensor,
        rb: Tensor, W0: Tensor, y0: Tensor, reset: Tensor | None, *,
        feature_map: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Recurrent Delta Net (RFWP paper Eq. 15-18, then the delta rule Eq. 8, 10 and Eq. 7).

    With ``h = tanh(y_{t-1})`` per head:
    ``k = φ(xk + Rk h)``, ``q = φ(xq + Rq h)``, ``v = xv + Rv h``, ``β = σ(xb + rb·h)``;
    then ``W_t = W_{t-1} + β (v - W_{t-1} k) ⊗ k`` and ``y_t = W_t q``.
    φ is softmax over the head dimension (what the paper's Atari RDN used) unless
    ``feature_map`` is given (reference only; the fused kernels implement softmax).

    Args:
        xq, xk, xv: ``[T, B, H, d]`` slow feedforward projections ``W_q x``, ``W_k x``, ``W_v x``.
        xb: ``[T, B, H]`` pre-sigmoid ``W_β x``.
        Rq, Rk, Rv: ``[H, d, d]`` recurrent slow weights (maps h -> pre-activation).
        rb: ``[H, d]`` recurrent slow weights of β.
        W0: ``[B, H, d, D]`` (D = d for softmax, or φ's output size); y0: ``[B, H, d]``.
        reset: ``[T, B]`` bool or None (zeroes W and y).
        feature_map: φ applied to the last dimension; default softmax.
    Returns:
        y ``[T, B, H, d]`` (raw, before any tanh) and ``W_T``. The carried state is ``y[-1]``.
    """
    phi = _softmax if feature_map is None else feature_map
    T = xq.shape[0]
    flags = _reset_flags(reset, T)
    W, y = W0, y0
    ys = []
    for t in range(T):
        if flags[t]:
            W, y = _zero_where(W, reset[t]), _zero_where(y, reset[t])
        h = torch.tanh(y)
        k = phi(xk[t] + torch.einsum("hij,bhj->bhi", Rk, h))        # RFWP Eq. 15
        v = xv[t] + torch.einsum("hij,bhj->bhi", Rv, h)             # RFWP Eq. 16
        q = phi(xq[t] + torch.einsum("hij,bhj->bhi", Rq, h))        # RFWP Eq. 17
        beta = torch.sigmoid(xb[t] + (rb * h).sum(-1))              # RFWP Eq. 18
        W = delta_update(W, k, v, beta)                             # RFWP Eq. 8, 10
        y = read(W, q)                                              # RFWP Eq. 7
        ys.append(y)
    return torch.stack(ys), W
