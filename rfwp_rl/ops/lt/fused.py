"""Fused ``lt`` over the C++ (CPU) and CUDA kernels of ``csrc/``: forward and backward in
one kernel call each, checkpoints every ``chunk`` steps (the CPU backward needs only the
initial state: it rebuilds the states in place in a forward pass)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c


class LtFunction(torch.autograd.Function):
    """Autograd node of the fused ``lt`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, W0: Tensor, reset: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        y, W, ckpt = be.lt_forward(q, k, v, W0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, reset, ckpt)
        return y, W

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor) -> tuple:
        q, k, v, reset, ckpt = ctx.saved_tensors
        gq, gk, gv, gW0 = ctx.be.lt_backward(q, k, v, reset, ckpt, _c(gy), _c(gW), ctx.chunk)
        return None, None, gq, gk, gv, gW0, None


def lt(be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, W0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.lt.naive.lt` on kernel backend ``be`` (float32/float64):
    ``(y [T, B, H, dv], W_T [B, H, dv, dk])``."""
    if not needs_grad(chunk, q, k, v, W0):
        return tuple(be.lt_forward(_c(q), _c(k), _c(v), _c(W0), reset_mask(reset), 0)[:2])
    return LtFunction.apply(be, chunk, _c(q), _c(k), _c(v), _c(W0), reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``lt`` runs these sizes, else why not (naming the size)."""
    return kernel_supported("lt", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(q, k, v, W0, reset)``."""
    return Dims(dk=args[0].shape[-1], dv=args[2].shape[-1])
