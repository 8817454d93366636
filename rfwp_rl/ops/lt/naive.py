"""Plain PyTorch reference of ``lt``: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import outer, read, reset_steps, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def lt(q: Tensor, k: Tensor, v: Tensor, W0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Linear Transformer / purely additive fast weights (RFWP paper Eq. 6-7).

    ``W_t = W_{t-1} + v_t ⊗ k_t``;  ``y_t = W_t q_t``.

    Args:
        q, k: ``[T, B, H, dk]`` feature-mapped queries and keys.
        v: ``[T, B, H, dv]`` values.
        W0: ``[B, H, dv, dk]`` fast weights before step 0.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's W before step t.
    Returns:
        y ``[T, B, H, dv]`` and the final fast weights ``W_T [B, H, dv, dk]``.
    """
    T = q.shape[0]
    flags = reset_steps(reset, T)
    W = W0
    ys = []
    for t in range(T):
        if flags[t]:
            W = zero_entries(W, reset[t])
        W = W + outer(v[t], k[t])  # RFWP Eq. 6
        ys.append(read(W, q[t]))  # RFWP Eq. 7
    return torch.stack(ys), W


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(q, k, v, W0)``: keys/queries ``[T, B, H, dk]`` positive and summing to one,
    values ``[T, B, H, d]``, a non-zero ``W0 [B, H, d, dk]``."""
    return [rand.fm(T, B, H, dk), rand.fm(T, B, H, dk), rand.normal(T, B, H, d), rand.state(B, H, d, dk)]
