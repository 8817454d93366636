"""Fused ``rdn`` over the C++ (CPU) and CUDA kernels of ``csrc/``: forward and backward in
one kernel call each; the forward keeps W every ``chunk`` steps and the activated q, k, v, β
and tanh(y_{t-1}) for the backward, which also returns the gradients of the recurrent slow
weights (summed over the batch in a fixed order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c
from rfwp_rl.ops.common import softmax


class RdnFunction(torch.autograd.Function):
    """Autograd node of the fused ``rdn`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        chunk: int,
        xq: Tensor,
        xk: Tensor,
        xv: Tensor,
        xb: Tensor,
        Rq: Tensor,
        Rk: Tensor,
        Rv: Tensor,
        rb: Tensor,
        W0: Tensor,
        y0: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        y, W, ckpt, q, k, v, beta, h = be.rdn_forward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt)
        return y, W

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor) -> tuple:
        Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt = ctx.saved_tensors
        grads = ctx.be.rdn_backward(Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt, _c(gy), _c(gW), ctx.chunk)
        return (None, None, *grads, None)


def rdn(
    be: Any,
    chunk: int,
    xq: Tensor,
    xk: Tensor,
    xv: Tensor,
    xb: Tensor,
    Rq: Tensor,
    Rk: Tensor,
    Rv: Tensor,
    rb: Tensor,
    W0: Tensor,
    y0: Tensor,
    reset: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.rdn.naive.rdn` with the softmax feature map on kernel
    backend ``be`` (float32/float64): ``(y [T, B, H, d], W_T [B, H, d, d])``."""
    if not needs_grad(chunk, xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0):
        return tuple(
            be.rdn_forward(
                _c(xq), _c(xk), _c(xv), _c(xb), _c(Rq), _c(Rk), _c(Rv), _c(rb), _c(W0), _c(y0), reset_mask(reset), 0
            )[:2]
        )
    return RdnFunction.apply(
        be, chunk, _c(xq), _c(xk), _c(xv), _c(xb), _c(Rq), _c(Rk), _c(Rv), _c(rb), _c(W0), _c(y0), reset_mask(reset)
    )


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``rdn`` runs these sizes, else why not (naming the size).

    The kernel computes k = softmax(...) and q = softmax(...) itself (RFWP Eq. 15, 17), so it
    runs the softmax feature map only, with the key size equal to the head size.
    """
    if dims.feature_map not in (None, "softmax"):
        return f"rdn with feature map {dims.feature_map!r} (the fused kernel implements softmax only)"
    if dims.dk != dims.dv:
        return f"rdn with {dims} (the fused kernel needs the key size equal to the head size)"
    return kernel_supported("rdn", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0, reset)``; the feature map
    is the ``feature_map`` option (None or :func:`rfwp_rl.ops.common.softmax`: softmax)."""
    fm = options.get("feature_map")
    name = "softmax" if fm is None or fm is softmax else getattr(fm, "__name__", repr(fm))
    return Dims(dk=args[8].shape[-1], dv=args[0].shape[-1], feature_map=name)
