"""Fused ``fwm`` over the C++ CPU kernel of ``csrc/cpu/fwm_impl.h``: forward and backward in
one kernel call each, and an incremental stepper for acting without gradients.

The kernel keeps the fast tensor as a dense base plus the low-rank tail of the writes since the
base, so a step costs O(L m) for a tail of L terms instead of O(m³) (the base, when non-zero,
adds O(m³)); a tail of ``chunk`` terms (at most m²) is folded into a new dense base, which the
forward keeps for the backward like a checkpoint. The forward also keeps O(N_r m) numbers per
step; the backward recomputes no step. There is no CUDA kernel: ``supported`` sends CUDA
inputs to the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rfwp_rl import kernels
from rfwp_rl.kernels.cuda_limits import DeviceLimits
from rfwp_rl.ops.base import KERNEL_DTYPES, Dims, kernel_supported, needs_grad, reset_mask
from rfwp_rl.ops.base import contiguous as _c

F0_ARG = 2
"""Position of the initial tensor F0 in the op's arguments (signature order)."""


class FwmFunction(torch.autograd.Function):
    """Autograd node of the fused ``fwm`` (``be``: a kernel backend; once-differentiable)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, be: Any, chunk: int, w: Tensor, r: Tensor, F0: Tensor, reset: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        y, F, saved, bases = be.fwm_forward(w, r, F0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        # an unused output (the final tensor, usually) gets None, not zeros: its gradient would
        # cost O(m³) per tail term
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(w, r, F0, reset, saved, bases)
        return y, F

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor | None, gF: Tensor | None) -> tuple:
        w, r, F0, reset, saved, bases = ctx.saved_tensors
        if gy is None:  # only the final tensor is used
            gy = w.new_zeros(*w.shape[:3], F0.shape[-1])
        gy = _c(gy)
        # the gradient of F0 costs O(m³) per step of its segment: only when autograd wants it
        need_gF0 = ctx.needs_input_grad[2 + F0_ARG]
        gw, gr, gF0 = ctx.be.fwm_backward(w, r, F0, reset, saved, bases, gy, _c(gF), need_gF0, ctx.chunk)
        return None, None, gw, gr, gF0 if need_gF0 else None, None


def fwm(be: Any, chunk: int, w: Tensor, r: Tensor, F0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.fwm.naive.fwm` on kernel backend ``be`` (float32/float64):
    ``(y [T, B, H, m], F_T [B, H, m, m, m])``; ``chunk``: the longest low-rank tail (the
    kernel caps it at m²)."""
    w, r, F0 = _c(w), _c(r), _c(F0)
    if not needs_grad(chunk, w, r, F0):
        return tuple(be.fwm_forward(w, r, F0, reset_mask(reset), 0)[:2])
    return FwmFunction.apply(be, chunk, w, r, F0, reset_mask(reset))


class FwmReplay(torch.autograd.Function):
    """Autograd node over steps a recording :class:`Stepper` took from the zero tensor: the
    forward returns their outputs (no recomputation), the backward is :class:`FwmFunction`'s on
    the records of those steps (what the fused forward keeps of each step)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, be: Any, w: Tensor, r: Tensor, ys: list[Tensor], saved: list[Tensor], reset: Tensor | None
    ) -> Tensor:
        ctx.be = be
        ctx.save_for_backward(w, r, torch.stack(saved, 1), reset)
        return torch.stack(ys)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor) -> tuple:
        w, r, saved, reset = ctx.saved_tensors
        T, m = w.shape[0], gy.shape[-1]
        # no tail was folded (Stepper.replay checks): one segment of T steps, no dense bases;
        # the empty F0 is the zero tensor the steps started from
        bases = saved.new_empty(saved.shape[0], 0, m**3, saved.shape[-1])
        gw, gr, _ = ctx.be.fwm_backward(w, r, w.new_empty(0), reset, saved, bases, _c(gy), None, False, T)
        return None, gw, gr, None, None, None


class Stepper:
    """The fused forward one step at a time, without gradients (acting): the low-rank state
    lives in the kernel's own layout (``fwm_step_state``) and each step appends one term, so a
    step costs O(L m), not a pass over a dense [m, m, m] tensor per (b, h).

    ``B, H, m``: memories and their size; ``like``: a tensor of the dtype and device; ``F0``:
    the tensor to start from ``[B, H, m, m, m]`` (None: zero); ``record``: keep what the fused
    backward needs of each step (O(N_r m) numbers per step and memory) for :meth:`replay`.
    ``step(w, r, reset=None) -> y``: one step of :func:`rfwp_rl.ops.fwm.naive.fwm` (shapes
    without the time dimension; reset ``[B]``).
    """

    INITIAL_CAPACITY = 32
    """Tail terms the state has room for at first; doubled when needed (up to the kernel's
    fold length): a task's live state stays a few cache lines."""

    def __init__(
        self, be: Any, B: int, H: int, m: int, like: Tensor, F0: Tensor | None = None, record: bool = False
    ) -> None:
        self.be, self.B, self.H = be, B, H
        self.steps = 0
        # a replay needs the zero start and no folded tail (one segment for the backward)
        self.record = record and F0 is None
        self.fold = be.fwm_fold_length(m)
        self.ys: list[Tensor] = []
        self.saved: list[Tensor] = []
        self.resets: list[Tensor | None] = []
        with torch.no_grad():
            self.state = be.fwm_step_state(B, H, m, like, F0, self.INITIAL_CAPACITY)

    @torch.no_grad()
    def step(self, w: Tensor, r: Tensor, reset: Tensor | None = None) -> Tensor:
        self.steps += 1  # no tail is longer than the steps taken
        if self.steps > self.state[2].shape[1]:
            self.state = self.be.fwm_step_grow(self.state, 2 * self.state[2].shape[1])
        if reset is not None:
            reset = reset.to(torch.bool).contiguous()
        self.record = self.record and self.steps <= self.fold
        y, saved = self.be.fwm_step(_c(w), _c(r), reset, self.state, self.record)
        if self.record:
            self.ys.append(y)
            self.saved.append(saved)
            self.resets.append(reset)
        return y

    def replay(self, w: Tensor, r: Tensor) -> Tensor | None:
        """y ``[T, B, H, m]`` of the recorded steps as a function of their inputs w
        ``[T, B, H, 3m + 1]``, r ``[T, B, H, (1 + N_r) m]`` (the same numbers the steps took,
        computed again with gradients): one autograd node, equal to the fused op on the whole
        sequence from the zero tensor. None without a record (made without ``record``, from an
        F0, or a tail was folded: more steps than the fold length)."""
        if not self.record or not self.ys:
            return None
        if w.shape[0] != len(self.ys):
            raise ValueError(f"replay of {len(self.ys)} steps got inputs of {w.shape[0]} steps")
        reset = None
        if any(x is not None for x in self.resets):
            reset = torch.stack(
                [torch.zeros(self.B, dtype=torch.bool, device=w.device) if x is None else x for x in self.resets]
            )
        return FwmReplay.apply(self.be, _c(w), _c(r), self.ys, self.saved, reset)

    def dense(self) -> Tensor:
        """The fast tensor now, ``[B, H, m, m, m]`` (materialised: O(L m³))."""
        return self.be.fwm_step_dense(self.state, self.B, self.H)


def supported(
    dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """None when the fused ``fwm`` runs these sizes, else why not (CUDA has no fwm kernel)."""
    if dims.dk != dims.dv:
        return f"fwm with {dims} (a fast tensor has one size m)"
    return kernel_supported("fwm", dims, dtype, device, limits)


def stepper(
    B: int, H: int, m: int, like: Tensor, F0: Tensor | None = None, backend: str = "auto", record: bool = False
) -> Stepper | None:
    """The incremental :class:`Stepper` on the built kernels, or None where it does not run
    (backend ``'reference'``, no kernels, a device or dtype the CPU kernel does not take: the
    caller then steps through the op)."""
    if backend == "reference" or like.device.type != "cpu" or like.dtype not in KERNEL_DTYPES:
        return None
    ext, _ = kernels.load()
    return None if ext is None else Stepper(ext, B, H, m, like, F0, record)


def dims_of(args: Sequence[Any], options: dict) -> Dims:
    """Sizes of one call ``(w, r, F0, reset)``: key and value size m (from F0)."""
    m = args[F0_ARG].shape[-1]
    return Dims(dk=m, dv=m)
