"""Random inputs for the fast-weight ops and reference comparisons (tests and benchmarks).

Inputs look like what the cores hand the ops: keys/queries already positive and summing to
one (as after softmax or a sum-normalised feature map), β in (0, 1), non-zero initial states.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from rfwp_rl.ops import reference

OPS = ("lt", "delta", "delta_rnn", "rdn")
# positions (in signature order, without reset) of the initial states and of the [T, ...] inputs
STATE_ARGS = {"lt": (3,), "delta": (4,), "delta_rnn": (7, 8, 9), "rdn": (8, 9)}
TIME_ARGS = {"lt": (0, 1, 2), "delta": (0, 1, 2, 3), "delta_rnn": (0, 1, 2, 3, 4, 5, 6),
             "rdn": (0, 1, 2, 3)}


def make_inputs(name: str, T: int, B: int, H: int, d: int, *, dk: int | None = None,
                dtype: torch.dtype = torch.float64, seed: int = 0,
                reset_at: Sequence[tuple[int, int]] = (), device: str | torch.device = "cpu",
                state_scale: float = 0.5) -> tuple[list[Tensor], Tensor]:
    """(inputs of op ``name`` in signature order without ``reset``, reset [T, B] bool).

    ``dk`` is the key size of lt/delta/delta_rnn (default d); ``reset_at`` lists (t, b)
    pairs where entry b resets before step t.
    """
    g = torch.Generator().manual_seed(seed)
    dk = d if dk is None else dk

    def r(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    def fm(*shape: int) -> Tensor:
        return torch.softmax(r(*shape), -1)

    def sig(*shape: int) -> Tensor:
        return torch.sigmoid(r(*shape))

    if name == "lt":
        args = [fm(T, B, H, dk), fm(T, B, H, dk), r(T, B, H, d), r(B, H, d, dk, scale=state_scale)]
    elif name == "delta":
        args = [fm(T, B, H, dk), fm(T, B, H, dk), r(T, B, H, d), sig(T, B, H),
                r(B, H, d, dk, scale=state_scale)]
    elif name == "delta_rnn":
        args = [fm(T, B, H, dk), fm(T, B, H, dk), r(T, B, H, d), sig(T, B, H), fm(T, B, H, d),
                r(T, B, H, d), sig(T, B, H), r(B, H, d, dk, scale=state_scale),
                r(B, H, d, d, scale=state_scale), r(B, H, d)]
    elif name == "rdn":
        s = d ** -0.5   # the cores' N(0, 1/d) initialisation of the recurrent slow weights
        args = [r(T, B, H, d), r(T, B, H, d), r(T, B, H, d), r(T, B, H), r(H, d, d, scale=s),
                r(H, d, d, scale=s), r(H, d, d, scale=s), r(H, d, scale=s),
                r(B, H, d, d, scale=state_scale), r(B, H, d)]
    else:
        raise ValueError(f"unknown op {name!r}")
    reset = torch.zeros(T, B, dtype=torch.bool)
    for t, b in reset_at:
        reset[t, b] = True
    return [a.to(dtype=dtype, device=device) for a in args], reset.to(device)


def forward_backward(fn: Callable, args: Sequence[Tensor], reset: Tensor | None,
                     cotangents: Sequence[Tensor] | None = None, seed: int = 1,
                     ) -> tuple[list[Tensor], list[Tensor]]:
    """Run ``fn(*args, reset)`` on leaf copies of ``args`` and backpropagate random (or the
    given) cotangents from every output. Returns (outputs, gradients of every input)."""
    leaves = [a.detach().clone().requires_grad_() for a in args]
    outs = fn(*leaves, reset)
    if cotangents is None:
        g = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o) for o in outs]
    torch.autograd.backward(outs, cotangents)
    return [o.detach() for o in outs], [x.grad for x in leaves]


def max_errors(name: str, fn: Callable, args: Sequence[Tensor], reset: Tensor | None,
               ) -> tuple[float, float]:
    """(max |output difference|, max |gradient difference|) of ``fn`` against the reference,
    both scaled by the largest magnitude of the reference's outputs / gradients."""
    ref_out, ref_grad = forward_backward(getattr(reference, name), args, reset)
    out, grad = forward_backward(fn, args, reset, cotangents=None)

    def rel(xs: list[Tensor], ys: list[Tensor]) -> float:
        scale = max(float(x.abs().max()) for x in xs) or 1.0
        return max(float((x - y.to(x)).abs().max()) for x, y in zip(xs, ys)) / scale

    return rel(ref_out, out), rel(ref_grad, grad)
