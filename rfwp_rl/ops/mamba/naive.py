"""Plain PyTorch reference of the selective SSM: one step of the recurrence per loop iteration,
autograd does the backward pass (the reference of :mod:`.chunked`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import reset_steps, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def selective_scan(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor, reset: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The selective SSM of Mamba (Gu & Dao 2023, Eq. 2a-2b with the Δ, B, C of Algorithm 2),
    one step at a time, per channel d and state index n::

        Ā_t = exp(Δ_t[d] A[d, n])           # Eq. 4, zero-order hold
        B̄_t x_t = Δ_t[d] B_t[n] u_t[d]      # Euler step for B̄, as the authors' code
        h_t[d, n] = Ā_t h_{t-1}[d, n] + B̄_t x_t      # Eq. 2a
        y_t[d] = Σ_n C_t[n] h_t[d, n]                 # Eq. 2b (the D skip is the caller's)

    Args:
        u: ``[T, B, D]`` the SSM's input (after the block's convolution and SiLU).
        delta: ``[T, B, D]`` step sizes Δ (after softplus, > 0).
        A: ``[D, N]`` the continuous state matrix (diagonal per channel, negative).
        B, C: ``[T, B, N]`` input and output projections of each step.
        h0: ``[B, D, N]`` state before step 0.
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's state before step t.
    Returns:
        y ``[T, B, D]`` and ``h_T [B, D, N]``.
    """
    flags = reset_steps(reset, u.shape[0])
    h, ys = h0, []
    for t in range(u.shape[0]):
        if flags[t]:
            h = zero_entries(h, reset[t])
        decay = torch.exp(delta[t, :, :, None] * A)  # Eq. 4: Ā = exp(ΔA)
        h = decay * h + (delta[t] * u[t])[:, :, None] * B[t, :, None, :]  # Eq. 2a with B̄ = ΔB
        ys.append((h * C[t, :, None, :]).sum(-1))  # Eq. 2b: y = C h
    return torch.stack(ys), h


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Inputs as the core hands them, D = H d channels and N = dk states: u, B, C normal,
    Δ = softplus(normal) > 0, A = -exp(normal / 2) < 0, a non-zero h0."""
    D = H * d
    return [
        rand.normal(T, B, D),
        torch.nn.functional.softplus(rand.normal(T, B, D)),
        -torch.exp(rand.normal(D, dk, scale=0.5)),
        rand.normal(T, B, dk),
        rand.normal(T, B, dk),
        rand.state(B, D, dk),
    ]
