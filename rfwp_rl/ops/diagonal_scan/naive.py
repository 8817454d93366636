"""The plain loop of the diagonal linear recurrence (the reference of :mod:`.scan`)."""

from __future__ import annotations

import torch
from torch import Tensor

from rfwp_rl.ops.common import zero_entries


def diagonal_scan(a: Tensor, b: Tensor, h0: Tensor, reset: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``h_t = a_t ⊙ h_{t-1} + b_t`` one step at a time, ``h_{-1} = h0``; the state of entry
    ``b`` is zeroed before step ``t`` where ``reset[t, b]``.

    a: broadcastable to b; b ``[T, B, *S]``; h0 ``[B, *S]``; reset ``[T, B]`` bool or None.
    Returns h ``[T, B, *S]`` and the last state ``[B, *S]``.
    """
    a = a.expand_as(b)
    h, hs = h0, []
    for t in range(b.shape[0]):
        if reset is not None:
            h = zero_entries(h, reset[t])
        h = a[t] * h + b[t]
        hs.append(h)
    out = torch.stack(hs)
    return out, out[-1]
