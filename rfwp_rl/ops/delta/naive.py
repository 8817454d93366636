"""Plain PyTorch reference of ``delta``: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import delta_update, read, reset_steps, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def delta(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Delta Net: fast weights written by the delta rule (RFWP paper Eq. 8-10).

    ``v̄_t = W_{t-1} k_t``;  ``W_t = W_{t-1} + β_t (v_t - v̄_t) ⊗ k_t``;  ``y_t = W_t q_t``.

    Args:
        q, k: ``[T, B, H, dk]`` feature-mapped queries and keys.
        v: ``[T, B, H, dv]`` values.
        beta: ``[T, B, H]`` write strengths (already through the sigmoid, RFWP Eq. 9).
        W0: ``[B, H, dv, dk]``.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's W before step t.
    Returns:
        y ``[T, B, H, dv]`` and ``W_T [B, H, dv, dk]``.
    """
    T = q.shape[0]
    flags = reset_steps(reset, T)
    W = W0
    ys = []
    for t in range(T):
        if flags[t]:
            W = zero_entries(W, reset[t])
        W = delta_update(W, k[t], v[t], beta[t])  # RFWP Eq. 8, 10
        ys.append(read(W, q[t]))  # RFWP Eq. 7
    return torch.stack(ys), W


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(q, k, v, beta, W0)`` (see :func:`rfwp_rl.ops.lt.naive.example_inputs`;
    ``beta [T, B, H]`` in (0, 1))."""
    return [
        rand.fm(T, B, H, dk),
        rand.fm(T, B, H, dk),
        rand.normal(T, B, H, d),
        rand.sig(T, B, H),
        rand.state(B, H, d, dk),
    ]
