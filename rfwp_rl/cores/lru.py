"""``lru``: the deep Linear Recurrent Unit (Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu, De,
*Resurrecting Recurrent Neural Networks for Long Sequences*, ICML 2023; "LRU paper" below).

One LRU layer maps a sequence u_k of H features to y_k (H features) through N complex states::

    x_k = Λ x_{k-1} + γ ⊙ (B u_k)          # the paper's Eq. 1 without σ (§3.1), Λ diagonal (§3.2),
    y_k = Re(C x_k) + D ⊙ u_k              #   γ the normalisation of §3.4
    Λ = diag(exp(-exp(ν_log) + i exp(θ_log)))      # the exponential parametrisation (§3.3)
    γ = exp(γ_log), γ_log initialised to log sqrt(1 - |λ|²)   (§3.4)

with B ``[N, H]`` and C ``[H, N]`` complex, D ``[H]`` real. Initialisation as the paper's App. A:
λ uniform on the ring r_min <= |λ| <= r_max with phase in [0, max_phase] (Lemma 3.2: ν =
-½ log(u₁ (r_max² - r_min²) + r_min²), θ = max_phase u₂ with u₁, u₂ uniform in [0, 1]); the real
and imaginary parts of B drawn N(0, 1/(2H)) and of C N(0, 1/N) (Glorot, halved for B since the
output keeps only the real part); D drawn N(0, 1). The defaults r_min = 0, r_max = 1,
max_phase = 6.28 are those of App. A's ``init_lru_parameters``.

The deep model (the paper's Fig. 1 and App. D, which follow S4/S5: norm, recurrence, GELU, GLU, skip)::

    x [T, B, input_size] -> Linear(input_size -> H)                       # linear encoder
    num_layers x [ h = h + drop(GLU(drop(GELU(LRU(LN(h)))))) ]           # GLU(z) = (W₁z + b₁) ⊙ σ(W₂z + b₂)
    -> y [T, B, H]                                                        # no final norm

Of the paper's two normalisations this core uses pre-LayerNorm: BatchNorm's statistics over the
batch and the unroll would make a step depend on other episodes and on later steps, which acting
one step at a time cannot have.

Over an unroll the recurrence runs as one log-depth parallel scan with a constant decay Λ
(:func:`rfwp_rl.ops.diagonal_scan.diagonal_scan`, the paper's §3.1 parallel scan); one step
(T == 1, acting) is the plain update x = Λ x + γ ⊙ (B u).

State of each layer (batch dim 0; one tensor per layer): x as the real view of its N complex
entries, ``[B, N, 2]`` (real part, imaginary part).
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
    check_bool,
    check_dropout,
    check_positive_float,
    check_positive_int,
)
from rfwp_rl.errors import UserError
from rfwp_rl.ops.common import zero_entries
from rfwp_rl.ops.diagonal_scan import diagonal_scan

SPEC = CoreSpec(
    name="lru",
    description="Linear Recurrent Unit: stacked complex diagonal linear recurrences, each followed by GELU and a GLU",
    equations="LRU paper (ICML 2023): Eq. 1 without σ, §3.2-3.4 (Λ = diag(exp(-exp(ν_log) + i exp(θ_log))), "
    "γ = sqrt(1 - |λ|²)), Lemma 3.2 (ring init), App. A; deep model Fig. 1, App. D",
    defaults={
        "hidden_size": 128,
        "state_size": 128,
        "num_layers": 2,
        "r_min": 0.0,
        "r_max": 1.0,
        "max_phase": 6.28,
        "dropout": 0.0,
        "detach_state_every_step": False,
    },
)


def check_ring(r_min: Any, r_max: Any) -> tuple[float, float]:
    """The radii of the initial eigenvalues' ring: ``0 <= r_min < r_max <= 1``."""
    ok = all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in (r_min, r_max))
    if not ok or not 0.0 <= r_min < r_max <= 1.0:
        raise UserError(
            f"r_min {r_min!r}, r_max {r_max!r} are invalid; allowed: 0 <= r_min < r_max <= 1 "
            "(the ring of |λ| at initialisation)"
        )
    return float(r_min), float(r_max)


def _uniform_open(n: int) -> Tensor:
    """n draws uniform in (0, 1) (float64): a zero would make ν or θ_log infinite."""
    return torch.rand(n, dtype=torch.float64).clamp_(min=torch.finfo(torch.float64).tiny)


class LRULayer(nn.Module):
    """One Linear Recurrent Unit (module docstring): u ``[T, B, H]`` -> y ``[T, B, H]``.

    Parameters: ``nu_log``, ``theta_log``, ``gamma_log`` ``[N]``; ``B_re``, ``B_im`` ``[N, H]``;
    ``C_re``, ``C_im`` ``[H, N]``; ``D`` ``[H]``. State: x ``[B, N, 2]`` (real view).
    """

    def __init__(self, hidden_size: int, state_size: int, r_min: float, r_max: float, max_phase: float) -> None:
        super().__init__()
        H, N = hidden_size, state_size
        self.H, self.N = H, N
        dtype = torch.get_default_dtype()
        # Lemma 3.2 / App. A: |λ|² uniform in [r_min², r_max²], phase uniform in [0, max_phase]
        nu = -0.5 * torch.log(_uniform_open(N) * (r_max**2 - r_min**2) + r_min**2)
        theta = max_phase * _uniform_open(N)
        self.nu_log = nn.Parameter(torch.log(nu).to(dtype))
        self.theta_log = nn.Parameter(torch.log(theta).to(dtype))
        # §3.4: γ = sqrt(1 - |λ|²) with |λ|² = exp(-2ν) (expm1 keeps |λ| near 1 exact)
        self.gamma_log = nn.Parameter((0.5 * torch.log(-torch.expm1(-2.0 * nu))).to(dtype))
        # App. A: Glorot-style complex B (halved variance: only Re(C x) is read out) and C, D ~ N(0, 1)
        self.B_re = nn.Parameter(torch.randn(N, H) / math.sqrt(2 * H))
        self.B_im = nn.Parameter(torch.randn(N, H) / math.sqrt(2 * H))
        self.C_re = nn.Parameter(torch.randn(H, N) / math.sqrt(N))
        self.C_im = nn.Parameter(torch.randn(H, N) / math.sqrt(N))
        self.D = nn.Parameter(torch.randn(H))

    def eigenvalues(self) -> Tensor:
        """Λ's diagonal, ``exp(-exp(ν_log) + i exp(θ_log))`` (§3.3), complex ``[N]``."""
        magnitude = torch.exp(-torch.exp(self.nu_log))
        phase = torch.exp(self.theta_log)
        return torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))

    def forward(self, u: Tensor, state: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
        """u ``[T, B, H]``, state ``[B, N, 2]``, reset ``[T, B]`` or None -> y ``[T, B, H]``,
        the state after the last step ``[B, N, 2]``."""
        T, B, _ = u.shape
        N = self.N
        # γ ⊙ (B u) as one real matmul: rows (Re, Im) of every state entry, scaled by γ (§3.4)
        w_in = torch.stack([self.B_re, self.B_im], dim=1) * torch.exp(self.gamma_log)[:, None, None]
        bu = torch.view_as_complex(F.linear(u, w_in.reshape(2 * N, self.H)).view(T, B, N, 2))
        lam = self.eigenvalues()
        x0 = torch.complex(state[..., 0], state[..., 1])
        if T == 1:  # acting: the plain step x = Λ x + γ ⊙ (B u)
            if reset is not None:
                x0 = zero_entries(x0, reset[0])
            x = (lam * x0 + bu[0]).unsqueeze(0)
        else:  # x_k = Λ x_{k-1} + γ ⊙ (B u_k) for every k at once (parallel scan)
            x, _ = diagonal_scan(lam.view(1, 1, N), bu, x0, reset)
        # y = Re(C x) + D ⊙ u: Re(C x) = C_re Re(x) - C_im Im(x), one real matmul on the real view
        w_out = torch.stack([self.C_re, -self.C_im], dim=-1).reshape(self.H, 2 * N)
        x_real = torch.view_as_real(x)  # [T, B, N, 2]
        y = F.linear(x_real.reshape(T, B, 2 * N), w_out) + self.D * u
        return y, x_real[-1]


class LRUBlock(nn.Module):
    """Pre-LayerNorm residual LRU block: ``h + drop(GLU(drop(GELU(LRU(LN(h))))))`` with
    ``GLU(z) = (W₁ z + b₁) ⊙ σ(W₂ z + b₂)`` (the deep model of the LRU paper's Fig. 1, App. D).

    h ``[T, B, H]`` -> ``[T, B, H]``; state ``[B, N, 2]``.
    """

    def __init__(
        self, hidden_size: int, state_size: int, r_min: float, r_max: float, max_phase: float, dropout: float
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.lru = LRULayer(hidden_size, state_size, r_min, r_max, max_phase)
        self.glu = nn.Linear(hidden_size, 2 * hidden_size)  # [W₁; W₂], the halves F.glu splits
        self.drop = nn.Dropout(dropout)

    def forward(self, h: Tensor, state: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
        y, state = self.lru(self.norm(h), state, reset)
        y = self.drop(F.gelu(y))
        return h + self.drop(F.glu(self.glu(y), dim=-1)), state


class LRUCore(Core):
    """``lru``: the deep LRU (module docstring). x ``[T, B, input_size]`` -> y ``[T, B, hidden_size]``.

    Config: ``hidden_size`` (H, the model width), ``state_size`` (N, complex states per layer),
    ``num_layers``, ``r_min``/``r_max``/``max_phase`` (the ring initialisation of Λ, Lemma 3.2),
    ``dropout`` (after GELU and after the GLU), ``detach_state_every_step``.
    State: one ``[B, N, 2]`` tensor per layer (real view of x).
    """

    name = "lru"

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        state_size: int = 128,
        num_layers: int = 2,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 6.28,
        dropout: float = 0.0,
        detach_state_every_step: bool = False,
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = check_positive_int("hidden_size", hidden_size)
        self.state_size = check_positive_int("state_size", state_size)
        check_positive_int("num_layers", num_layers)
        r_min, r_max = check_ring(r_min, r_max)
        max_phase = check_positive_float("max_phase", max_phase)
        dropout = check_dropout(dropout)
        self.detach_state_every_step = check_bool("detach_state_every_step", detach_state_every_step)
        self.config = {
            "hidden_size": hidden_size,
            "state_size": state_size,
            "num_layers": num_layers,
            "r_min": r_min,
            "r_max": r_max,
            "max_phase": max_phase,
            "dropout": dropout,
            "detach_state_every_step": detach_state_every_step,
        }
        self.input_proj = nn.Linear(input_size, hidden_size)  # the deep model's linear encoder
        self.layers = nn.ModuleList(
            LRUBlock(hidden_size, state_size, r_min, r_max, max_phase, dropout) for _ in range(num_layers)
        )

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.state_size, 2)] * len(self.layers)

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        h = self.input_proj(x)
        new_state = []
        for layer, s in zip(self.layers, state):
            h, s = layer(h, s, reset)
            new_state.append(s)
        return h, tuple(new_state)
