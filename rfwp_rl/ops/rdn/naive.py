"""Plain PyTorch reference of ``rdn``: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import delta_update, read, reset_steps, softmax, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def rdn(
    xq: Tensor,
    xk: Tensor,
    xv: Tensor,
    xb: Tensor,
    Rq: Tensor,
    Rk: Tensor,
    Rv: Tensor,
    rb: Tensor,
    W0: Tensor,
    y0: Tensor,
    reset: Tensor | None,
    *,
    feature_map: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Recurrent Delta Net (RFWP paper Eq. 15-18, then the delta rule Eq. 8, 10 and Eq. 7).

    With ``h = tanh(y_{t-1})`` per head:
    ``k = φ(xk + Rk h)``, ``q = φ(xq + Rq h)``, ``v = xv + Rv h``, ``β = σ(xb + rb·h)``;
    then ``W_t = W_{t-1} + β (v - W_{t-1} k) ⊗ k`` and ``y_t = W_t q``.
    φ is softmax over the head dimension (what the paper's Atari RDN used) unless
    ``feature_map`` is given.

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
    phi = softmax if feature_map is None else feature_map
    T = xq.shape[0]
    flags = reset_steps(reset, T)
    W, y = W0, y0
    ys = []
    for t in range(T):
        if flags[t]:
            W, y = zero_entries(W, reset[t]), zero_entries(y, reset[t])
        h = torch.tanh(y)
        k = phi(xk[t] + torch.einsum("hij,bhj->bhi", Rk, h))  # RFWP Eq. 15
        v = xv[t] + torch.einsum("hij,bhj->bhi", Rv, h)  # RFWP Eq. 16
        q = phi(xq[t] + torch.einsum("hij,bhj->bhi", Rq, h))  # RFWP Eq. 17
        beta = torch.sigmoid(xb[t] + (rb * h).sum(-1))  # RFWP Eq. 18
        W = delta_update(W, k, v, beta)  # RFWP Eq. 8, 10
        y = read(W, q)  # RFWP Eq. 7
        ys.append(y)
    return torch.stack(ys), W


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0)``: the recurrent slow weights
    drawn N(0, 1/d) as the cores initialise them; ``dk`` is ignored (the key size is d)."""
    s = d**-0.5
    return [
        rand.normal(T, B, H, d),
        rand.normal(T, B, H, d),
        rand.normal(T, B, H, d),
        rand.normal(T, B, H),
        rand.normal(H, d, d, scale=s),
        rand.normal(H, d, d, scale=s),
        rand.normal(H, d, d, scale=s),
        rand.normal(H, d, scale=s),
        rand.state(B, H, d, d),
        rand.normal(B, H, d),
    ]
