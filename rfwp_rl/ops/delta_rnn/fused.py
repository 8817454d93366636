"""Fused ``delta_rnn`` over the C++ (CPU) and CUDA kernels of ``csrc/``: forward and
backward in one kernel call each; the forward keeps W and R every ``chunk`` steps and the
recurrent queries softmax(y_{t-1}) for the backward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c


class DeltaRnnFunction(torch.autograd.Function):
    """Autograd node of the fused ``delta_rnn`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        chunk: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        beta: Tensor,
        kr: Tensor,
        vr: Tensor,
        beta_r: Tensor,
        W0: Tensor,
        R0: Tensor,
        y0: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        y, W, R, ckW, ckR, s = be.delta_rnn_forward(q, k, v, beta, kr, vr, beta_r, W0, R0, y0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, beta, kr, vr, beta_r, s, reset, ckW, ckR)
        return y, W, R

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor, gR: Tensor) -> tuple:
        q, k, v, beta, kr, vr, beta_r, s, reset, ckW, ckR = ctx.saved_tensors
        grads = ctx.be.delta_rnn_backward(
            q, k, v, beta, kr, vr, beta_r, s, reset, ckW, ckR, _c(gy), _c(gW), _c(gR), ctx.chunk
        )
        return (None, None, *grads, None)


def delta_rnn(
    be: Any,
    chunk: int,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    kr: Tensor,
    vr: Tensor,
    beta_r: Tensor,
    W0: Tensor,
    R0: Tensor,
    y0: Tensor,
    reset: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.delta_rnn.naive.delta_rnn` on kernel backend ``be``
    (float32/float64): ``(y [T, B, H, d], W_T, R_T)``."""
    if not needs_grad(chunk, q, k, v, beta, kr, vr, beta_r, W0, R0, y0):
        return tuple(
            be.delta_rnn_forward(
                _c(q), _c(k), _c(v), _c(beta), _c(kr), _c(vr), _c(beta_r), _c(W0), _c(R0), _c(y0), reset_mask(reset), 0
            )[:3]
        )
    return DeltaRnnFunction.apply(
        be, chunk, _c(q), _c(k), _c(v), _c(beta), _c(kr), _c(vr), _c(beta_r), _c(W0), _c(R0), _c(y0), reset_mask(reset)
    )


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``delta_rnn`` runs these sizes, else why not (naming the size)."""
    return kernel_supported("delta_rnn", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(q, k, v, beta, kr, vr, beta_r, W0, R0, y0, reset)``."""
    return Dims(dk=args[0].shape[-1], dv=args[2].shape[-1])
