"""Fused ``srwm`` over the C++ (CPU) and CUDA kernels of ``csrc/``: forward and backward in
one kernel call each; the backward recomputes W inside each chunk of ``chunk`` steps from the
ΔW the forward kept at its start, and returns the gradient of the slow initial weights summed
over the batch in a fixed order."""

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
from rfwp_rl.ops.srwm.naive import head_size


class SrwmFunction(torch.autograd.Function):
    """Autograd node of the fused ``srwm`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, be: Any, chunk: int, x: Tensor, W_init: Tensor, dW0: Tensor, reset: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        y, dW, ckpt = be.srwm_forward(x, W_init, dW0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(x, W_init, reset, ckpt)
        return y, dW

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gdW: Tensor) -> tuple:
        x, W_init, reset, ckpt = ctx.saved_tensors
        grads = ctx.be.srwm_backward(x, W_init, reset, ckpt, _c(gy), _c(gdW), ctx.chunk)
        return (None, None, *grads, None)


def srwm(be: Any, chunk: int, x: Tensor, W_init: Tensor, dW0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.srwm.naive.srwm` with the softmax feature map on kernel
    backend ``be`` (float32/float64): ``(y [T, B, H, d], ΔW_T [B, H, 3d + 4, d])``."""
    if not needs_grad(chunk, x, W_init, dW0):
        return tuple(be.srwm_forward(_c(x), _c(W_init), _c(dW0), reset_mask(reset), 0)[:2])
    return SrwmFunction.apply(be, chunk, _c(x), _c(W_init), _c(dW0), reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``srwm`` runs these sizes, else why not (naming the size).

    The kernel applies softmax to the generated q and k itself (the SRWM paper's φ), so it
    runs the softmax feature map only, with the key size equal to the head size.
    """
    if dims.feature_map not in (None, "softmax"):
        return f"srwm with feature map {dims.feature_map!r} (the fused kernel implements softmax only)"
    if dims.dk != dims.dv:
        return f"srwm with {dims} (the fused kernel needs the key size equal to the head size)"
    return kernel_supported("srwm", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(x, W_init, dW0, reset)``: key size D (columns), value size d (from
    the 3d + 4 rows); the feature map is the ``feature_map`` option (None or
    :func:`rfwp_rl.ops.common.softmax`: softmax)."""
    fm = options.get("feature_map")
    name = "softmax" if fm is None or fm is softmax else getattr(fm, "__name__", repr(fm))
    return Dims(dk=args[0].shape[-1], dv=head_size(args[1].shape[-2]), feature_map=name)
