"""Fast-weight cores ``lt``, ``delta``, ``delta_rnn``, ``rdn``: Transformer-like block stacks.

Structure (the reference Atari agents' layout; RFWP paper App. C)::

    x [T, B, input_size] -> Linear(input_size -> hidden, bias)
    num_layers x [ h = h + FastWeightSublayer(LN(h))      # pre-LayerNorm residual
                   h = h + FeedForward(LN(h)) ]           # Linear+ReLU+drop+Linear+drop
    -> y [T, B, hidden]                                   # no final LayerNorm

A fast-weight sublayer computes its slow projections for the whole unroll with one matmul
(``Linear(hidden -> needed, bias=False)``), splits them into H heads of size d = hidden/H,
runs the sequential recurrence (the op ``kind`` of :mod:`rfwp_rl.ops`, resolved once at
construction for the sublayer's sizes: fused kernel or PyTorch reference) and projects back
with ``Linear(hidden -> hidden, bias=False)`` and dropout. Per-head slow projection layout (as in
the reference code): ``[q, k, v, β]`` for lt/delta/rdn (no β for lt),
``[q, k, v, k_r, v_r, β, β_r]`` for delta_rnn.

Feature maps (``feature_map``): applied to q and k before the op (lt, delta, delta_rnn);
inside the op for rdn (the op's ``supported`` says which its fused kernel runs). The
delta_rnn recurrent key k_r always uses softmax, matching its recurrent query
softmax(y_{t-1}).

Each core class names its sublayer class (``FastWeightCore.sublayer_cls``; other modules
build further block stacks the same way, e.g. :mod:`rfwp_rl.cores.lm_cores`).

State of each layer (batch dim 0; concatenated over layers into one flat tuple):
lt/delta ``(W,)``, delta_rnn ``(W, R, y_last)``, rdn ``(W, y_last)`` with
``W [B, H, d, D]`` (D = d, or 2νd for dpfp), ``R [B, H, d, d]``, ``y_last [B, H, d]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from rfwp_rl import ops
from rfwp_rl.cores import feature_maps
from rfwp_rl.cores.base import (
    Core,
    CoreSpec,
    State,
    check_backend,
    check_bool,
    check_dropout,
    check_heads,
    check_positive_int,
)
from rfwp_rl.errors import check_choice


def block_defaults(**options: Any) -> dict:
    """The default config of a block-stack core whose sublayers take ``options``."""
    return {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "ff_size": 512,
        "dropout": 0.0,
        **options,
        "backend": "auto",
        "detach_state_every_step": False,
    }


def _defaults(feature_map: str) -> dict:
    return block_defaults(feature_map=feature_map, dpfp_nu=1)


SPECS = {
    "lt": CoreSpec(
        "lt",
        "Linear Transformer: purely additive fast weights W += v ⊗ k",
        "RFWP paper Eq. 5-7; Secretly-FWP Eq. 29-30, 37 (feature maps)",
        _defaults("elu_sum"),
    ),
    "delta": CoreSpec(
        "delta",
        "Delta Net: fast weights written by the delta rule with learned β",
        "RFWP paper Eq. 8-10; Secretly-FWP Eq. 23-29",
        _defaults("elu_sum"),
    ),
    "delta_rnn": CoreSpec(
        "delta_rnn",
        "Delta RNN: fast recurrent matrix R, y = W q + R softmax(y_prev)",
        "RFWP paper Eq. 8-10, 12 (version B)",
        _defaults("softmax"),
    ),
    "rdn": CoreSpec(
        "rdn",
        "Recurrent Delta Net: k, v, q, β also see tanh(y_prev)",
        "RFWP paper Eq. 15-18 with Eq. 7-10",
        _defaults("softmax"),
    ),
}


# ------------------------------------------------------------------------- sublayers


class FeedForward(nn.Module):
    """Pre-LayerNorm residual feed-forward sublayer: ``x + drop(W2 drop(relu(W1 LN(x))))``.

    x: ``[T, B, hidden]`` -> ``[T, B, hidden]``.
    """

    def __init__(self, hidden_size: int, ff_size: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.net = nn.Sequential(
            nn.Linear(hidden_size, ff_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(ff_size, hidden_size),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.net(self.norm(x))


class FastWeightSublayer(nn.Module):
    """Pre-LayerNorm residual fast-weight sublayer (base class).

    Subclasses set ``kind`` (the op name), ``slow_per_head`` (slow projection outputs per
    head) and implement ``state_shapes`` and ``recurrence``, which calls ``self.op`` (the op
    ``kind`` resolved once, at construction, for keys of size D and values of size d; a
    subclass calling it with other sizes resolves its own with :meth:`resolve_op`).
    """

    kind: str = ""

    def __init__(
        self, hidden_size: int, num_heads: int, dropout: float, feature_map: str, dpfp_nu: int, backend: str
    ) -> None:
        super().__init__()
        self.H = num_heads
        self.d = check_heads(hidden_size, num_heads)
        self.phi = feature_maps.get(feature_map, self.d, dpfp_nu)
        self.D = feature_maps.feature_dim(feature_map, self.d, dpfp_nu)  # key/query size
        self.feature_map = feature_map
        self.backend = backend
        self.norm = nn.LayerNorm(hidden_size)
        self.slow = nn.Linear(hidden_size, num_heads * self.slow_per_head(), bias=False)
        self.out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.drop = nn.Dropout(dropout)
        # with backend 'kernel' a one-line error now if the fused kernel cannot run these sizes
        self.op = self.resolve_op(self.kind, ops.Dims(dk=self.D, dv=self.d))

    def resolve_op(self, name: str, dims: ops.Dims, **options) -> Callable[..., tuple]:
        """Op ``name`` on this sublayer's backend for sizes ``dims`` (chosen once)."""
        return ops.resolve(name, self.backend, dims, **options)

    def slow_per_head(self) -> int:
        raise NotImplementedError

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """p: slow projections ``[T, B, H, slow_per_head]`` -> y ``[T, B, H, d]``, state."""
        raise NotImplementedError

    def forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        p = self.slow(self.norm(x)).view(T, B, self.H, self.slow_per_head())  # one big matmul
        y, state = self.recurrence(p, state, reset)
        return x + self.drop(self.out(y.reshape(T, B, self.H * self.d))), state


class LTSublayer(FastWeightSublayer):
    """Linear Transformer (RFWP paper Eq. 5-7): q, k, v = slow(x); W += v ⊗ φ(k); y = W φ(q)."""

    kind = "lt"

    def slow_per_head(self) -> int:
        return 3 * self.d

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.H, self.d, self.D)]

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        q, k, v = p.split(self.d, dim=-1)  # RFWP Eq. 5
        y, W = self.op(self.phi(q), self.phi(k), v, state[0], reset)
        return y, (W,)


class DeltaSublayer(FastWeightSublayer):
    """Delta Net (RFWP paper Eq. 8-10): β = σ(slow(x)); delta rule on W; y = W φ(q)."""

    kind = "delta"

    def slow_per_head(self) -> int:
        return 3 * self.d + 1

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.H, self.d, self.D)]

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        q, k, v, b = p.split([self.d, self.d, self.d, 1], dim=-1)
        beta = torch.sigmoid(b.squeeze(-1))  # RFWP Eq. 9
        y, W = self.op(self.phi(q), self.phi(k), v, beta, state[0], reset)
        return y, (W,)


class DeltaRNNSublayer(FastWeightSublayer):
    """Delta RNN version B (RFWP paper Eq. 12): y = W φ(q) + R softmax(y_prev); W and R
    both written by the delta rule; R's keys are softmax(k_r)."""

    kind = "delta_rnn"

    def slow_per_head(self) -> int:
        return 5 * self.d + 2

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        B, H, d = batch_size, self.H, self.d
        return [(B, H, d, self.D), (B, H, d, d), (B, H, d)]

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        d = self.d
        q, k, v, kr, vr, b, br = p.split([d, d, d, d, d, 1, 1], dim=-1)
        beta, beta_r = torch.sigmoid(b.squeeze(-1)), torch.sigmoid(br.squeeze(-1))
        W0, R0, y0 = state
        y, W, R = self.op(self.phi(q), self.phi(k), v, beta, feature_maps.softmax(kr), vr, beta_r, W0, R0, y0, reset)
        return y, (W, R, y[-1])


class RDNSublayer(FastWeightSublayer):
    """Recurrent Delta Net (RFWP paper Eq. 15-18): the slow net also sees tanh(y_prev)
    through per-head recurrent weights R_q, R_k, R_v ``[H, d, d]`` and r_β ``[H, d]``,
    initialised N(0, 1/d). φ is applied inside the op."""

    kind = "rdn"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        H, d = self.H, self.d
        self.Rq = nn.Parameter(torch.randn(H, d, d) / math.sqrt(d))
        self.Rk = nn.Parameter(torch.randn(H, d, d) / math.sqrt(d))
        self.Rv = nn.Parameter(torch.randn(H, d, d) / math.sqrt(d))
        self.rb = nn.Parameter(torch.randn(H, d) / math.sqrt(d))

    def resolve_op(self, name: str, dims: ops.Dims, **options) -> Callable[..., tuple]:
        # φ runs inside the op: the op gets it, and its name decides whether the fused
        # kernel can run it
        return super().resolve_op(name, ops.Dims(dims.dk, dims.dv, self.feature_map), feature_map=self.phi, **options)

    def slow_per_head(self) -> int:
        return 3 * self.d + 1

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.H, self.d, self.D), (batch_size, self.H, self.d)]

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        xq, xk, xv, xb = p.split([self.d, self.d, self.d, 1], dim=-1)
        W0, y0 = state
        y, W = self.op(xq, xk, xv, xb.squeeze(-1), self.Rq, self.Rk, self.Rv, self.rb, W0, y0, reset)
        return y, (W, y[-1])


# ------------------------------------------------------------------------- the core


class FastWeightCore(Core):
    """Block stack whose fast-weight sublayers are all of one class.

    x ``[T, B, input_size]`` -> y ``[T, B, hidden_size]``. State: the per-layer state
    tensors of layer 0, then layer 1, ... (see the module docstring).

    Subclasses set ``kind`` (the core name) and ``sublayer_cls`` (the fast-weight sublayer
    class of every block); the keyword argument ``sublayer_cls`` overrides the class
    attribute for one instance. ``sublayer_config`` holds the sublayer's own config keys
    (passed to every sublayer as keyword arguments and recorded in ``config``).
    ``feature_map=None`` means the core's default (``SPECS[kind].defaults``).
    """

    kind: str = ""
    sublayer_cls: type[FastWeightSublayer] | None = None

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
        feature_map: str | None = None,
        dpfp_nu: int = 1,
        backend: str = "auto",
        detach_state_every_step: bool = False,
        *,
        sublayer_cls: type[FastWeightSublayer] | None = None,
        sublayer_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.name = self.kind
        sublayer_cls = sublayer_cls if sublayer_cls is not None else self.sublayer_cls
        if sublayer_cls is None:
            raise TypeError(
                f"{type(self).__name__}: no fast-weight sublayer class; set the "
                "class attribute sublayer_cls or pass sublayer_cls="
            )
        sublayer_config = dict(sublayer_config or {})
        if feature_map is None:
            feature_map = SPECS[self.kind].defaults["feature_map"]
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_layers", num_layers)
        check_positive_int("num_heads", num_heads)
        check_positive_int("ff_size", ff_size)
        check_heads(hidden_size, num_heads)
        check_positive_int("dpfp_nu", dpfp_nu)
        dropout = check_dropout(dropout)
        check_choice("feature_map", feature_map, feature_maps.FEATURE_MAPS)
        check_backend(backend)
        self.detach_state_every_step = check_bool("detach_state_every_step", detach_state_every_step)
        self.config = {
            "hidden_size": hidden_size,
            "num_layers": num_layers,
            "num_heads": num_heads,
            "ff_size": ff_size,
            "dropout": dropout,
            "feature_map": feature_map,
            "dpfp_nu": dpfp_nu,
            "backend": backend,
            "detach_state_every_step": detach_state_every_step,
            **sublayer_config,
        }

        # registration order input_proj, fast_layers, ff_layers fixes the state_dict keys
        self.input_proj = nn.Linear(input_size, hidden_size)
        self.fast_layers = nn.ModuleList(
            sublayer_cls(hidden_size, num_heads, dropout, feature_map, dpfp_nu, backend, **sublayer_config)
            for _ in range(num_layers)
        )
        self.ff_layers = nn.ModuleList(FeedForward(hidden_size, ff_size, dropout) for _ in range(num_layers))
        self._n_state = [len(layer.state_shapes(1)) for layer in self.fast_layers]

    def keep_config(self, keys: Any) -> None:
        """Record only ``keys`` in ``config`` (a core whose spec lacks some of the block stack's keys)."""
        self.config = {key: self.config[key] for key in keys}

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [s for layer in self.fast_layers for s in layer.state_shapes(batch_size)]

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        h = self.input_proj(x)
        new_state: list[Tensor] = []
        i = 0
        for fast, ff, n in zip(self.fast_layers, self.ff_layers, self._n_state):
            h, s = fast(h, state[i : i + n], reset)  # pre-LN residual fast-weight sublayer
            h = ff(h)  # pre-LN residual feed-forward sublayer
            new_state.extend(s)
            i += n
        return h, tuple(new_state)


class LTCore(FastWeightCore):
    """``lt``: Linear Transformer block stack (RFWP paper Eq. 5-7)."""

    kind = "lt"
    sublayer_cls = LTSublayer


class DeltaCore(FastWeightCore):
    """``delta``: Delta Net block stack (RFWP paper Eq. 8-10)."""

    kind = "delta"
    sublayer_cls = DeltaSublayer


class DeltaRNNCore(FastWeightCore):
    """``delta_rnn``: Delta RNN block stack (RFWP paper Eq. 12, version B)."""

    kind = "delta_rnn"
    sublayer_cls = DeltaRNNSublayer


class RDNCore(FastWeightCore):
    """``rdn``: Recurrent Delta Net block stack (RFWP paper Eq. 15-18)."""

    kind = "rdn"
    sublayer_cls = RDNSublayer


CORES = {"lt": LTCore, "delta": DeltaCore, "delta_rnn": DeltaRNNCore, "rdn": RDNCore}
