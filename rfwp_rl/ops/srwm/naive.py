"""Plain PyTorch reference of ``srwm``: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import outer, read, reset_steps, softmax, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand

RATES = 4
"""Learning rates σ(β_t) of one SRWM: one for each block of rows it generates (y, q, k, β)."""


def rows(d: int) -> int:
    """Rows of an SRWM with outputs, queries and keys of size d: ``[y, q, k, β]`` = 3d + 4."""
    return 3 * d + RATES


def head_size(R: int) -> int:
    """d of an SRWM with R rows (the inverse of :func:`rows`)."""
    return (R - RATES) // 3


def srwm(
    x: Tensor,
    W_init: Tensor,
    dW0: Tensor,
    reset: Tensor | None,
    *,
    feature_map: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Modern self-referential weight matrix (Irie, Schlag, Csordás, Schmidhuber, ICML 2022,
    Eq. 5-8), one matrix per head that generates its own output, query, key and learning
    rates and updates itself with the delta rule:

    ``[y_t, q_t, k_t, β_t] = W_{t-1} φ(x_t)``;  ``v_t = W_{t-1} φ(q_t)``;
    ``v̄_t = W_{t-1} φ(k_t)``;  ``W_t = W_{t-1} + σ(β_t) (v_t - v̄_t) ⊗ φ(k_t)``,

    where β_t has one entry per block of rows (y, q, k, β), each block written with its own
    rate. ``W_t = W_init + ΔW_t``: the state is the change ΔW from the slow initial weights,
    so that the zero state (and a reset) means ``W = W_init``.

    Args:
        x: ``[T, B, H, D]`` inputs already through φ.
        W_init: ``[H, 3d + 4, D]`` the slow initial weights W_0 of every head.
        dW0: ``[B, H, 3d + 4, D]`` ΔW before step 0.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's ΔW before step t.
        feature_map: φ applied to q and k (last dimension, d -> D); default softmax (the
            paper's).
    Returns:
        y ``[T, B, H, d]`` (read with W_{t-1}) and ``ΔW_T [B, H, 3d + 4, D]``.
    """
    phi = softmax if feature_map is None else feature_map
    T = x.shape[0]
    d = head_size(W_init.shape[-2])
    sizes = [d, d, d, RATES]
    flags = reset_steps(reset, T)
    dW = dW0
    ys = []
    for t in range(T):
        if flags[t]:
            dW = zero_entries(dW, reset[t])
        W = W_init + dW
        y, q, k, b = read(W, x[t]).split(sizes, dim=-1)  # SRWM Eq. 5
        q, k = phi(q), phi(k)
        v, v_bar = read(W, q), read(W, k)  # SRWM Eq. 6, 7
        rate = torch.sigmoid(b).repeat_interleave(torch.tensor(sizes, device=b.device), dim=-1)
        dW = dW + outer(rate * (v - v_bar), k)  # SRWM Eq. 8
        ys.append(y)
    return torch.stack(ys), dW


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(x, W_init, dW0)``: inputs positive and summing to one (as after softmax)
    ``[T, B, H, d]``, slow initial weights N(0, 1/d) as the cores draw them, a non-zero ΔW;
    ``dk`` is ignored (the key size is d)."""
    R = rows(d)
    return [rand.fm(T, B, H, d), rand.normal(H, R, d, scale=d**-0.5), rand.state(B, H, R, d)]
