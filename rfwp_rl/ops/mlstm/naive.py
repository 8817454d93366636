"""Plain PyTorch reference of ``mlstm``: the recurrence of the xLSTM paper (Beck et al., NeurIPS
2024) one step per loop iteration, autograd does the backward pass, inputs are never modified in
place.

The equations (xLSTM paper Sec. 2.3, Eq. 19-27; stabiliser Sec. 2.2, Eq. 15-17), per head::

    C_t = f_t C_{t-1} + i_t v_t k_tᵀ          n_t = f_t n_{t-1} + i_t k_t
    h~_t = C_t q_t / max(|n_tᵀ q_t|, 1)        i_t = exp(i~_t),  f_t = σ(f~_t)

computed in the stabilised form: the state holds ``C~ = exp(-m) C``, ``n~ = exp(-m) n`` and the
stabiliser ``m``; ``m_t = max(log f_t + m_{t-1}, i~_t)``, the gates become
``i'_t = exp(i~_t - m_t)`` and ``f'_t = exp(log f_t + m_{t-1} - m_t)`` (both <= 1, no overflow),
and the normaliser ``max(|n~_tᵀ q_t|, exp(-m_t))`` (the bound 1 scaled by exp(-m_t)). h~ is the
same as in the unstabilised form for any m_0, since C~ and n~ scale together.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rfwp_rl.ops.common import outer, read, reset_steps, zero_entries


def mlstm_step(
    q: Tensor, k: Tensor, v: Tensor, i_pre: Tensor, f_pre: Tensor, C: Tensor, n: Tensor, m: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One stabilised mLSTM step (xLSTM paper Eq. 19-21, 25-26 with Eq. 15-17).

    Args:
        q, k: ``[B, H, dk]`` query and key (the core scales k by 1/sqrt(dk), Eq. 23).
        v: ``[B, H, dv]`` value.
        i_pre, f_pre: ``[B, H]`` input and forget gate pre-activations i~_t, f~_t.
        C, n, m: the stabilised state before the step, ``[B, H, dv, dk]``, ``[B, H, dk]``, ``[B, H]``.
    Returns:
        h~ ``[B, H, dv]`` and the state after the step (new tensors).
    """
    log_f = F.logsigmoid(f_pre)  # Eq. 26: f_t = σ(f~_t), log f_t without underflow
    m_new = torch.maximum(log_f + m, i_pre)  # Eq. 15, with log i_t = i~_t (Eq. 25)
    i_gate = torch.exp(i_pre - m_new)  # Eq. 16: i'_t
    f_gate = torch.exp(log_f + m - m_new)  # Eq. 17: f'_t
    C = f_gate[..., None, None] * C + i_gate[..., None, None] * outer(v, k)  # Eq. 19
    n = f_gate[..., None] * n + i_gate[..., None] * k  # Eq. 20
    # Eq. 21 in stabilised form: max(|n~ᵀq|, exp(-m_t)) = exp(-m_t) max(|nᵀq|, 1)
    den = torch.maximum((n * q).sum(-1).abs(), torch.exp(-m_new))
    return read(C, q) / den[..., None], C, n, m_new


def mlstm_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i_pre: Tensor,
    f_pre: Tensor,
    C0: Tensor,
    n0: Tensor,
    m0: Tensor,
    reset: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The stabilised mLSTM recurrence step by step (xLSTM paper Eq. 19-27 with Eq. 15-17).

    Args:
        q, k: ``[T, B, H, dk]``; v: ``[T, B, H, dv]``; i_pre, f_pre: ``[T, B, H]`` gate
        pre-activations; C0 ``[B, H, dv, dk]``, n0 ``[B, H, dk]``, m0 ``[B, H]``: the stabilised
        state before step 0; reset: ``[T, B]`` bool or None, ``reset[t, b]`` zeroes entry b's
        C, n and m before step t.
    Returns:
        h~ ``[T, B, H, dv]`` and the state after the last step (C, n, m).
    """
    T = q.shape[0]
    flags = reset_steps(reset, T)
    C, n, m = C0, n0, m0
    hs = []
    for t in range(T):
        if flags[t]:
            C, n, m = (zero_entries(s, reset[t]) for s in (C, n, m))
        h, C, n, m = mlstm_step(q[t], k[t], v[t], i_pre[t], f_pre[t], C, n, m)
        hs.append(h)
    return torch.stack(hs), C, n, m
