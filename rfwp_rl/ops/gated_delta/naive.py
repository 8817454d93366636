"""Plain PyTorch reference of ``gated_delta``: one step of the recurrence per loop iteration,
autograd does the backward pass, inputs are never modified in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import delta_update, read, reset_steps, unit_vectors, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def gated_delta(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, S0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Gated delta rule (Gated DeltaNet paper, Yang, Kautz, Hatamizadeh, ICLR 2025, Eq. 10).

    ``S_t = S_{t-1} α_t (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ``;  ``o_t = S_t q_t``; computed as a
    decay ``S' = α_t S_{t-1}`` followed by the delta rule on S' (the same matrix).

    Args:
        q, k: ``[T, B, H, dk]`` queries and keys (L2-normalised by the core).
        v: ``[T, B, H, dv]`` values.
        alpha: ``[T, B, H]`` decays in [0, 1] (α = 1: DeltaNet; α = 0 forgets all before t).
        beta: ``[T, B, H]`` write strengths.
        S0: ``[B, H, dv, dk]`` state before step 0.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's S before step t.
    Returns:
        o ``[T, B, H, dv]`` and ``S_T [B, H, dv, dk]``.
    """
    T = q.shape[0]
    flags = reset_steps(reset, T)
    S = S0
    ys = []
    for t in range(T):
        if flags[t]:
            S = zero_entries(S, reset[t])
        S = alpha[t][..., None, None] * S  # Gated DeltaNet Eq. 10: the decay α_t
        S = delta_update(S, k[t], v[t], beta[t])  # ... then (I - β k kᵀ) and + β v kᵀ
        ys.append(read(S, q[t]))  # o_t = S_t q_t
    return torch.stack(ys), S


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(q, k, v, alpha, beta, S0)``: unit-length queries and keys ``[T, B, H, dk]``
    (as the cores hand them), values ``[T, B, H, d]``, α and β ``[T, B, H]`` in (0, 1), a
    non-zero ``S0 [B, H, d, dk]``."""
    return [
        unit_vectors(rand.normal(T, B, H, dk)),
        unit_vectors(rand.normal(T, B, H, dk)),
        rand.normal(T, B, H, d),
        rand.sig(T, B, H),
        rand.sig(T, B, H),
        rand.state(B, H, d, dk),
    ]
