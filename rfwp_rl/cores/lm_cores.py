"""Language-modelling variants of the fast-weight cores: ``delta_lstm``, ``delta_mlp``,
``delta_delta`` (RFWP paper Sec. 3.1, App. A.2, A.3).

They are the same Transformer-like block stacks as ``lt``/``delta``
(:class:`rfwp_rl.cores.fast_weight.FastWeightCore`: input projection, then per layer a
pre-LayerNorm residual fast-weight sublayer and a pre-LayerNorm residual feed-forward
sublayer), with a different fast net inside the fast-weight sublayer. Every fast matrix is
written by the delta rule (RFWP Eq. 8-10) with its own slow-generated key, value and β; every
part whose writes do not depend on the recurrent output runs through the ``delta`` op of
:mod:`rfwp_rl.ops` (the fused kernel when available), several matrices at once as extra
heads. Notation per head: d = hidden/H, D = feature size of φ (d, or 2νd for dpfp).

- ``delta_lstm``, Delta LSTM version D (RFWP App. A.2, Eq. 36-40): six fast matrices
  W, W_f, W_o ``[d, D]`` (read with φ of their queries) and R, R_f, R_o ``[d, d]`` (read
  with softmax(y_{t-1})), tied input/forget gate::

      u = W q + R f(y_{t-1});  f = σ(W_f q + R_f f(y_{t-1}));  o = σ(W_o q + R_o f(y_{t-1}))
      c = f ⊙ c_{t-1} + (1 - f) ⊙ u;   y = c ⊙ o                  (f = softmax)

  Each of W, W_f, W_o has its own query (the equations write one q; separate queries give
  the paper's 47.3M parameters, a shared one 46.7M); φ (``feature_map``, default ELU+1 with
  sum normalisation) applies to the queries and keys of W, W_f, W_o; the recurrent matrices'
  keys are softmax(k_r), matching their softmax(y_{t-1}) queries (as in ``delta_rnn``). Slow
  projection per head: (q, k, v) for W, W_f, W_o, (k, v) for R, R_f, R_o and six β: 15d + 6. State per layer:
  ``W3 [B, 3H, d, D]`` (W, W_f, W_o as head groups), ``R3 [B, 3H, d, d]``, ``c [B, H, d]``,
  ``y [B, H, d]``.
- ``delta_mlp``, Delta MLP (RFWP Eq. 13-14): K = ``fast_layers`` fast layers
  ``h_k = W_k φ(h_{k-1})``, ``h_0 = q``, ``y = h_K``; the slow net writes every W_k
  ``[d, D]`` from the current input (key, value, β per layer). Slow projection per head:
  d + K (2d + 1). State per layer: K matrices ``[B, H, d, D]``.
- ``delta_delta``, Delta-Delta Net (RFWP Sec. 3.1, App. A.3): a Delta Net whose slow
  projection is itself a fast matrix M ``[3d + 1, D]`` written by the delta rule: the slow
  net emits (q_s, k_s, v_s, β_s) of sizes (d, d, 3d + 1, 1), i.e. 5d + 2 per head;
  ``p = M φ(q_s)`` is split into the inner Delta Net's (q, k, v, β) (sizes d, d, d, 1), which
  writes ``W [d, D]`` and outputs ``y = W φ(q)``. State per layer: ``M [B, H, 3d + 1, D]``,
  ``W [B, H, d, D]``.

Registered into :mod:`rfwp_rl.cores` on import (``rfwp_rl.cores`` imports this module on first
use of ``make``/``available``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from rfwp_rl import ops
from rfwp_rl.cores import feature_maps, register
from rfwp_rl.cores.base import CoreSpec, State, check_positive_int, reset_steps, zero_entries
from rfwp_rl.cores.fast_weight import FastWeightCore, FastWeightSublayer, block_defaults
from rfwp_rl.ops.common import delta_update, read  # RFWP Eq. 8, 10 and Eq. 7


def _defaults(feature_map: str, **extra: Any) -> dict:
    return block_defaults(feature_map=feature_map, dpfp_nu=1, **extra)


SPECS = {
    "delta_lstm": CoreSpec(
        "delta_lstm",
        "Delta LSTM (version D): six delta-rule fast matrices, tied input/forget gate, y = c ⊙ o",
        "RFWP paper App. A.2 Eq. 36-40 with Eq. 8-10",
        _defaults("elu_sum"),
    ),
    "delta_mlp": CoreSpec(
        "delta_mlp",
        "Delta MLP: a deep fast feedforward net h_k = W_k φ(h_{k-1}), every W_k written by the delta rule",
        "RFWP paper Eq. 13-14 with Eq. 8-10",
        _defaults("softmax", fast_layers=2),
    ),
    "delta_delta": CoreSpec(
        "delta_delta",
        "Delta-Delta Net: a Delta Net whose slow projection is a fast matrix written by the delta rule",
        "RFWP paper Sec. 3.1, App. A.3 with Eq. 8-10",
        _defaults("elu_sum"),
    ),
}


def _heads(x: Tensor, groups: int) -> Tensor:
    """``[T, B, H, groups * n]`` (group-major per head) -> ``[T, B, groups * H, n]``."""
    T, B, H, gn = x.shape
    return x.view(T, B, H, groups, gn // groups).transpose(2, 3).reshape(T, B, groups * H, gn // groups)


def _ungroup(x: Tensor, groups: int) -> tuple[Tensor, ...]:
    """``[..., groups * H, n]`` -> ``groups`` tensors ``[..., H, n]``."""
    return x.chunk(groups, dim=-2)


class DeltaLSTMSublayer(FastWeightSublayer):
    """Delta LSTM version D (RFWP App. A.2, Eq. 36-40), see the module docstring."""

    kind = "delta"  # the op used for the feedforward fast matrices W, W_f, W_o

    def slow_per_head(self) -> int:
        return 15 * self.d + 6

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        B, H, d = batch_size, self.H, self.d
        return [(B, 3 * H, d, self.D), (B, 3 * H, d, d), (B, H, d), (B, H, d)]

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        d = self.d
        qw, kw, vw, kr, vr, bw, br = p.split([3 * d] * 5 + [3, 3], dim=-1)
        W0, R, c, y = state
        # feedforward parts W q_u, W_f q_f, W_o q_o: the delta op on 3H heads (RFWP Eq. 8-10, 7)
        z, W = self.op(
            self.phi(_heads(qw, 3)),
            self.phi(_heads(kw, 3)),
            _heads(vw, 3),
            torch.sigmoid(_heads(bw, 3).squeeze(-1)),
            W0,
            reset,
        )
        z_u, z_f, z_o = _ungroup(z, 3)
        # recurrent parts: R, R_f, R_o written by the delta rule, read with softmax(y_{t-1})
        kr, vr = feature_maps.softmax(_heads(kr, 3)), _heads(vr, 3)
        beta_r = torch.sigmoid(_heads(br, 3).squeeze(-1))
        T = p.shape[0]
        flags = reset_steps(reset, T)
        ys = []
        for t in range(T):
            if flags[t]:
                R, c, y = (zero_entries(s, reset[t]) for s in (R, c, y))
            R = delta_update(R, kr[t], vr[t], beta_r[t])  # RFWP Eq. 8, 10
            r_u, r_f, r_o = _ungroup(read(R, feature_maps.softmax(y).repeat(1, 3, 1)), 3)
            u = z_u[t] + r_u  # RFWP Eq. 36
            f = torch.sigmoid(z_f[t] + r_f)  # RFWP Eq. 37
            o = torch.sigmoid(z_o[t] + r_o)  # RFWP Eq. 38
            c = f * c + (1.0 - f) * u  # RFWP Eq. 39
            y = c * o  # RFWP Eq. 40
            ys.append(y)
        return torch.stack(ys), (W, R, c, y)


class DeltaMLPSublayer(FastWeightSublayer):
    """Delta MLP (RFWP Eq. 13-14), see the module docstring."""

    kind = "delta"

    def __init__(self, *args: Any, fast_layers: int = 2) -> None:
        self.K = check_positive_int("fast_layers", fast_layers)
        super().__init__(*args)

    def slow_per_head(self) -> int:
        return self.d + self.K * (2 * self.d + 1)

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.H, self.d, self.D)] * self.K

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        d, K = self.d, self.K
        parts = p.split([d] + [d, d, 1] * K, dim=-1)
        h = parts[0]  # h_0 = q
        new_state = []
        for k in range(K):
            key, value, b = parts[1 + 3 * k : 4 + 3 * k]
            # RFWP Eq. 13: h_k = W_k^(t) φ(h_{k-1}), W_k written by the delta rule (Eq. 8-10)
            h, W = self.op(self.phi(h), self.phi(key), value, torch.sigmoid(b.squeeze(-1)), state[k], reset)
            new_state.append(W)
        return h, tuple(new_state)  # RFWP Eq. 14


class DeltaDeltaSublayer(FastWeightSublayer):
    """Delta-Delta Net (RFWP Sec. 3.1, App. A.3), see the module docstring."""

    kind = "delta"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # M maps keys of size D to the 3d + 1 slow projections of the inner Delta Net
        self.slow_op = self.resolve_op("delta", ops.Dims(dk=self.D, dv=3 * self.d + 1))

    def slow_per_head(self) -> int:
        return 5 * self.d + 2  # App. A.3

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        B, H, d = batch_size, self.H, self.d
        return [(B, H, 3 * d + 1, self.D), (B, H, d, self.D)]

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        d = self.d
        qs, ks, vs, bs = p.split([d, d, 3 * d + 1, 1], dim=-1)
        M0, W0 = state
        # the fast "slow projection": M written by the delta rule, read with φ(q_s)
        proj, M = self.slow_op(self.phi(qs), self.phi(ks), vs, torch.sigmoid(bs.squeeze(-1)), M0, reset)
        q, k, v, b = proj.split([d, d, d, 1], dim=-1)
        # the inner Delta Net (RFWP Eq. 8-10, 7)
        y, W = self.op(self.phi(q), self.phi(k), v, torch.sigmoid(b.squeeze(-1)), W0, reset)
        return y, (M, W)


class LMFastWeightCore(FastWeightCore):
    """A fast-weight block stack named ``name`` whose fast-weight sublayers are ``sublayer``.

    :class:`FastWeightCore` (checks, input projection, fast-weight and feed-forward
    sublayers, state layout, forward) built with ``sublayer_cls=sublayer``. ``extra`` are
    the sublayer's own config keys (``fast_layers`` for delta_mlp), passed to every sublayer
    and recorded in ``config``.
    """

    def __init__(
        self,
        name: str,
        sublayer: type[FastWeightSublayer],
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
        feature_map: str = "softmax",
        dpfp_nu: int = 1,
        backend: str = "auto",
        detach_state_every_step: bool = False,
        **extra: Any,
    ) -> None:
        super().__init__(
            input_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            ff_size=ff_size,
            dropout=dropout,
            feature_map=feature_map,
            dpfp_nu=dpfp_nu,
            backend=backend,
            detach_state_every_step=detach_state_every_step,
            sublayer_cls=sublayer,
            sublayer_config=extra,
        )
        self.name = name


SUBLAYERS = {"delta_lstm": DeltaLSTMSublayer, "delta_mlp": DeltaMLPSublayer, "delta_delta": DeltaDeltaSublayer}

for _name, _spec in SPECS.items():
    register(_spec, functools.partial(LMFastWeightCore, _name, SUBLAYERS[_name]))
