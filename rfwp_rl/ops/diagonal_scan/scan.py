"""The diagonal linear recurrence as a parallel prefix scan over time.

Each step is the affine map ``h -> a_t ⊙ h + b_t``; composing two of them gives another,
``(a_t, b_t) ∘ (a_s, b_s) = (a_t a_s, a_t b_s + b_t)``, an associative operation, so the
states of all steps come from a log-depth (Hillis-Steele) scan: ``ceil(log2 T)`` rounds of
elementwise products over the whole unroll (Blelloch 1990; the parallel form of LRU,
Orvieto et al. 2023, Sec. 3.1, and S5, Smith et al. 2023, Sec. 2.2). A reset before step t
makes ``a_t = 0`` (nothing of the past crosses it). Only products of decays appear, never
their inverses, so decays near zero stay exact.
"""

from __future__ import annotations

import torch
from torch import Tensor


def diagonal_scan(a: Tensor, b: Tensor, h0: Tensor, reset: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``h_t = a_t ⊙ h_{t-1} + b_t`` for every t at once, ``h_{-1} = h0``; the state of entry
    ``b`` is zeroed before step ``t`` where ``reset[t, b]``.

    a: broadcastable to b (real or complex, as b); b ``[T, B, *S]``; h0 ``[B, *S]``;
    reset ``[T, B]`` bool or None. Returns h ``[T, B, *S]`` and the last state ``[B, *S]``.
    """
    T = b.shape[0]
    a = a.expand_as(b)
    if reset is not None:
        keep = reset.logical_not().view(*reset.shape, *([1] * (b.dim() - 2)))
        a = torch.where(keep, a, torch.zeros((), dtype=a.dtype, device=a.device))
    # after the round with stride k, (a[t], b[t]) maps h_{t-2k} to h_t (h0 where t < 2k)
    k = 1
    while k < T:
        b = torch.cat([b[:k], a[k:] * b[:-k] + b[k:]])
        a = torch.cat([a[:k], a[k:] * a[:-k]])
        k *= 2
    h = b + a * h0.unsqueeze(0)
    return h, h[-1]
