"""The chunked parallel form of ``mlstm`` (xLSTM paper, Beck et al., NeurIPS 2024, App. A: the
parallel formulation of the mLSTM, applied inside chunks of the unroll; the stabilised state of
:mod:`rfwp_rl.ops.mlstm.naive` is carried between chunks). The same numbers as the step-by-step
recurrence up to rounding, in matrix products over whole chunks.

Within a chunk of L steps (t, j = 1..L, ``F_t = Σ_{u<=t} log f_u``, the entering state
``(C~_0, n~_0, m_0)``, the true state being ``exp(m_0) C~_0``)::

    log D_tj = F_t - F_j + i~_j     for j <= t with no reset in (j, t], else -inf
    a_t      = F_t + m_0            (no reset in 1..t)   or   F_t - F_{r-1}   (r: latest reset <= t)
    m_t      = max(a_t, max_j log D_tj)                      (the stabiliser of Eq. 15, unrolled)
    h~_t     = (Σ_j e^{log D_tj - m_t} (q_t·k_j) v_j + g_t C~_0 q_t)
               / max(|Σ_j e^{log D_tj - m_t} (q_t·k_j) + g_t n~_0·q_t|, e^{-m_t})
    g_t      = e^{a_t - m_t} with no reset in 1..t, else 0

and the state after the chunk is row L of the same weights applied to ``v_j k_jᵀ`` and ``k_j``.
A reset before step r zeroes C, n and m there: it cuts the decay matrix (no j < r reaches t >= r)
and restarts a_t from m = 0. Every exponent is <= 0 (m_t is the maximum of the row and of a_t),
so nothing overflows; the row maximum is the paper's row-wise stabilisation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _chunk(
    q: Tensor, k: Tensor, v: Tensor, i_pre: Tensor, log_f: Tensor, C0: Tensor, n0: Tensor, m0: Tensor, reset
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One chunk: the arguments of :func:`mlstm_chunked` for L steps, ``log_f`` = log σ(f~)."""
    L = q.shape[0]
    qh, kh, vh = (x.permute(1, 2, 0, 3) for x in (q, k, v))  # [B, H, L, d]
    ig, lf = i_pre.permute(1, 2, 0), log_f.permute(1, 2, 0)  # [B, H, L]
    Fc = lf.cumsum(-1)  # F_t
    log_d = Fc[..., :, None] - Fc[..., None, :] + ig[..., None, :]  # F_t - F_j + i~_j  [B, H, L, L]
    steps = torch.arange(L, device=q.device)
    keep = steps[:, None] >= steps[None, :]  # j <= t
    a = Fc + m0[..., None]  # the entering state's log weight, no reset
    if reset is None:
        fresh = None
    else:
        seg = reset.long().cumsum(0).t()  # [B, L]: resets up to t
        keep = keep & (seg[:, :, None] == seg[:, None, :])  # [B, L, L]: no reset in (j, t]
        keep = keep[:, None]
        fresh = (seg == 0)[:, None]  # [B, 1, L]: the entering state still counts at t
        latest = torch.where(reset, steps[:, None], torch.full_like(steps[:, None], -1)).cummax(0).values.t()
        before = (Fc - lf).gather(-1, latest.clamp(min=0)[:, None].expand_as(Fc))  # F_{r-1}
        a = torch.where(fresh, a, Fc - before)  # after a reset, m restarts from 0
    neg_inf = torch.full((), float("-inf"), dtype=q.dtype, device=q.device)
    log_d = torch.where(keep, log_d, neg_inf)
    m = torch.maximum(log_d.amax(-1), a)  # [B, H, L]
    weights = torch.exp(log_d - m[..., None])  # <= 1; 0 where cut
    # the entering state's weight; -inf (not a masked exp) where cut, so no inf * 0 in the backward
    g = torch.exp(a - m if fresh is None else torch.where(fresh, a - m, neg_inf))
    scores = (qh @ kh.transpose(-1, -2)) * weights  # (q_t·k_j) e^{log D_tj - m_t}
    num = scores @ vh + g[..., None] * (qh @ C0.transpose(-1, -2))
    den = scores.sum(-1) + g * (qh @ n0[..., None]).squeeze(-1)
    h = num / torch.maximum(den.abs(), torch.exp(-m))[..., None]
    w_last, g_last = weights[..., -1, :], g[..., -1]  # the state after step L
    C = (vh * w_last[..., None]).transpose(-1, -2) @ kh + g_last[..., None, None] * C0
    n = (kh * w_last[..., None]).sum(-2) + g_last[..., None] * n0
    return h.permute(2, 0, 1, 3), C, n, m[..., -1]


def mlstm_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i_pre: Tensor,
    f_pre: Tensor,
    C0: Tensor,
    n0: Tensor,
    m0: Tensor,
    reset: Tensor | None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The stabilised mLSTM over chunks of ``chunk_size`` steps (the last one may be shorter):
    the parallel form inside each chunk, the state (C, n, m) carried between them.

    Args and returns: as :func:`rfwp_rl.ops.mlstm.naive.mlstm_naive`; ``chunk_size`` >= 1 (the
    work per chunk grows with its square, the number of sequential chunks falls with it).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size {chunk_size!r} is invalid; allowed: an integer >= 1")
    T = q.shape[0]
    log_f = F.logsigmoid(f_pre)  # xLSTM Eq. 26: f = σ(f~)
    C, n, m = C0, n0, m0
    hs = []
    for start in range(0, T, chunk_size):
        part = slice(start, min(start + chunk_size, T))
        h, C, n, m = _chunk(
            q[part], k[part], v[part], i_pre[part], log_f[part], C, n, m, None if reset is None else reset[part]
        )
        hs.append(h)
    return torch.cat(hs), C, n, m
