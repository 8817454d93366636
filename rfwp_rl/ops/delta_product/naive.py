"""Plain PyTorch reference of ``delta_product``: one input step per loop iteration, its n_h
Householder steps in an inner loop; autograd does the backward pass, inputs are never
modified in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import delta_update, read, reset_steps, unit_vectors, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand

EXAMPLE_HOUSEHOLDER = 2
"""n_h of :func:`example_inputs` (more than one, so that the op tests exercise the product)."""


def delta_product(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, S0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    """DeltaProduct (Siems et al., NeurIPS 2025, Sec. 3): n_h delta-rule steps per input, each
    with its own key, value and β, i.e. the state transition is a product of n_h generalised
    Householder matrices ``I - β_j k_j k_jᵀ``; the output reads the state after the last one.

    ``S ← S (I - β_j k_j k_jᵀ) + β_j v_j k_jᵀ`` for j = 1..n_h;  ``o_t = S_t q_t``.
    n_h = 1 is DeltaNet; β in (0, 2) allows negative eigenvalues (unit keys).

    Args:
        q: ``[T, B, H, dk]`` queries.
        k: ``[T, B, H, n_h, dk]`` keys (L2-normalised by the core); v ``[T, B, H, n_h, dv]``.
        beta: ``[T, B, H, n_h]`` write strengths.
        S0: ``[B, H, dv, dk]`` state before step 0.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's S before step t.
    Returns:
        o ``[T, B, H, dv]`` and ``S_T [B, H, dv, dk]``.
    """
    T, n_h = q.shape[0], k.shape[3]
    flags = reset_steps(reset, T)
    S = S0
    ys = []
    for t in range(T):
        if flags[t]:
            S = zero_entries(S, reset[t])
        for j in range(n_h):  # DeltaProduct Sec. 3: n_h gradient steps on one input
            S = delta_update(S, k[t, :, :, j], v[t, :, :, j], beta[t, :, :, j])
        ys.append(read(S, q[t]))
    return torch.stack(ys), S


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(q, k, v, beta, S0)`` with n_h = :data:`EXAMPLE_HOUSEHOLDER`: unit-length
    queries ``[T, B, H, dk]`` and keys ``[T, B, H, n_h, dk]``, values ``[T, B, H, n_h, d]``,
    β ``[T, B, H, n_h]`` in (0, 2) (negative eigenvalues allowed), a non-zero S0."""
    n = EXAMPLE_HOUSEHOLDER
    return [
        unit_vectors(rand.normal(T, B, H, dk)),
        unit_vectors(rand.normal(T, B, H, n, dk)),
        rand.normal(T, B, H, n, d),
        2.0 * rand.sig(T, B, H, n),
        rand.state(B, H, d, dk),
    ]
