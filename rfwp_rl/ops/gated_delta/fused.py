"""Fused ``gated_delta`` over the C++ (CPU) and CUDA kernels of ``csrc/`` (the kernels it
shares with ``delta_product``: a decay, then n_h = 1 delta-rule steps): forward and backward
in one kernel call each; the backward recomputes the states inside each chunk of ``chunk``
steps from the checkpoint the forward kept at its start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c


class GatedDeltaFunction(torch.autograd.Function):
    """Autograd node of the fused ``gated_delta`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        chunk: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        alpha: Tensor,
        beta: Tensor,
        S0: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        y, S, ckpt = be.gated_delta_forward(q, k, v, alpha, beta, S0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, alpha, beta, reset, ckpt)
        return y, S

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gS: Tensor) -> tuple:
        q, k, v, alpha, beta, reset, ckpt = ctx.saved_tensors
        grads = ctx.be.gated_delta_backward(q, k, v, alpha, beta, reset, ckpt, _c(gy), _c(gS), ctx.chunk)
        return (None, None, *grads, None)


def gated_delta(
    be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, beta: Tensor, S0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.gated_delta.naive.gated_delta` on kernel backend ``be``
    (float32/float64): ``(o [T, B, H, dv], S_T [B, H, dv, dk])``."""
    if not needs_grad(chunk, q, k, v, alpha, beta, S0):
        return tuple(be.gated_delta_forward(_c(q), _c(k), _c(v), _c(alpha), _c(beta), _c(S0), reset_mask(reset), 0)[:2])
    return GatedDeltaFunction.apply(be, chunk, _c(q), _c(k), _c(v), _c(alpha), _c(beta), _c(S0), reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``gated_delta`` runs these sizes, else why not (naming the size)."""
    return kernel_supported("gated_delta", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(q, k, v, alpha, beta, S0, reset)``."""
    return Dims(dk=args[0].shape[-1], dv=args[2].shape[-1])
