"""Fused ``lstm`` over the CPU kernel of ``csrc/cpu/lstm_impl.h`` and its GEMMs in
``csrc/bindings.cpp``: the forward is one GEMM for the input projection of every step, then per
step one GEMM (the recurrent product) and one pointwise pass; it keeps the activations of every
step (O(5 H) numbers per step and row, no checkpoints). The backward walks the steps in reverse
(a pointwise pass and one GEMM for ∂L/∂h_{t-1} per step), then forms the gradients of x, W_ih,
W_hh and the biases as one GEMM (or sum) each over all steps. There is no CUDA kernel (cuDNN's
LSTM is the one to use there): ``supported`` sends CUDA inputs to the reference.
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
from rfwp_rl.ops.base import (
    HALF_DTYPES,
    KERNEL_DTYPES,
    Dims,
    kernel_supported,
    needs_grad,
    reset_mask,
)
from rfwp_rl.ops.base import (
    contiguous as _c,
)

H0_ARG, C0_ARG = 1, 2
"""Positions of the initial state (h0, c0) in the op's arguments (signature order)."""

AUTO_MAX_HIDDEN = 64
"""The largest hidden size backend ``'auto'`` runs on the fused kernel. Above it torch's
nn.LSTM (oneDNN) is as fast or faster, because the GEMMs dominate and oneDNN's are better
blocked; below it the fused kernel is the faster. ``'kernel'`` runs it at every size."""


class LstmFunction(torch.autograd.Function):
    """Autograd node of the fused ``lstm`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        x: Tensor,
        h0: Tensor,
        c0: Tensor,
        w_ih: Tensor,
        w_hh: Tensor,
        b_ih: Tensor,
        b_hh: Tensor,
        reset: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        y, h, c, acts, cs, hs = be.lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, reset, 1)
        ctx.be = be
        ctx.set_materialize_grads(False)  # unused outputs (h_T, c_T, usually) cost nothing
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, reset, hs, acts, cs)
        return y, h, c

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor | None, gh: Tensor | None, gc: Tensor | None) -> tuple:
        return _backward(ctx, gy, gh, gc)


def _backward(ctx: Any, gy: Tensor | None, gh: Tensor | None, gc: Tensor | None) -> tuple:
    """Gradients of (be, x, h0, c0, w_ih, w_hh, b_ih, b_hh, reset) from what the forward saved:
    (x, h0, c0, w_ih, w_hh, reset, hs, acts, cs)."""
    x, h0, c0, w_ih, w_hh, reset, hs, acts, cs = ctx.saved_tensors
    # the gradient of x costs a GEMM: only when autograd wants it (not for observations)
    need_gx = ctx.needs_input_grad[1]
    gx, gh0, gc0, gw_ih, gw_hh, gb = ctx.be.lstm_backward(
        x, h0, c0, w_ih, w_hh, reset, hs, acts, cs, _c(gy), _c(gh), _c(gc), need_gx
    )
    # b_ih and b_hh enter as their sum: the same gradient (a copy: two parameters'
    # .grad must not share storage)
    return None, gx if need_gx else None, gh0, gc0, gw_ih, gw_hh, gb, gb.clone(), None


class LstmReplay(torch.autograd.Function):
    """Autograd node over steps a :class:`Recorder` took: the forward returns their outputs (no
    recomputation), the backward is :class:`LstmFunction`'s on their recorded activations."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        be: Any,
        x: Tensor,
        h0: Tensor,
        c0: Tensor,
        w_ih: Tensor,
        w_hh: Tensor,
        b_ih: Tensor,
        b_hh: Tensor,
        ys: list[Tensor],
        acts: list[Tensor],
        cs: list[Tensor],
    ) -> Tensor:
        y = torch.cat(ys)
        ctx.be = be
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, None, y, torch.cat(acts), torch.cat(cs))
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor) -> tuple:
        return (*_backward(ctx, gy, None, None)[:8], None, None, None)


class Recorder:
    """One layer stepped without gradients (acting) on the fused kernel, keeping what its
    backward needs (O(5 H) numbers per step and row), then :meth:`replay`: the outputs of those
    steps as one autograd node over the weights, equal to a call of the op on the whole
    sequence from the same start, without computing it again.

    ``be``: a kernel backend; h0, c0 ``[B, H]``: the state before the first step.
    """

    def __init__(self, be: Any, h0: Tensor, c0: Tensor) -> None:
        self.be, self.h0, self.c0 = be, h0, c0
        self.h, self.c = h0, c0
        self.xs: list[Tensor] = []
        self.ys: list[Tensor] = []
        self.acts: list[Tensor] = []
        self.cs: list[Tensor] = []

    @torch.no_grad()
    def step(self, x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> Tensor:
        """One step: x ``[B, I]`` -> h ``[B, H]`` (nn.LSTM's weights of the layer)."""
        x = _c(x.unsqueeze(0))
        y, self.h, self.c, acts, cs, _ = self.be.lstm_forward(
            x, self.h, self.c, *(_c(p) for p in (w_ih, w_hh, b_ih, b_hh)), None, 1
        )
        self.xs.append(x)
        self.ys.append(y)
        self.acts.append(acts)
        self.cs.append(cs)
        return y[0]

    def replay(self, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> Tensor:
        """y ``[T, B, H]`` of the steps taken, with gradients to the weights (the same weights
        the steps used; the inputs get none)."""
        if not self.ys:
            raise ValueError("no steps to replay")
        return LstmReplay.apply(
            self.be,
            torch.cat(self.xs),
            self.h0,
            self.c0,
            *(_c(p) for p in (w_ih, w_hh, b_ih, b_hh)),
            self.ys,
            self.acts,
            self.cs,
        )


def lstm(
    be: Any,
    chunk: int,
    x: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
    reset: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.lstm.naive.lstm` on kernel backend ``be`` (float32/float64;
    half types computed in float32): ``(y [T, B, H], h_T [B, H], c_T [B, H])``. ``chunk`` only
    says whether gradients may be needed (the kernel keeps every step's activations)."""
    args = [_c(a) for a in (x, h0, c0, w_ih, w_hh, b_ih, b_hh)]
    if not needs_grad(chunk, *args):
        return tuple(be.lstm_forward(*args, reset_mask(reset), 0)[:3])
    return LstmFunction.apply(be, *args, reset_mask(reset))


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``lstm`` runs these sizes (every size on the CPU), else why not
    (CUDA has no lstm kernel)."""
    return kernel_supported("lstm", dims, dtype, device, limits)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(x, h0, c0, ...)``: input size (as the key size) and hidden size."""
    return Dims(dk=args[0].shape[-1], dv=args[H0_ARG].shape[-1])


@functools.cache
def _kernel_op() -> Callable[..., tuple]:
    return ops.get("lstm", "kernel")


def recorder(backend: str, like: Tensor, hidden_size: int, h0: Tensor, c0: Tensor) -> Recorder | None:
    """A :class:`Recorder` where :func:`layer` runs the fused op, else None."""
    if layer(backend, like, hidden_size) is None:
        return None
    return Recorder(kernels.load()[0], h0, c0)


def layer(backend: str, like: Tensor, hidden_size: int) -> Callable[..., tuple] | None:
    """The op on its fused kernel for inputs like ``like`` (the signature of
    :func:`rfwp_rl.ops.lstm.naive.lstm`), or None where the caller should run torch's
    ``nn.LSTM`` instead: backend ``'reference'``, a device other than the CPU (cuDNN there), a
    dtype the kernel does not take, backend ``'auto'`` above :data:`AUTO_MAX_HIDDEN`, or no
    built kernels (with backend ``'kernel'`` that is a one-line
    :class:`~rfwp_rl.errors.UserError`)."""
    if (
        backend == "reference"
        or like.device.type != "cpu"
        or like.dtype not in KERNEL_DTYPES + HALF_DTYPES
        or (backend == "auto" and hidden_size > AUTO_MAX_HIDDEN)
    ):
        return None
    if kernels.load()[0] is None:
        if backend == "kernel":
            ops.resolve("lstm", "kernel")  # raises the one-line error naming why
        return None
    return _kernel_op()
