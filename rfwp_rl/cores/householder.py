"""The delta-rule cores whose state transition is a product of Householder matrices:
``gated_delta`` (Gated DeltaNet) and ``delta_product`` (DeltaProduct), one token mixer
(:class:`HouseholderSublayer`) and one fused kernel (``csrc/cuda/householder_product.cu``).

They are the block stacks of :class:`rfwp_rl.cores.fast_weight.FastWeightCore` (input
projection, then per layer a pre-LayerNorm residual token-mixing sublayer and a pre-LayerNorm
residual feed-forward sublayer) with these sublayers (per head of size d = hidden/H):

- ``gated_delta`` (Yang, Kautz, Hatamizadeh, *Gated Delta Networks: Improving Mamba2 with
  Delta Rule*, ICLR 2025): the token mixer of the paper's §3.4. q, k, v by a linear
  projection, an optional causal depthwise short convolution (``conv_size``, 0: none) and
  SiLU; q, k L2-normalised; β = σ(w_β·x); the decay
  ``α = exp(-exp(A_log) softplus(w_α·x + dt_bias))`` in (0, 1) (Mamba2's parametrisation with
  a learned per-head rate exp(A_log), as in the authors' code); the gated delta rule (Eq. 10,
  the ``gated_delta`` op); the output RMS-normalised per head and, with ``output_gate``, gated
  by SiLU(W_g x); then the output projection.
- ``delta_product`` (Siems et al., *DeltaProduct: Improving State-Tracking in Linear RNNs via
  Householder Products*, NeurIPS 2025): the same token mixer without the decay, with
  ``num_householder`` = n_h keys, values and β per input, written one after another (the
  ``delta_product`` op: n_h Householder steps per input); β = σ(·), or 2σ(·) in (0, 2) with
  ``allow_negative_eigenvalues`` (the state transition's eigenvalues 1 - β then reach (-1, 1)).

State of each layer (batch dim 0; concatenated over layers): ``S [B, H, d, d]``, then, with a
short convolution, ``conv [B, conv_size - 1, C]`` (the last conv_size - 1 inputs of the
convolution, C = (1 + 2 n_h) hidden channels of q, k, v; zero before the episode's first step).
Note that the recurrence of ``delta_product`` makes n_h Householder steps per input, so S after
an input has seen all n_h writes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfwp_rl import ops
from rfwp_rl.cores.base import CoreSpec, State, check_bool, check_heads, check_positive_int
from rfwp_rl.cores.fast_weight import FastWeightCore, block_defaults
from rfwp_rl.errors import UserError
from rfwp_rl.ops.common import unit_vectors

RMS_EPS = 1e-5
"""Epsilon of the per-head RMS normalisation of the Gated DeltaNet / DeltaProduct output."""


SPECS = {
    "gated_delta": CoreSpec(
        "gated_delta",
        "Gated DeltaNet: the delta rule with a data-dependent decay α_t, short convolution and output gate optional",
        "Gated DeltaNet paper (ICLR 2025) Eq. 10, §3.4",
        block_defaults(conv_size=4, output_gate=True),
    ),
    "delta_product": CoreSpec(
        "delta_product",
        "DeltaProduct: n_h delta-rule (Householder) steps per input, β in (0, 2) optional",
        "DeltaProduct paper (NeurIPS 2025) Sec. 3",
        block_defaults(num_householder=2, allow_negative_eigenvalues=False, conv_size=4, output_gate=True),
    ),
}


def check_conv_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value == 1:
        raise UserError(f"conv_size {value!r} is invalid; allowed: 0 (no short convolution) or an integer >= 2")
    return value


# ------------------------------------------------------------------------- pieces


def short_conv(x: Tensor, state: Tensor, weight: Tensor, reset: Tensor | None) -> tuple[Tensor, Tensor]:
    """Causal depthwise convolution over time, carried across calls, restarted by resets.

    ``y_t[c] = Σ_{j<K} weight[c, K-1-j] x_{t-j}[c]`` (PyTorch's Conv1d orientation), where
    inputs before the call come from ``state`` and inputs before a reset of the entry count
    as zero.

    Args:
        x: ``[T, B, C]``; state: ``[B, K-1, C]`` the K-1 inputs before step 0 (oldest first);
        weight: ``[C, K]``; reset: ``[T, B]`` bool or None.
    Returns:
        y ``[T, B, C]`` and the new state ``[B, K-1, C]``.
    """
    T, B, _ = x.shape
    K = weight.shape[1]
    full = torch.cat([state.transpose(0, 1), x], dim=0)  # full[i] is the input of step i-(K-1)
    t = torch.arange(T, device=x.device)[:, None]
    start = None
    if reset is not None:  # the step of each entry's latest reset (-K: none in this call)
        start = torch.where(reset, t, torch.full_like(t, -K)).cummax(dim=0).values
    y = torch.zeros_like(x)
    for j in range(K):
        xs = full[K - 1 - j : K - 1 - j + T]  # the inputs of steps t - j
        if start is not None:
            xs = torch.where((t - j >= start)[..., None], xs, torch.zeros((), dtype=x.dtype, device=x.device))
        y = y + xs * weight[:, K - 1 - j]
    new_state = full[T:]  # the inputs of steps T-K+1 .. T-1
    if start is not None:
        steps = torch.arange(T - K + 1, T, device=x.device)[:, None]
        new_state = torch.where(
            (steps >= start[-1])[..., None], new_state, torch.zeros((), dtype=x.dtype, device=x.device)
        )
    return y, new_state.transpose(0, 1)


class HeadRMSNorm(nn.Module):
    """RMS normalisation over the last dimension with a learned gain (torch < 2.4 has no
    nn.RMSNorm): ``x / sqrt(mean(x²) + eps) * weight``. ``[..., d] -> [..., d]``."""

    def __init__(self, d: int, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


# ------------------------------------------------------------------------- sublayers


class HouseholderSublayer(nn.Module):
    """Pre-LayerNorm residual token mixer of Gated DeltaNet (its §3.4) and DeltaProduct,
    see the module docstring; subclasses set ``kind`` (the op) and implement
    ``recurrence``.

    One bias-free projection of LN(x) gives, per step, q (hidden), n_h keys and n_h values
    (n_h hidden each), n_h β per head, one decay input per head (``decay``) and the output
    gate (hidden, ``output_gate``). x ``[T, B, hidden]`` -> ``[T, B, hidden]``.
    """

    kind: str = ""
    decay: bool = False

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        conv_size: int,
        output_gate: bool,
        backend: str,
        num_householder: int = 1,
        beta_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.H, self.d, self.n = num_heads, check_heads(hidden_size, num_heads), num_householder
        self.hidden = hidden_size
        self.K = check_conv_size(conv_size)
        self.output_gate = check_bool("output_gate", output_gate)
        self.beta_scale = beta_scale
        self.C = (1 + 2 * self.n) * hidden_size  # q, keys, values: the conv channels
        self.sizes = [self.C, self.n * num_heads, num_heads if self.decay else 0, hidden_size if output_gate else 0]
        self.norm = nn.LayerNorm(hidden_size)
        self.proj = nn.Linear(hidden_size, sum(self.sizes), bias=False)
        # depthwise: one kernel of K taps per channel (Conv1d's default initialisation)
        self.conv = nn.Conv1d(self.C, self.C, self.K, groups=self.C, bias=False) if self.K else None
        self.out_norm = HeadRMSNorm(self.d)
        self.out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.drop = nn.Dropout(dropout)
        self.op = ops.resolve(self.kind, backend, ops.Dims(dk=self.d, dv=self.d))

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        shapes = [(batch_size, self.H, self.d, self.d)]
        if self.K:
            shapes.append((batch_size, self.K - 1, self.C))
        return shapes

    def recurrence(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, a: Tensor, S0: Tensor, reset: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """q ``[T, B, H, d]``, k, v ``[T, B, H, n_h, d]``, beta ``[T, B, H, n_h]``, decay inputs
        a ``[T, B, H]`` (empty without decay) -> o ``[T, B, H, d]``, S."""
        raise NotImplementedError

    def forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        H, d, n = self.H, self.d, self.n
        qkv, b, a, g = self.proj(self.norm(x)).split(self.sizes, dim=-1)
        new_conv: tuple[Tensor, ...] = ()
        if self.conv is not None:  # Gated DeltaNet §3.4: short conv
            qkv, conv_state = short_conv(qkv, state[1], self.conv.weight[:, 0], reset)
            new_conv = (conv_state,)
        q, k, v = F.silu(qkv).split([self.hidden, n * self.hidden, n * self.hidden], dim=-1)
        q = unit_vectors(q.view(T, B, H, d))  # ... SiLU, L2-normalised q and k
        k = unit_vectors(k.view(T, B, H, n, d))
        beta = self.beta_scale * torch.sigmoid(b.view(T, B, H, n))
        o, S = self.recurrence(q, k, v.view(T, B, H, n, d), beta, a, state[0], reset)
        o = self.out_norm(o)  # output normalisation ...
        if self.output_gate:  # ... and gating (§3.4)
            o = o * F.silu(g.view(T, B, H, d))
        return x + self.drop(self.out(o.reshape(T, B, self.hidden))), (S, *new_conv)


class GatedDeltaSublayer(HouseholderSublayer):
    """Gated DeltaNet token mixer (Gated DeltaNet paper §3.4 with Eq. 10).

    Per head a learned rate exp(A_log) and bias dt_bias, initialised as Mamba2's (the
    authors' code): A uniform in (0, 16), softplus(dt_bias) log-uniform in [0.001, 0.1].
    """

    kind = "gated_delta"
    decay = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        _feature_map: str,
        _dpfp_nu: int,
        backend: str,
        *,
        conv_size: int = 4,
        output_gate: bool = True,
    ) -> None:
        super().__init__(hidden_size, num_heads, dropout, conv_size, output_gate, backend)
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(0, 16).log())
        dt = torch.exp(torch.empty(num_heads).uniform_(math.log(1e-3), math.log(1e-1)))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)

    def recurrence(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, a: Tensor, S0: Tensor, reset: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        alpha = torch.exp(-self.A_log.exp() * F.softplus(a + self.dt_bias))  # α_t in (0, 1)
        return self.op(q, k[..., 0, :], v[..., 0, :], alpha, beta[..., 0], S0, reset)


class DeltaProductSublayer(HouseholderSublayer):
    """DeltaProduct token mixer (DeltaProduct paper Sec. 3): n_h = ``num_householder``
    Householder steps per input."""

    kind = "delta_product"

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        _feature_map: str,
        _dpfp_nu: int,
        backend: str,
        *,
        num_householder: int = 2,
        allow_negative_eigenvalues: bool = False,
        conv_size: int = 4,
        output_gate: bool = True,
    ) -> None:
        negative = check_bool("allow_negative_eigenvalues", allow_negative_eigenvalues)
        super().__init__(
            hidden_size,
            num_heads,
            dropout,
            conv_size,
            output_gate,
            backend,
            num_householder=check_positive_int("num_householder", num_householder),
            beta_scale=2.0 if negative else 1.0,
        )  # β in (0, 2): eigenvalues in (-1, 1)

    def recurrence(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, a: Tensor, S0: Tensor, reset: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        return self.op(q, k, v, beta, S0, reset)


# ------------------------------------------------------------------------- the cores


class GatedDeltaCore(FastWeightCore):
    """``gated_delta``: Gated DeltaNet block stack (Gated DeltaNet paper Eq. 10, §3.4)."""

    kind = "gated_delta"
    sublayer_cls = GatedDeltaSublayer

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
        conv_size: int = 4,
        output_gate: bool = True,
        backend: str = "auto",
        detach_state_every_step: bool = False,
    ) -> None:
        # q and k are L2-normalised: no feature map ("softmax" only fills the base's slot)
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            num_heads,
            ff_size,
            dropout,
            "softmax",
            1,
            backend,
            detach_state_every_step,
            sublayer_config={"conv_size": conv_size, "output_gate": output_gate},
        )
        self.keep_config(SPECS[self.kind].defaults)


class DeltaProductCore(FastWeightCore):
    """``delta_product``: DeltaProduct block stack (DeltaProduct paper Sec. 3)."""

    kind = "delta_product"
    sublayer_cls = DeltaProductSublayer

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
        num_householder: int = 2,
        allow_negative_eigenvalues: bool = False,
        conv_size: int = 4,
        output_gate: bool = True,
        backend: str = "auto",
        detach_state_every_step: bool = False,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            num_heads,
            ff_size,
            dropout,
            "softmax",
            1,
            backend,
            detach_state_every_step,
            sublayer_config={
                "num_householder": num_householder,
                "allow_negative_eigenvalues": allow_negative_eigenvalues,
                "conv_size": conv_size,
                "output_gate": output_gate,
            },
        )
        self.keep_config(SPECS[self.kind].defaults)


CORES = {"gated_delta": GatedDeltaCore, "delta_product": DeltaProductCore}
