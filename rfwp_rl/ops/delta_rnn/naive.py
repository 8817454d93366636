"""Plain PyTorch reference of ``delta_rnn``: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import delta_update, read, reset_steps, softmax, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def delta_rnn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    kr: Tensor,
    vr: Tensor,
    beta_r: Tensor,
    W0: Tensor,
    R0: Tensor,
    y0: Tensor,
    reset: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
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
    flags = reset_steps(reset, T)
    W, R, y = W0, R0, y0
    ys = []
    for t in range(T):
        if flags[t]:
            W, R, y = (zero_entries(s, reset[t]) for s in (W, R, y))
        W = delta_update(W, k[t], v[t], beta[t])  # RFWP Eq. 8 for W
        R = delta_update(R, kr[t], vr[t], beta_r[t])  # RFWP Eq. 8 for R
        y = read(W, q[t]) + read(R, softmax(y))  # RFWP Eq. 12
        ys.append(y)
    return torch.stack(ys), W, R


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(q, k, v, beta, kr, vr, beta_r, W0, R0, y0)`` (see
    :func:`rfwp_rl.ops.lt.naive.example_inputs`)."""
    return [
        rand.fm(T, B, H, dk),
        rand.fm(T, B, H, dk),
        rand.normal(T, B, H, d),
        rand.sig(T, B, H),
        rand.fm(T, B, H, d),
        rand.normal(T, B, H, d),
        rand.sig(T, B, H),
        rand.state(B, H, d, dk),
        rand.state(B, H, d, d),
        rand.normal(B, H, d),
    ]
