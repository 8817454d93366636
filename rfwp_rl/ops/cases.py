"""Random inputs for the fast-weight ops and comparisons with the reference (tests, the
self-check, benchmarks).

Inputs look like what the cores hand the ops: keys/queries already positive and summing to
one (as after softmax or a sum-normalised feature map), β in (0, 1), non-zero initial states.
Each op says which inputs it takes (``OpSpec.example_inputs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


class Rand:
    """Draws float64 tensors from one seeded generator (CPU, so that every device and dtype
    gets the same numbers)."""

    def __init__(self, seed: int, state_scale: float = 0.5) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.state_scale = state_scale

    def normal(self, *shape: int, scale: float = 1.0) -> Tensor:
        """N(0, scale²) of ``shape``."""
        return torch.randn(*shape, generator=self.g, dtype=torch.float64) * scale

    def fm(self, *shape: int) -> Tensor:
        """Positive, summing to one over the last dimension (a feature-mapped key)."""
        return torch.softmax(self.normal(*shape), -1)

    def sig(self, *shape: int) -> Tensor:
        """In (0, 1) (a write strength β)."""
        return torch.sigmoid(self.normal(*shape))

    def state(self, *shape: int) -> Tensor:
        """A non-zero initial fast-weight state."""
        return self.normal(*shape, scale=self.state_scale)


def _spec(name: str):
    from rfwp_rl import ops  # the registry, here: ops imports this module (through ops.dispatch)

    return ops.spec(name)


def make_inputs(
    name: str,
    T: int,
    B: int,
    H: int,
    d: int,
    *,
    dk: int | None = None,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    reset_at: Sequence[tuple[int, int]] = (),
    device: str | torch.device = "cpu",
    state_scale: float = 0.5,
) -> tuple[list[Tensor], Tensor]:
    """(inputs of op ``name`` in signature order without ``reset``, reset ``[T, B]`` bool).

    ``dk`` is the key size of ops whose key size may differ from the head size (default d);
    ``reset_at`` lists (t, b) pairs where entry b resets before step t.
    """
    args = _spec(name).example_inputs(Rand(seed, state_scale), T, B, H, d, d if dk is None else dk)
    reset = torch.zeros(T, B, dtype=torch.bool)
    for t, b in reset_at:
        reset[t, b] = True
    return [a.to(dtype=dtype, device=device) for a in args], reset.to(device)


def forward_backward(
    fn: Callable,
    args: Sequence[Tensor],
    reset: Tensor | None,
    cotangents: Sequence[Tensor] | None = None,
    seed: int = 1,
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


def relative_error(xs: Sequence[Tensor], ys: Sequence[Tensor]) -> float:
    """max |x - y| over all pairs, divided by the largest |x| (1 if all are zero)."""
    scale = max(float(x.abs().max()) for x in xs) or 1.0
    return max(float((x - y.to(x)).abs().max()) for x, y in zip(xs, ys)) / scale


def max_errors(
    name: str,
    fn: Callable,
    args: Sequence[Tensor],
    reset: Tensor | None,
) -> tuple[float, float]:
    """(max |output difference|, max |gradient difference|) of ``fn`` against the reference,
    both scaled by the largest magnitude of the reference's outputs / gradients."""
    ref_out, ref_grad = forward_backward(_spec(name).naive, args, reset)
    out, grad = forward_backward(fn, args, reset, cotangents=None)
    return relative_error(ref_out, out), relative_error(ref_grad, grad)


def half_precision_errors(
    name: str,
    fn: Callable,
    halves: Sequence[Tensor],
    reset: Tensor | None,
) -> tuple[set[torch.dtype], float]:
    """``fn`` on float16/bfloat16 inputs against the reference run in float64 on the same
    (rounded) inputs: (the dtypes of ``fn``'s outputs and gradients, the largest
    ``|difference| / max(1, max |reference|)`` over them, in units of the inputs' epsilon)."""
    ref_out, ref_grad = forward_backward(_spec(name).naive, [h.double() for h in halves], reset)
    out, grad = forward_backward(fn, halves, reset)
    eps = torch.finfo(halves[0].dtype).eps
    worst = max(
        float((x - y.double()).abs().max()) / (eps * max(1.0, float(x.abs().max())))
        for x, y in zip(ref_out + ref_grad, out + grad)
    )
    return {y.dtype for y in out + grad}, worst
