"""The selective SSM over an unroll, optionally in chunks of steps each recomputed in the
backward pass (:func:`torch.utils.checkpoint.checkpoint`), so that the per-step states
``[T, B, D, N]`` are never all kept: only the state at each chunk boundary and the chunk's
inputs (``[T, B, D]`` and ``[T, B, N]``) are saved for the backward pass, the recomputation of
one chunk at a time holding its states. This is the recomputation of Mamba's hardware-aware
scan (Gu & Dao 2023, Sec. 3.3.2) done by autograd at chunk granularity instead of in a fused
kernel.

Inside a chunk Ā_t and B̄_t x_t of every step are formed at once, then the recurrence
``h_t = Ā_t ⊙ h_{t-1} + B̄_t x_t`` runs either as a loop over the chunk's steps
(``parallel=False``: O(L) work for L steps, one multiply-add per step and its adjoint written
out for the backward pass, :class:`_Recurrence`) or as the log-depth parallel scan
:func:`rfwp_rl.ops.diagonal_scan.diagonal_scan` (``parallel=True``: O(L log L) work in
log2(L) rounds of large operations), then ``y_t = C_t h_t`` for every step at once.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from rfwp_rl.ops.diagonal_scan import diagonal_scan


class _Recurrence(torch.autograd.Function):
    """``h_t = a_t ⊙ (k_t h_{t-1}) + b_t`` for t < T as a loop of one fused multiply-add per step
    (k_t = 0 where the entry resets before step t, else 1), with the adjoint recurrence written
    out for the backward pass instead of autograd's graph of every step (a few small operations
    each): with g_t the gradient reaching h_t from the loss and from h_{t+1},

        g_t = ∂L/∂h_t + k_{t+1} a_{t+1} ⊙ g_{t+1};   ∂L/∂b_t = g_t;
        ∂L/∂a_t = g_t ⊙ k_t h_{t-1};   ∂L/∂h0 = k_0 a_0 ⊙ g_0.

    a, b ``[T, B, ...]``, h0 ``[B, ...]``, keep ``[T, B, 1, ...]`` (k_t, broadcastable to a
    step's state) or None -> h ``[T, B, ...]``. Keeps a and h for the backward pass.
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, h0: Tensor, keep: Tensor | None) -> Tensor:
        h = torch.empty_like(b)
        prev = h0
        for t in range(b.shape[0]):
            prev = torch.addcmul(b[t], a[t], prev if keep is None else prev * keep[t], out=h[t])
        ctx.save_for_backward(a, h0, h, keep)
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        a, h0, h, keep = ctx.saved_tensors
        g = grad_h.contiguous().clone()
        for t in range(g.shape[0] - 1, 0, -1):
            g[t - 1].addcmul_(a[t], g[t] if keep is None else g[t] * keep[t])
        grad_a = torch.cat([h0.unsqueeze(0), h[:-1]])  # h_{t-1}, then in place k_t h_{t-1} ⊙ g_t
        if keep is not None:
            grad_a.mul_(keep)
        grad_h0 = a[0] * g[0] if keep is None else a[0] * keep[0] * g[0]
        return grad_a.mul_(g), g, grad_h0, None


def _loop(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    decay = torch.exp(delta[..., None] * A)  # Eq. 4 (zero-order hold): Ā_t = exp(Δ_t A), every step at once
    inp = (delta * u)[..., None] * B[:, :, None, :]  # B̄_t x_t with B̄_t = Δ_t B_t
    keep = None if reset is None else reset.logical_not().to(u.dtype)[:, :, None, None]
    h = _Recurrence.apply(decay, inp, h0, keep)  # Eq. 2a
    # the last state as its own tensor: a view would keep every step's state alive with it
    return torch.einsum("tbdn,tbn->tbd", h, C), h[-1].clone()  # Eq. 2b: y_t = C_t h_t


def _parallel(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    decay = torch.exp(delta[..., None] * A)  # Eq. 4 (zero-order hold), every step at once
    inp = (delta * u)[..., None] * B[:, :, None, :]  # B̄_t x_t with B̄_t = Δ_t B_t
    h, last = diagonal_scan(decay, inp, h0, reset)  # Eq. 2a
    return torch.einsum("tbdn,tbn->tbd", h, C), last.clone()  # Eq. 2b; the last state as for the loop


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    h0: Tensor,
    reset: Tensor | None = None,
    chunk_size: int = 0,
    parallel: bool = False,
) -> tuple[Tensor, Tensor]:
    """The selective SSM of Mamba (Gu & Dao 2023, Eq. 2a-2b, Eq. 4 for Ā, B̄ = ΔB; the same
    numbers as :func:`rfwp_rl.ops.mamba.naive.selective_scan`).

    Args:
        u: ``[T, B, D]`` the SSM's input; delta: ``[T, B, D]`` step sizes Δ (> 0);
        A: ``[D, N]``; B, C: ``[T, B, N]``; h0: ``[B, D, N]``;
        reset: ``[T, B]`` bool or None (True zeroes entry b's state before step t);
        chunk_size: steps per chunk recomputed in the backward pass (the last chunk may be
            shorter); 0: the whole unroll at once, nothing recomputed (every step's state kept);
        parallel: the parallel scan inside a chunk instead of the loop.
    Returns:
        y ``[T, B, D]`` (``y_t = C_t h_t``, without the D skip) and ``h_T [B, D, N]``.
    """
    run = _parallel if parallel else _loop
    T = u.shape[0]
    if chunk_size < 1 or chunk_size >= T:
        return run(u, delta, A, B, C, h0, reset)
    # recompute only what will get gradients; without them no state is kept anyway
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (u, delta, A, B, C, h0))
    h, ys = h0, []
    for s in range(0, T, chunk_size):
        e = min(T, s + chunk_size)
        args = (u[s:e], delta[s:e], A, B[s:e], C[s:e], h, None if reset is None else reset[s:e])
        if recompute:
            y, h = checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False)
        else:
            y, h = run(*args)
        ys.append(y)
    return torch.cat(ys), h
