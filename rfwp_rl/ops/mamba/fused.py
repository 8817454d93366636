"""Fused ``mamba`` over the CPU kernel of ``csrc/cpu/selective_scan_impl.h``: one task per batch
entry keeps the state of a step (D x N numbers) in a scratch row, so the states of all steps are
never written to memory; the forward keeps the state before every chunk of steps, the backward
recomputes each chunk's states from it and walks the steps in reverse. There is no CUDA kernel:
``supported`` sends CUDA inputs to the reference, and the core runs the chunked PyTorch form
(:mod:`rfwp_rl.ops.mamba.chunked`) there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl import kernels, ops
from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import HALF_DTYPES, KERNEL_DTYPES, Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c


class SelectiveScanFunction(torch.autograd.Function):
    """Autograd node of the fused ``mamba`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        chunk: int,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        h0: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        y, h, ckpt = be.mamba_forward(u, delta, A, B, C, h0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.set_materialize_grads(False)  # an unused output (h_T, usually) costs nothing
        ctx.save_for_backward(u, delta, A, B, C, reset, ckpt)
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor | None, gh: Tensor | None) -> tuple:
        u, delta, A, B, C, reset, ckpt = ctx.saved_tensors
        grads = ctx.be.mamba_backward(u, delta, A, B, C, reset, ckpt, _c(gy), _c(gh), ctx.chunk)
        return None, None, *grads, None


def selective_scan(
    be: Any,
    chunk: int,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    h0: Tensor,
    reset: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.mamba.naive.selective_scan` on kernel backend ``be``
    (float32/float64; half types computed in float32) with checkpoints every ``chunk`` steps:
    ``(y [T, B, D], h_T [B, D, N])``."""
    args = [_c(a) for a in (u, delta, A, B, C, h0)]
    if not needs_grad(chunk, *args):
        return tuple(be.mamba_forward(*args, reset_mask(reset), 0)[:2])
    return SelectiveScanFunction.apply(be, chunk, *args, reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``mamba`` runs these sizes (every size on the CPU), else why not
    (CUDA has no mamba kernel)."""
    return kernel_supported("mamba", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(u, delta, A, ...)``: the state size N (as the key size) and the
    channels D (as the value size)."""
    return Dims(dk=args[2].shape[-1], dv=args[0].shape[-1])


@functools.cache
def _kernel_op() -> Callable[..., tuple]:
    return ops.get("mamba", "kernel")


def layer(backend: str, like: Tensor) -> Callable[..., tuple] | None:
    """The op on its fused kernel for inputs like ``like`` (the signature of
    :func:`rfwp_rl.ops.mamba.naive.selective_scan`), or None where the caller should run the
    chunked PyTorch form instead: backend ``'reference'``, a device other than the CPU, a dtype
    the kernel does not take, or no built kernels (with backend ``'kernel'`` that is a one-line
    :class:`~rfwp_rl.errors.UserError`)."""
    if backend == "reference" or like.device.type != "cpu" or like.dtype not in KERNEL_DTYPES + HALF_DTYPES:
        return None
    if kernels.load()[0] is None:
        if backend == "kernel":
            ops.resolve("mamba", "kernel")  # raises the one-line error naming why
        return None
    return _kernel_op()
