"""The diagonal linear recurrence over a whole unroll, with its backward as the same recurrence
run backwards in time.

Forward: ``h_t = a_t ⊙ h_{t-1} + b_t``. Backward (for a real loss, PyTorch's conjugate
convention): ``λ_t = g_t + conj(a_{t+1}) ⊙ λ_{t+1}``, then ``∂b_t = λ_t``,
``∂a_t = λ_t ⊙ conj(h_{t-1})``, ``∂h0 = conj(a_0) ⊙ λ_0``: one more recurrence, so neither
direction keeps a graph per step. A reset before step t makes ``a_t = 0`` (nothing of the past
crosses it, no gradient either).

Each recurrence runs as a plain loop on the CPU (T elementwise steps: the least work) and as a
log-depth (Hillis-Steele) prefix scan elsewhere, where the number of sequential kernel launches
is what costs: composing two steps gives another, ``(a_t, b_t) ∘ (a_s, b_s) = (a_t a_s,
a_t b_s + b_t)``, an associative operation (Blelloch 1990; the parallel form of LRU, Orvieto et
al. 2023, Sec. 3.1, and S5, Smith et al. 2023, Sec. 2.2). Only products of decays appear, never
their inverses, so decays near zero stay exact.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable


def recurrence_loop(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """``h_t = a_t ⊙ h_{t-1} + b_t`` step by step (no autograd): a, b ``[T, ...]`` of one shape."""
    h = torch.empty(b.shape, dtype=torch.result_type(a, b), device=b.device)
    prev = h0
    for t in range(b.shape[0]):
        torch.mul(a[t], prev, out=h[t])
        h[t].add_(b[t])
        prev = h[t]
    return h


def recurrence_prefix_scan(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """The same values in ``ceil(log2 T)`` rounds over the whole unroll (no autograd)."""
    T, k = b.shape[0], 1
    # after the round with stride k, (a[t], b[t]) maps h_{t-2k} to h_t (h0 where t < 2k)
    while k < T:
        b = torch.cat([b[:k], a[k:] * b[:-k] + b[k:]])
        a = torch.cat([a[:k], a[k:] * a[:-k]])
        k *= 2
    return b + a * h0.unsqueeze(0)


def recurrence(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """The loop on the CPU, the prefix scan on other devices (module docstring)."""
    return recurrence_loop(a, b, h0) if b.device.type == "cpu" else recurrence_prefix_scan(a, b, h0)


class DiagonalScanFunction(torch.autograd.Function):
    """Autograd node of the recurrence: a, b ``[T, ...]`` (one shape), h0 ``[...]`` -> h ``[T, ...]``."""

    @staticmethod
    def forward(ctx: FunctionCtx, a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
        h = recurrence(a, b, h0)
        ctx.save_for_backward(a, h, h0)
        ctx.real_inputs = tuple(not x.is_complex() for x in (a, b, h0))
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a, h, h0 = ctx.saved_tensors
        a_next = torch.cat([a[1:], torch.zeros_like(a[:1])]).conj()
        lam = recurrence(a_next.flip(0), g.flip(0), torch.zeros_like(g[0])).flip(0)
        h_prev = torch.cat([h0.unsqueeze(0).to(h.dtype), h[:-1]]).conj()
        grads = (lam * h_prev, lam, a[0].conj() * lam[0])
        # a real input of a complex recurrence gets the real part of its gradient
        return tuple(x.real if real and x.is_complex() else x for x, real in zip(grads, ctx.real_inputs))


def diagonal_scan(a: Tensor, b: Tensor, h0: Tensor, reset: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``h_t = a_t ⊙ h_{t-1} + b_t`` for every t at once, ``h_{-1} = h0``; the state of entry
    ``b`` is zeroed before step ``t`` where ``reset[t, b]``.

    a: broadcastable to b (real or complex); b ``[T, B, *S]``; h0 ``[B, *S]``; reset ``[T, B]``
    bool or None. Returns h ``[T, B, *S]`` and the last state ``[B, *S]``.
    """
    a = a.expand_as(b)
    if reset is not None:
        keep = reset.logical_not().view(*reset.shape, *([1] * (b.dim() - 2)))
        a = torch.where(keep, a, torch.zeros((), dtype=a.dtype, device=a.device))
    h = DiagonalScanFunction.apply(a, b, h0)
    return h, h[-1]
