"""The fused recurrences as ``torch.autograd.Function``s over a kernel backend.

A backend is an object with the functions of the C++ extension (``csrc/bindings.cpp``):
``lt_forward``/``lt_backward``, ``delta_*``, ``delta_rnn_*``, ``rdn_*`` (tensors in, new
tensors out). The built torch extension is one; :mod:`rfwp_rl.kernels.emulated` (the CUDA
sources run on the host, for tests) is another.

Each forward keeps the fast weights every ``chunk`` steps (checkpoints); the backward
recomputes the states inside one chunk at a time, so memory is O(T/chunk + chunk) fast-weight
matrices per (batch, head) instead of O(T) (the CPU ``lt`` backward reads only the first
checkpoint and rebuilds the states in place). Besides the inputs, the backward keeps O(T d)
vectors: delta_rnn its recurrent queries softmax(y_{t-1}); rdn the activated q, k, v, β and
tanh(y_{t-1}). Backward passes are once-differentiable.

Signatures and shapes are those of :mod:`rfwp_rl.ops.reference` (see :mod:`rfwp_rl.ops`),
with the backend and the checkpoint interval first.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable


def _c(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.contiguous()


def _reset(reset: Tensor | None) -> Tensor | None:
    if reset is None:
        return None
    return reset.to(torch.bool).contiguous()


def _needs_grad(chunk: int, *tensors: Tensor) -> bool:
    """Whether autograd will want gradients: if not (inference, actors), the forward runs
    without checkpoints (chunk 0) and without an autograd node."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return False
    if chunk < 1:
        raise ValueError(f"checkpoint interval must be >= 1 when gradients are needed, got {chunk}")
    return True


class _Lt(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor,
                W0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
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


class _Delta(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor,
                beta: Tensor, W0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
        y, W, ckpt = be.delta_forward(q, k, v, beta, W0, reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, beta, reset, ckpt)
        return y, W

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor) -> tuple:
        q, k, v, beta, reset, ckpt = ctx.saved_tensors
        gq, gk, gv, gbeta, gW0 = ctx.be.delta_backward(q, k, v, beta, reset, ckpt, _c(gy), _c(gW),
                                                       ctx.chunk)
        return None, None, gq, gk, gv, gbeta, gW0, None


class _DeltaRnn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor,
                beta: Tensor, kr: Tensor, vr: Tensor, beta_r: Tensor, W0: Tensor, R0: Tensor,
                y0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        y, W, R, ckW, ckR, s = be.delta_rnn_forward(q, k, v, beta, kr, vr, beta_r, W0, R0, y0,
                                                    reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(q, k, v, beta, kr, vr, beta_r, s, reset, ckW, ckR)
        return y, W, R

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor, gR: Tensor) -> tuple:
        q, k, v, beta, kr, vr, beta_r, s, reset, ckW, ckR = ctx.saved_tensors
        grads = ctx.be.delta_rnn_backward(q, k, v, beta, kr, vr, beta_r, s, reset, ckW, ckR,
                                          _c(gy), _c(gW), _c(gR), ctx.chunk)
        return (None, None, *grads, None)


class _Rdn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, be: Any, chunk: int, xq: Tensor, xk: Tensor, xv: Tensor,
                xb: Tensor, Rq: Tensor, Rk: Tensor, Rv: Tensor, rb: Tensor, W0: Tensor,
                y0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
        y, W, ckpt, q, k, v, beta, h = be.rdn_forward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0,
                                                      reset, chunk)
        ctx.be, ctx.chunk = be, chunk
        ctx.save_for_backward(Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt)
        return y, W

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor, gW: Tensor) -> tuple:
        Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt = ctx.saved_tensors
        grads = ctx.be.rdn_backward(Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt, _c(gy),
                                    _c(gW), ctx.chunk)
        return (None, None, *grads, None)


def lt(be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, W0: Tensor,
       reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.reference.lt`: ``(y [T,B,H,dv], W_T [B,H,dv,dk])``."""
    if not _needs_grad(chunk, q, k, v, W0):
        return tuple(be.lt_forward(_c(q), _c(k), _c(v), _c(W0), _reset(reset), 0)[:2])
    return _Lt.apply(be, chunk, _c(q), _c(k), _c(v), _c(W0), _reset(reset))


def delta(be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor,
          reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.reference.delta`: ``(y [T,B,H,dv], W_T [B,H,dv,dk])``."""
    if not _needs_grad(chunk, q, k, v, beta, W0):
        return tuple(be.delta_forward(_c(q), _c(k), _c(v), _c(beta), _c(W0), _reset(reset), 0)[:2])
    return _Delta.apply(be, chunk, _c(q), _c(k), _c(v), _c(beta), _c(W0), _reset(reset))


def delta_rnn(be: Any, chunk: int, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, kr: Tensor,
              vr: Tensor, beta_r: Tensor, W0: Tensor, R0: Tensor, y0: Tensor,
              reset: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.reference.delta_rnn`: ``(y [T,B,H,d], W_T, R_T)``."""
    if not _needs_grad(chunk, q, k, v, beta, kr, vr, beta_r, W0, R0, y0):
        return tuple(be.delta_rnn_forward(_c(q), _c(k), _c(v), _c(beta), _c(kr), _c(vr), _c(beta_r),
                                          _c(W0), _c(R0), _c(y0), _reset(reset), 0)[:3])
    return _DeltaRnn.apply(be, chunk, _c(q), _c(k), _c(v), _c(beta), _c(kr), _c(vr), _c(beta_r),
                           _c(W0), _c(R0), _c(y0), _reset(reset))


def rdn(be: Any, chunk: int, xq: Tensor, xk: Tensor, xv: Tensor, xb: Tensor, Rq: Tensor,
        Rk: Tensor, Rv: Tensor, rb: Tensor, W0: Tensor, y0: Tensor,
        reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused :func:`rfwp_rl.ops.reference.rdn` with the softmax feature map: ``(y, W_T)``."""
    if not _needs_grad(chunk, xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0):
        return tuple(be.rdn_forward(_c(xq), _c(xk), _c(xv), _c(xb), _c(Rq), _c(Rk), _c(Rv), _c(rb),
                                    _c(W0), _c(y0), _reset(reset), 0)[:2])
    return _Rdn.apply(be, chunk, _c(xq), _c(xk), _c(xv), _c(xb), _c(Rq), _c(Rk), _c(Rv), _c(rb),
                      _c(W0), _c(y0), _reset(reset))


FUSED = {"lt": lt, "delta": delta, "delta_rnn": delta_rnn, "rdn": rdn}
