"""Fused ``mamba`` over the kernels of ``csrc/``: on the CPU ``csrc/cpu/selective_scan_impl.h``
(one task per batch entry keeps the state of a step, D x N numbers, in a scratch row), on CUDA
``csrc/cuda/selective_scan.cu`` (one thread block per batch entry, each channel's N state values
spread over lanes of one warp, the state in shared memory when it fits the device, else in
global memory: no size limit). Neither writes the states of all steps to memory: the forward
keeps the state before every chunk of steps, the backward recomputes each chunk's states from it
and walks the steps in reverse; the gradient of A is summed over the batch in a fixed order.
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
from rfwp_rl.ops import dispatch
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
    """None when the fused ``mamba`` runs these sizes, else why not: every size on the CPU, and
    on CUDA every size the launch model of :mod:`rfwp_rl.kernels.cuda_limits` admits (the
    kernels keep what does not fit the device's shared memory in global memory, so that is every
    size up to the device's thread and register limits)."""
    return kernel_supported("mamba", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(u, delta, A, ...)``: the state size N (as the key size) and the
    channels D (as the value size)."""
    return Dims(dk=args[2].shape[-1], dv=args[0].shape[-1])


@functools.cache
def _kernel_op() -> Callable[..., tuple]:
    return ops.get("mamba", "kernel")


@functools.cache
def _refusal(ext: Any, device: torch.device, dtype: torch.dtype, dims: Dims) -> str | None:
    """:func:`rfwp_rl.ops.dispatch.refusal` of ``mamba``, kept per (kernels, device, dtype, sizes):
    :func:`layer` runs on every forward pass."""
    return dispatch.refusal(ops.spec("mamba"), ext, dims, dtype, device)


def layer(backend: str, like: Tensor, state_size: int) -> Callable[..., tuple] | None:
    """The op on its fused kernel for inputs like ``like`` (``u [T, B, D]`` of
    :func:`rfwp_rl.ops.mamba.naive.selective_scan`) with ``state_size`` (N) state values per
    channel, or None where the caller should run the chunked PyTorch form instead: backend
    ``'reference'``, a device other than the CPU and CUDA, a dtype the kernel does not take, no
    built kernels, or on CUDA a build without CUDA kernels or a kernel whose first run on the
    device disagrees with the reference (after one warning). With backend ``'kernel'`` the last
    three are a one-line :class:`~rfwp_rl.errors.UserError` instead."""
    dtypes = KERNEL_DTYPES + HALF_DTYPES
    if backend == "reference" or like.device.type not in ("cpu", "cuda") or like.dtype not in dtypes:
        return None
    ext = kernels.load()[0]
    if ext is None:
        if backend == "kernel":
            ops.resolve("mamba", "kernel")  # raises the one-line error naming why
        return None
    dims = Dims(dk=state_size, dv=like.shape[-1])
    why = _refusal(ext, like.device, like.dtype, dims)
    if why is not None:
        where = dispatch.op_site(ops.spec("mamba"), dims, like.dtype, like.device)
        if backend == "kernel":
            raise dispatch.refuse(where, why)
        dispatch.warn_once(f"rfwp_rl: {where} runs on the chunked PyTorch form: {why}")
        return None
    return _kernel_op()
