"""Plain PyTorch reference of ``fwm``: the dense fast tensor, one step of the recurrence per
loop iteration, the FWM paper's equations as written; autograd does the backward pass, inputs
are never modified in place.

F is ``[B, H, m, m, m]`` indexed (first key, second key, value); viewed as a matrix
``[m*m, m]`` (rows vec(k1 ⊗ k2), columns values) a write is a rank-one update and a lookup a
vector-matrix product.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from rfwp_rl.ops.common import reset_steps, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand

LN_EPS = 1e-5
"""ε of the layer norm of Eq. 7 (``torch.nn.functional.layer_norm``'s default)."""


def write(Fm: Tensor, k1: Tensor, k2: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """One write (FWM paper Eq. 3-4). Fm ``[N, m, m, m]``, k1/k2/v ``[N, m]``, beta ``[N]``
    -> the new ``[N, m, m, m]`` (N: batch x heads)."""
    N, m = v.shape
    key = (k1[:, :, None] * k2[:, None, :]).reshape(N, 1, m * m)  # vec(k1 ⊗ k2)
    Fmat = Fm.reshape(N, m * m, m)
    v_old = torch.bmm(key, Fmat)  # §3.1.1: F_{t-1} vec(k1 ⊗ k2)
    dv = beta[:, None, None] * (v[:, None, :] - v_old)  # β (v - v_old)
    Fp = torch.baddbmm(Fmat, key.transpose(1, 2), dv)  # Eq. 3
    scale = torch.linalg.vector_norm(Fp, dim=(1, 2)).clamp(min=1.0)  # max(1, ||F'||)
    return (Fp / scale[:, None, None]).view(N, m, m, m)  # Eq. 4


def read(Fm: Tensor, n: Tensor, e: Tensor) -> Tensor:
    """The chained reads (FWM paper Eq. 7). Fm ``[N, m, m, m]``, n ``[N, m]`` (n^(0), Eq. 5),
    e ``[N, N_r, m]`` (e^(1..N_r), Eq. 6) -> n^(N_r) ``[N, m]``.

    ``n_i = LN(F vec(n_{i-1} ⊗ e_i))`` with a layer norm without affine parameters.
    """
    N, m = n.shape
    Fmat = Fm.reshape(N, m * m, m)
    for i in range(e.shape[1]):
        query = (n[:, :, None] * e[:, None, i, :]).reshape(N, 1, m * m)  # vec(n_{i-1} ⊗ e_i)
        n = F.layer_norm(torch.bmm(query, Fmat).squeeze(1), (m,), eps=LN_EPS)  # Eq. 7
    return n


def activate(w: Tensor, r: Tensor, m: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The keys, value and strengths from the slow projections ``w [..., 3m + 1]``,
    ``r [..., (1 + N_r) m]``: ``(k1, k2, v [..., m], β [...], n0 [..., m], e [..., N_r, m])``."""
    k1, k2, v = torch.tanh(w[..., : 3 * m]).split(m, dim=-1)  # FWM Eq. 1 (φ = tanh)
    beta = torch.sigmoid(w[..., 3 * m])  # FWM Eq. 2
    keys = torch.tanh(r).unflatten(-1, (-1, m))  # FWM Eq. 5-6
    return k1, k2, v, beta, keys[..., 0, :], keys[..., 1:, :]


def fwm(w: Tensor, r: Tensor, F0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fast Weight Memory (Schlag, Munkhdalai, Schmidhuber, ICLR 2021, Eq. 1-7) on the slow
    projections of the controller's output: per step the write, then the N_r chained reads of
    the updated tensor (Eq. 7 reads F_t)::

        [k1, k2, v] = tanh(w[:3m]);  β = σ(w[3m]);  n_0 = tanh(r[:m]);  e_i = tanh(r[im:(i+1)m])
        v_old = F_{t-1} vec(k1 ⊗ k2);  F'_t = F_{t-1} + β vec(k1 ⊗ k2) ⊗ (v - v_old)
        F_t = F'_t / max(1, ||F'_t||);  n_i = LN(F_t vec(n_{i-1} ⊗ e_i)),  y_t = n_{N_r}

    Args:
        w: ``[T, B, H, 3m + 1]`` W_write h and W_β h (Eq. 1-2 before φ and σ).
        r: ``[T, B, H, (1 + N_r) m]`` W_n h and W_e^(1..N_r) h (Eq. 5-6 before φ).
        F0: ``[B, H, m, m, m]`` the tensor before step 0.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's F before step t.
    Returns:
        y ``[T, B, H, m]`` (n^(N_r) of every step) and ``F_T [B, H, m, m, m]``.
    """
    T, B, H = w.shape[:3]
    m = F0.shape[-1]
    N = B * H
    k1, k2, v, beta, n0, e = (x.reshape(T, N, *x.shape[3:]) for x in activate(w, r, m))
    flags = reset_steps(reset, T)
    Fm = F0.reshape(N, m, m, m)
    ys = []
    for t in range(T):
        if flags[t]:
            Fm = zero_entries(Fm, reset[t].repeat_interleave(H))
        Fm = write(Fm, k1[t], k2[t], v[t], beta[t])  # FWM Eq. 3-4
        ys.append(read(Fm, n0[t], e[t]).view(B, H, m))  # FWM Eq. 7
    return torch.stack(ys), Fm.view(B, H, m, m, m)


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(w, r, F0)`` with memory size m = d and N_r = 3 reads: slow projections
    N(0, 1) (their tanh spans (-1, 1)), a non-zero F0 of norm about ``rand.state_scale`` (the
    core's states have norm <= 1); ``dk`` is ignored (every size is m)."""
    return [rand.normal(T, B, H, 3 * d + 1), rand.normal(T, B, H, 4 * d), rand.state(B, H, d, d, d) / d**1.5]
