"""Fused ``delta_product`` over the C++ (CPU) and CUDA kernels of ``csrc/`` (shared with
``gated_delta``, without the decay): forward and backward in one kernel call each; the
backward recomputes the n_h intermediate states of every step inside each chunk of ``chunk``
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


class DeltaProductFunction(torch.autograd.Function):
    """Autograd node of the fused ``delta_product`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        chunk: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        beta: Tensor,
        S0: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        y, S, ckpt = be.delta_product_forward(q, k, v, beta, S0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, beta, reset, ckpt)
        return y, S

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gS: Tensor) -> tuple:
        q, k, v, beta, reset, ckpt = ctx.saved_tensors
        grads = ctx.be.delta_product_backward(q, k, v, beta, reset, ckpt, _c(gy), _c(gS), ctx.chunk)
        return (None, None, *grads, None)


def delta_product(
    be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, S0: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.delta_product.naive.delta_product` on kernel backend ``be``
    (float32/float64): ``(o [T, B, H, dv], S_T [B, H, dv, dk])``."""
    if not needs_grad(chunk, q, k, v, beta, S0):
        return tuple(be.delta_product_forward(_c(q), _c(k), _c(v), _c(beta), _c(S0), reset_mask(reset), 0)[:2])
    return DeltaProductFunction.apply(be, chunk, _c(q), _c(k), _c(v), _c(beta), _c(S0), reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``delta_product`` runs these sizes, else why not (naming the size).
    The number of Householder steps n_h does not change the limits (the CUDA kernel keeps the
    intermediate states of a chunk in global memory)."""
    return kernel_supported("delta_product", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(q, k, v, beta, S0, reset)``."""
    return Dims(dk=args[0].shape[-1], dv=args[2].shape[-1])
