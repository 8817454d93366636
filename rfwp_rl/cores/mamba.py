"""``mamba``: a stack of Mamba blocks, the selective state-space model of Gu & Dao 2023, *Mamba:
Linear-Time Sequence Modeling with Selective State Spaces* (arXiv:2312.00752).

Structure (the paper's Sec. 3.4 and Fig. 3 block in the residual stack of the authors' language
model, ``x + Mamba(RMSNorm(x))`` per layer and a final RMSNorm)::

    x [T, B, input_size] -> Linear(input_size -> d_model, bias)
    num_layers x [ h = h + MambaMixer(RMSNorm(h)) ]          # pre-norm residual
    -> RMSNorm -> y [T, B, d_model]

One mixer (d_inner = expand * d_model, N = state_size, R = dt_rank, K = conv_size)::

    x, z = in_proj(h)                              # [T, B, d_inner] each, no bias
    x = SiLU(causal depthwise conv_K(x) + bias)    # short convolution over time, per channel
    Δ, B, C = split(x_proj(x))                     # [R], [N], [N] per step: Algorithm 2 lines 2-4
    Δ = softplus(dt_proj(Δ))                       # τ_Δ(Parameter + s_Δ(x)), s_Δ of rank R
    A = -exp(A_log)                                # [d_inner, N], negative real
    h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t       # Eq. 2a with Ā by ZOH (Eq. 4), B̄ = ΔB
    y_t = C_t · h_t + D ⊙ x_t                      # Eq. 2b plus the D skip
    out = out_proj(y ⊙ SiLU(z))                    # [T, B, d_model], no bias

Discretisation: Ā = exp(ΔA) is the zero-order hold of Eq. 4; B̄ = ΔB is the simplified (Euler)
form the authors' code uses instead of Eq. 4's (ΔA)⁻¹(exp(ΔA) - I)ΔB (the two agree to first
order in Δ). Initialisation as the authors' code: A S4D-real (A[d, n] = -(n + 1), Sec. 3.6),
D = 1, Δ's bias the inverse softplus of Δ log-uniform in [dt_min, dt_max] (floored at
DT_FLOOR), dt_proj's weight uniform in ±R^-1/2, the conv as torch's Conv1d, out_proj's weight
divided by sqrt(num_layers) (the authors' rescaling of residual branches).

State of each layer (batch dim 0; concatenated over layers): ``h [B, d_inner, N]``, then, with
a convolution, ``conv [B, K - 1, d_inner]`` (the convolution's last K - 1 inputs, oldest first,
as :func:`rfwp_rl.cores.householder.short_conv` carries them). A reset zeroes both, so one call
on T steps equals T calls of one step. The recurrence over an unroll (the op ``mamba`` of
:mod:`rfwp_rl.ops`): on the CPU and on CUDA the fused kernel (``backend`` auto or kernel; it
keeps no per-step states, recomputing them from chunk checkpoints in the backward pass),
elsewhere (or with backend reference, or auto where the CUDA kernel is unavailable) the
PyTorch form :func:`rfwp_rl.ops.mamba.selective_scan`:
``chunk_size`` steps per chunk recomputed in the backward pass (0: none), ``scan`` the loop
or the parallel scan inside a chunk.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfwp_rl.cores.base import (
    Core,
    CoreSpec,
    State,
    check_backend,
    check_bool,
    check_non_negative_int,
    check_positive_int,
)
from rfwp_rl.cores.householder import HeadRMSNorm, check_conv_size, short_conv
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.ops.mamba import layer, selective_scan

DT_FLOOR = 1e-4
"""The floor of the initial step sizes Δ (the authors' default)."""

SCANS = ("loop", "parallel")

SPEC = CoreSpec(
    name="mamba",
    description="Mamba: selective SSM blocks (input-dependent Δ, B, C; short conv; SiLU gate), pre-RMSNorm residual",
    equations="Mamba paper (Gu & Dao 2023) Eq. 2a-2b with Eq. 4 (ZOH Ā; B̄ = ΔB), Algorithm 2, Sec. 3.4 block",
    defaults={
        "hidden_size": 128,
        "num_layers": 2,
        "state_size": 16,
        "expand": 2,
        "conv_size": 4,
        "dt_rank": 0,
        "dt_min": 1e-3,
        "dt_max": 1e-1,
        "chunk_size": 0,
        "scan": "loop",
        "backend": "auto",
        "detach_state_every_step": False,
    },
)


def check_dt_range(dt_min: Any, dt_max: Any) -> tuple[float, float]:
    """The range of the initial step sizes Δ: ``0 < dt_min <= dt_max``."""
    ok = all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in (dt_min, dt_max))
    if not ok or not 0.0 < dt_min <= dt_max < float("inf"):
        raise UserError(
            f"dt_min {dt_min!r}, dt_max {dt_max!r} are invalid; allowed: 0 < dt_min <= dt_max "
            "(the range of the initial step sizes Δ)"
        )
    return float(dt_min), float(dt_max)


def inverse_softplus(x: Tensor) -> Tensor:
    """``softplus⁻¹(x) = x + log(1 - exp(-x))`` for x > 0."""
    return x + torch.log(-torch.expm1(-x))


class MambaMixer(nn.Module):
    """The Mamba block of the paper's Sec. 3.4 (Fig. 3) with the selective SSM (S6) of
    Algorithm 2; see the module docstring. x ``[T, B, d_model]`` -> ``[T, B, d_model]``."""

    def __init__(
        self,
        d_model: int,
        state_size: int,
        expand: int,
        conv_size: int,
        dt_rank: int,
        dt_range: tuple[float, float],
        num_layers: int,
        chunk_size: int,
        parallel: bool,
        backend: str,
    ) -> None:
        super().__init__()
        self.d_inner = expand * d_model
        self.N, self.R, self.K = state_size, dt_rank, conv_size
        self.chunk_size, self.parallel, self.backend = chunk_size, parallel, backend
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=False)
        # depthwise: one kernel of K taps and a bias per channel (Conv1d's initialisation)
        self.conv = nn.Conv1d(self.d_inner, self.d_inner, conv_size, groups=self.d_inner) if conv_size else None
        self.x_proj = nn.Linear(self.d_inner, dt_rank + 2 * state_size, bias=False)  # s_Δ (rank R), s_B, s_C
        self.dt_proj = nn.Linear(dt_rank, self.d_inner)
        with torch.no_grad():  # Sec. 3.6 and the authors' code: Δ = softplus(bias) in [dt_min, dt_max] at init
            self.dt_proj.weight.uniform_(-(dt_rank**-0.5), dt_rank**-0.5)
            log_dt = torch.empty(self.d_inner).uniform_(math.log(dt_range[0]), math.log(dt_range[1]))
            self.dt_proj.bias.copy_(inverse_softplus(log_dt.exp().clamp(min=DT_FLOOR)))
        # S4D-real (Sec. 3.6): A[d, n] = -(n + 1), kept as log(-A) so that A stays negative
        self.A_log = nn.Parameter(
            torch.log(torch.arange(1, state_size + 1, dtype=torch.float32)).repeat(self.d_inner, 1)
        )
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        with torch.no_grad():  # the authors' rescaling of each residual branch's last projection
            self.out_proj.weight.div_(math.sqrt(num_layers))

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        shapes = [(batch_size, self.d_inner, self.N)]
        if self.conv is not None:
            shapes.append((batch_size, self.K - 1, self.d_inner))
        return shapes

    def forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        u, z = self.in_proj(x).split(self.d_inner, dim=-1)
        new_conv: tuple[Tensor, ...] = ()
        if self.conv is not None:  # Sec. 3.4: causal depthwise convolution, carried across calls
            u, conv_state = short_conv(u, state[1], self.conv.weight[:, 0], reset)
            u = u + self.conv.bias
            new_conv = (conv_state,)
        u = F.silu(u)
        dt, B, C = self.x_proj(u).split([self.R, self.N, self.N], dim=-1)  # Algorithm 2 lines 2-4
        delta = F.softplus(self.dt_proj(dt))  # Δ = τ_Δ(Parameter + s_Δ(x)), τ_Δ = softplus
        A = -torch.exp(self.A_log)  # Algorithm 2 line 1 (diagonal, negative)
        fused = layer(self.backend, u, self.N)  # Algorithm 2 lines 5-6: the fused kernel, or the PyTorch form
        if fused is not None:
            y, h = fused(u, delta, A, B, C, state[0], reset)
        else:
            y, h = selective_scan(u, delta, A, B, C, state[0], reset, self.chunk_size, self.parallel)
        y = y + self.D * u  # the D skip of the SSM's output (y_t = C_t h_t + D x_t)
        return self.out_proj(y * F.silu(z)), (h, *new_conv)  # Sec. 3.4: gate with SiLU(z)


class MambaCore(Core):
    """``mamba``: input projection, ``num_layers`` pre-RMSNorm residual Mamba blocks, final
    RMSNorm (Mamba paper Sec. 3.4, Eq. 2a-2b, 4, Algorithm 2). x ``[T, B, input_size]`` ->
    y ``[T, B, hidden_size]``. State: per layer ``h [B, d_inner, state_size]`` and, with
    ``conv_size`` > 0, ``conv [B, conv_size - 1, d_inner]`` (module docstring).

    ``dt_rank`` 0 means the paper's ceil(hidden_size / 16); the initial Δ is log-uniform in
    ``[dt_min, dt_max]`` (the authors' defaults).
    """

    name = "mamba"

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        state_size: int = 16,
        expand: int = 2,
        conv_size: int = 4,
        dt_rank: int = 0,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        chunk_size: int = 0,
        scan: str = "loop",
        backend: str = "auto",
        detach_state_every_step: bool = False,
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_layers", num_layers)
        check_positive_int("state_size", state_size)
        check_positive_int("expand", expand)
        check_conv_size(conv_size)
        check_non_negative_int("dt_rank", dt_rank, "ceil(hidden_size / 16)")
        dt_range = check_dt_range(dt_min, dt_max)
        check_non_negative_int("chunk_size", chunk_size, "the whole unroll, nothing recomputed")
        check_choice("scan", scan, SCANS)
        check_backend(backend)
        self.detach_state_every_step = check_bool("detach_state_every_step", detach_state_every_step)
        rank = dt_rank or math.ceil(hidden_size / 16)
        self.config = {
            "hidden_size": hidden_size,
            "num_layers": num_layers,
            "state_size": state_size,
            "expand": expand,
            "conv_size": conv_size,
            "dt_rank": dt_rank,
            "dt_min": dt_min,
            "dt_max": dt_max,
            "chunk_size": chunk_size,
            "scan": scan,
            "backend": backend,
            "detach_state_every_step": detach_state_every_step,
        }
        self.input_proj = nn.Linear(input_size, hidden_size)
        self.norms = nn.ModuleList(HeadRMSNorm(hidden_size) for _ in range(num_layers))
        self.mixers = nn.ModuleList(
            MambaMixer(
                hidden_size,
                state_size,
                expand,
                conv_size,
                rank,
                dt_range,
                num_layers,
                chunk_size,
                scan == "parallel",
                backend,
            )
            for _ in range(num_layers)
        )
        self.norm_f = HeadRMSNorm(hidden_size)
        self._n_state = len(self.mixers[0].state_shapes(1))

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [s for mixer in self.mixers for s in mixer.state_shapes(batch_size)]

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        h = self.input_proj(x)
        new_state: list[Tensor] = []
        n = self._n_state
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            y, s = mixer(norm(h), state[i * n : (i + 1) * n], reset)
            h = h + y  # pre-norm residual block
            new_state.extend(s)
        return self.norm_f(h), tuple(new_state)
