"""Fused ``delta`` over the C++ (CPU) and CUDA kernels of ``csrc/``: forward and backward
in one kernel call each; the backward recomputes the fast weights inside each chunk of
``chunk`` steps from the checkpoint the forward kept at its start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c


class DeltaFunction(torch.autograd.Function):
    """Autograd node of the fused ``delta`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        chunk: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        beta: Tensor,
        W0: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        y, W, ckpt = be.delta_forward(q, k, v, beta, W0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, beta, reset, ckpt)
        return y, W

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor) -> tuple:
        q, k, v, beta, reset, ckpt = ctx.saved_tensors
        gq, gk, gv, gbeta, gW0 = ctx.be.delta_backward(q, k, v, beta, reset, ckpt, _c(gy), _c(gW), ctx.chunk)
        return None, None, gq, gk, gv, gbeta, gW0, None


def delta(
    be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.delta.naive.delta` on kernel backend ``be`` (float32/float64):
    ``(y [T, B, H, dv], W_T [B, H, dv, dk])``."""
    if not needs_grad(chunk, q, k, v, beta, W0):
        return tuple(be.delta_forward(_c(q), _c(k), _c(v), _c(beta), _c(W0), reset_mask(reset), 0)[:2])
    return DeltaFunction.apply(be, chunk, _c(q), _c(k), _c(v), _c(beta), _c(W0), reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``delta`` runs these sizes, else why not (naming the size)."""
    return kernel_supported("delta", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(q, k, v, beta, W0, reset)``."""
    return Dims(dk=args[0].shape[-1], dv=args[2].shape[-1])
