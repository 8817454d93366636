"""Pieces every plain PyTorch reference recurrence shares: reset handling, the fast-weight
read, the outer-product write, the delta rule, softmax.

Conventions (see also :mod:`rfwp_rl.ops`): a fast weight matrix maps keys to values,
``W [B, H, d_value, d_key]``, so a read is ``W @ q`` and a write is an outer product
``v ⊗ k`` (value rows, key columns). ``read`` and ``delta_update`` are public: other modules
build their own recurrences from them (e.g. the Delta LSTM of :mod:`rfwp_rl.cores.lm_cores`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["reset_steps", "zero_entries", "read", "outer", "delta_update", "softmax", "unit_vectors"]

UNIT_EPS = 1e-6
"""Added to the squared length in :func:`unit_vectors` (a zero vector stays finite)."""


def reset_steps(reset: Tensor | None, T: int) -> list[bool]:
    """Per step t: does any batch entry reset before step t? (one host sync for the whole
    sequence). ``reset``: ``[T, B]`` bool or None."""
    if reset is None:
        return [False] * T
    return reset.any(dim=1).tolist()


def zero_entries(x: Tensor, mask: Tensor, dim: int = 0) -> Tensor:
    """``x`` with the batch entries where ``mask`` (``[B]`` bool) is True set to zero.

    ``dim`` is the batch dimension of ``x``. ``torch.where`` (not a multiplication) so that
    no gradient, and no NaN/inf, crosses the reset.
    """
    shape = [1] * x.dim()
    shape[dim] = -1
    return torch.where(mask.view(shape), torch.zeros((), dtype=x.dtype, device=x.device), x)


def read(W: Tensor, q: Tensor) -> Tensor:
    """Read a fast weight matrix with a query: ``W q`` (RFWP paper Eq. 7; Secretly-FWP Eq. 25).

    W ``[B, H, dv, dk]``, q ``[B, H, dk]`` (already through its feature map) ->
    ``[B, H, dv]``, per batch entry and head.
    """
    return torch.matmul(W, q.unsqueeze(-1)).squeeze(-1)


def outer(v: Tensor, k: Tensor) -> Tensor:
    """``v ⊗ k``: v ``[B, H, dv]``, k ``[B, H, dk]`` -> ``[B, H, dv, dk]``."""
    return v.unsqueeze(-1) * k.unsqueeze(-2)


def delta_update(W: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """One delta-rule write (RFWP paper Eq. 8 and 10; Secretly-FWP Eq. 23-24).

    ``v̄ = W k``;  ``W' = W + β (v - v̄) ⊗ k``.

    W ``[B, H, dv, dk]``, k ``[B, H, dk]`` (already through its feature map), v ``[B, H, dv]``,
    beta ``[B, H]`` (already through the sigmoid, RFWP Eq. 9) -> the new W ``[B, H, dv, dk]``
    (a new tensor; W is not modified).
    """
    v_bar = read(W, k)  # RFWP Eq. 10: v̄ = W_{t-1} k
    return W + beta[..., None, None] * outer(v - v_bar, k)  # RFWP Eq. 8


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dimension. ``[..., d] -> [..., d]``."""
    return torch.softmax(x, dim=-1)


def unit_vectors(x: Tensor) -> Tensor:
    """L2 normalisation over the last dimension, ``x / sqrt(|x|² + 1e-6)``: the queries and
    keys of Gated DeltaNet and DeltaProduct (Gated DeltaNet paper §3.4), which keeps every
    Householder factor ``I - β k kᵀ`` of the delta rule's state transition at eigenvalues
    ``1 - β |k|²`` in (-1, 1] for β in (0, 2). ``[..., d] -> [..., d]``."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + UNIT_EPS)
