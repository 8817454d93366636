"""``ffm``: Fast and Forgetful Memory (Morad, Kortvelesy, Liwicki, Prorok, *Reinforcement Learning
with Fast and Forgetful Memory*, NeurIPS 2023), a stack of ``num_layers`` FFM cells.

One cell, per step t, from its input x_t (m = ``memory_size`` traces, c = ``context_size``
oscillations, h = ``hidden_size``; ℓ_i are linear layers with biases)::

    x̃_t = ℓ_1(x_t) ⊙ σ(ℓ_2(x_t))                              input gate (the cell), [m]
    S_t = γ ⊙ S_{t-1} + x̃_t 1_cᵀ,   S ∈ C^{m×c}                the aggregator
    γ_jk = exp(-|α_j| + i ω_k),   α ∈ R^m (decay), ω ∈ R^c (oscillation)
    z_t = ℓ_3(Flatten(Re S_t ‖ Im S_t))                          [h]
    y_t = LN(z_t) ⊙ σ(ℓ_4(x_t)) + ℓ_5(x_t) ⊙ (1 - σ(ℓ_4(x_t)))  output gate (the cell), [h]

Every entry of S is an exponentially decaying, rotating trace of one input channel: the j-th row
forgets at rate |α_j| (the paper's composite memory with decay), the k-th column turns at
frequency ω_k, so the relative time since an input is readable from its phase (the paper's
contextual drift). γ is the same at every step, so the states of a whole unroll are one diagonal
linear recurrence, computed as a log-depth parallel scan (:func:`rfwp_rl.ops.diagonal_scan`);
the paper computes it in closed form with powers of γ and a cumulative sum, the same numbers
without the overflow guard that form needs (it divides by γ^t). One step (acting) is the plain
recurrent step ``S = γ S + x̃``.

Choices, after the authors' code (github.com/proroklab/ffm, ``models/ffm_outer.py`` and
``aggregations.py``, the model of the paper's experiments; the standalone package is the same):

- ℓ_1, ℓ_2, ℓ_4, ℓ_5 are one linear layer of the input (PyTorch's default initialisation, as
  every ℓ_i); LN has no learned gain or bias.
- Initialisation of the decays and frequencies: |α| evenly spaced from ``FASTEST_DECAY`` (a
  trace halves in about a step) to the rate at which a trace falls to ``FORGOTTEN_AT`` (1%)
  after ``max_period`` steps; ω_k = 2π / P_k with periods P evenly spaced over
  [``min_period``, ``max_period``] (defaults 1 and 1024, the authors'). The authors clamp α <= 0;
  the paper's -|α| keeps every decay in (0, 1] the same way, and is what is used here.
- The defaults are the authors' POPGym configuration: ``hidden_size`` 256, m = 32 traces, c = 4
  (their code counts the real and imaginary parts: ``context_size = 8`` there), one cell.

State: per cell S as its real view ``[B, m, c, 2]`` (real and imaginary parts), zero at an
episode's start. The aggregator runs in at least float32 (complex64), whatever the dtype of its
inputs (bf16 autocast has no complex type).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from rfwp_rl.cores.base import Core, CoreSpec, State, check_bool, check_positive_int
from rfwp_rl.errors import UserError
from rfwp_rl.ops.diagonal_scan import diagonal_scan

FORGOTTEN_AT = 0.01
"""At initialisation the slowest trace has fallen to this fraction of an input after
``max_period`` steps (the authors' ``forgotten_at``)."""

FASTEST_DECAY = math.log(2.0) - 0.02
"""|α| of the fastest trace at initialisation (its decay exp(-|α|) is about 0.51 per step): the
authors' bound ``log(float64 max) / 1024 - 2 · 0.01`` (= ln 2 - 0.02), which kept their closed
form's γ^-t finite over 1024 steps; the scan needs no such bound, the value is kept for the
initialisation."""

SPEC = CoreSpec(
    name="ffm",
    description="Fast and Forgetful Memory: decaying, oscillating complex traces S [m, c] of a gated "
    "input, read through a linear layer, LayerNorm and an output gate",
    equations="FFM paper (NeurIPS 2023): the aggregator S_t = γ ⊙ S_{t-1} + x̃_t 1ᵀ with "
    "γ = exp(-|α| + iω), the cell's input gate, LayerNorm and output gate",
    defaults={
        "hidden_size": 256,
        "memory_size": 32,
        "context_size": 4,
        "num_layers": 1,
        "min_period": 1,
        "max_period": 1024,
        "detach_state_every_step": False,
    },
)


def check_periods(min_period: Any, max_period: Any) -> tuple[int, int]:
    """``min_period`` an integer >= 1, ``max_period`` an integer >= ``min_period``; one-line errors."""
    min_period = check_positive_int("min_period", min_period)
    if isinstance(max_period, bool) or not isinstance(max_period, int) or max_period < min_period:
        raise UserError(f"max_period {max_period!r} is invalid; allowed: an integer >= min_period ({min_period})")
    return min_period, max_period


def initial_decays(memory_size: int, max_period: int) -> Tensor:
    """|α| ``[m]`` at initialisation: evenly spaced from ``FASTEST_DECAY`` down to
    ``-ln(FORGOTTEN_AT) / max_period`` (the slowest trace keeps 1% of an input after
    ``max_period`` steps; never faster than the fastest)."""
    slowest = min(-math.log(FORGOTTEN_AT) / max_period, FASTEST_DECAY)
    return torch.linspace(FASTEST_DECAY, slowest, memory_size)


def initial_frequencies(context_size: int, min_period: int, max_period: int) -> Tensor:
    """ω ``[c]`` at initialisation: 2π / P for periods P evenly spaced over [min_period, max_period]."""
    return 2 * math.pi / torch.linspace(float(min_period), float(max_period), context_size)


def complex_dtype(*tensors: Tensor) -> torch.dtype:
    """complex128 if any of ``tensors`` is float64, else complex64 (float16/bfloat16 inputs
    are computed in complex64: there is no complex bfloat16)."""
    return torch.complex128 if any(t.dtype == torch.float64 for t in tensors) else torch.complex64


def aggregate(x: Tensor, gamma: Tensor, S0: Tensor, reset: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The FFM aggregator over an unroll: ``S_t = γ ⊙ S_{t-1} + x_t 1_cᵀ`` (the FFM paper's aggregator),
    ``S_{-1} = S0``; entry b's state is zeroed before step t where ``reset[t, b]``.

    x: ``[T, B, m]`` real (the gated input x̃); gamma: ``[m, c]`` complex; S0: ``[B, m, c]``
    complex; reset: ``[T, B]`` bool or None. Returns S ``[T, B, m, c]`` and the last state
    ``[B, m, c]``, complex. γ does not change with time: it broadcasts as the decay of
    :func:`rfwp_rl.ops.diagonal_scan` (one step is ``γ S0 + x``).
    """
    b = x.unsqueeze(-1).expand(*x.shape, gamma.shape[-1]).to(gamma.dtype)  # x̃_t 1_cᵀ
    return diagonal_scan(gamma[None, None], b, S0, reset)


class FFMCell(nn.Module):
    """One FFM cell (module docstring): x ``[T, B, input_size]``, S0 ``[B, m, c, 2]`` (real
    view) -> y ``[T, B, hidden_size]`` and the last S ``[B, m, c, 2]``."""

    def __init__(
        self, input_size: int, hidden_size: int, memory_size: int, context_size: int, min_period: int, max_period: int
    ) -> None:
        super().__init__()
        self.m, self.c, self.h = memory_size, context_size, hidden_size
        # [ℓ_1; ℓ_2; ℓ_4; ℓ_5]: aggregator input, input gate, output gate, skip path
        self.pre = nn.Linear(input_size, 2 * memory_size + 2 * hidden_size)
        self.alpha = nn.Parameter(initial_decays(memory_size, max_period))  # decay, γ = exp(-|α| + iω)
        self.omega = nn.Parameter(initial_frequencies(context_size, min_period, max_period))  # oscillation
        self.mix = nn.Linear(2 * memory_size * context_size, hidden_size)  # ℓ_3
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False)

    def gamma(self, dtype: torch.dtype = torch.complex64) -> Tensor:
        """γ ``[m, c]``: ``γ_jk = exp(-|α_j| + i ω_k)`` (the FFM paper's aggregator: decay
        and oscillation combined over every pair of a trace and a frequency)."""
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        alpha, omega = self.alpha.to(real), self.omega.to(real)
        return torch.exp(
            torch.complex(-alpha.abs()[:, None].expand(self.m, self.c), omega[None, :].expand(self.m, self.c))
        )

    def forward(self, x: Tensor, S0: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
        m, h = self.m, self.h
        pre, in_gate, out_gate, skip = self.pre(x).split([m, m, h, h], dim=-1)
        x_tilde = pre * torch.sigmoid(in_gate)  # x̃_t = ℓ_1(x_t) ⊙ σ(ℓ_2(x_t))
        dtype = complex_dtype(x_tilde, S0)
        gamma = self.gamma(dtype)
        S, S_last = aggregate(x_tilde, gamma, torch.complex(S0[..., 0], S0[..., 1]).to(dtype), reset)
        z = self.mix(torch.view_as_real(S).flatten(-3))  # z_t = ℓ_3(Flatten(Re S_t ‖ Im S_t))
        g = torch.sigmoid(out_gate)
        y = self.norm(z) * g + skip * (1 - g)  # y_t = LN(z_t) ⊙ σ(ℓ_4 x_t) + ℓ_5(x_t) ⊙ (1 - σ(ℓ_4 x_t))
        return y, torch.view_as_real(S_last).to(S0.dtype)


class FFMCore(Core):
    """``ffm``: ``num_layers`` FFM cells, each reading the previous one's output;
    x ``[T, B, input_size]`` -> y ``[T, B, hidden_size]``.

    State: one tensor per cell, S as its real view ``[B, memory_size, context_size, 2]``.
    """

    name = "ffm"

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 256,
        memory_size: int = 32,
        context_size: int = 4,
        num_layers: int = 1,
        min_period: int = 1,
        max_period: int = 1024,
        detach_state_every_step: bool = False,
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.memory_size = check_positive_int("memory_size", memory_size)
        self.context_size = check_positive_int("context_size", context_size)
        self.num_layers = check_positive_int("num_layers", num_layers)
        min_period, max_period = check_periods(min_period, max_period)
        self.detach_state_every_step = check_bool("detach_state_every_step", detach_state_every_step)
        self.config = {
            "hidden_size": hidden_size,
            "memory_size": memory_size,
            "context_size": context_size,
            "num_layers": num_layers,
            "min_period": min_period,
            "max_period": max_period,
            "detach_state_every_step": detach_state_every_step,
        }
        self.cells = nn.ModuleList(
            FFMCell(
                input_size if i == 0 else hidden_size, hidden_size, memory_size, context_size, min_period, max_period
            )
            for i in range(num_layers)
        )

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.memory_size, self.context_size, 2)] * self.num_layers

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        new_state = []
        for cell, S0 in zip(self.cells, state):
            x, S = cell(x, S0, reset)
            new_state.append(S)
        return x, tuple(new_state)


__all__ = ["SPEC", "FFMCell", "FFMCore", "aggregate", "initial_decays", "initial_frequencies"]
