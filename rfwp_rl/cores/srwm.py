"""``srwm``: the modern self-referential weight matrix (Irie, Schlag, Csordás, Schmidhuber,
*A Modern Self-Referential Weight Matrix That Learns to Modify Itself*, ICML 2022).

A block stack of :class:`rfwp_rl.cores.fast_weight.FastWeightCore` (input projection, then per
layer a pre-LayerNorm residual token-mixing sublayer and a pre-LayerNorm residual feed-forward
sublayer) whose token mixer has no slow projection: the normalised input of each head (size
d = hidden/H) goes through φ (``feature_map``, the paper's softmax by default) into the head's
self-referential matrix W ``[3d + 4, D]``, which outputs ``[y, q, k, β] = W φ(x)`` and rewrites
itself (SRWM Eq. 5-8, the ``srwm`` op); W starts from a slow parameter W_0 drawn N(0, 1/d) (the
authors' initialisation) and the state is ΔW = W - W_0. Then the output projection.

State of each layer (batch dim 0; concatenated over layers): ``ΔW [B, H, 3d + 4, D]`` (D = d, or
2νd for dpfp), whose rows map φ(x) to y, q, k (d each) and the 4 learning rates.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from rfwp_rl import ops
from rfwp_rl.cores import feature_maps
from rfwp_rl.cores.base import CoreSpec, State, check_bool, check_heads, check_positive_float
from rfwp_rl.cores.fast_weight import FastWeightCore, block_defaults
from rfwp_rl.ops.srwm.naive import rows as srwm_rows

SPEC = CoreSpec(
    "srwm",
    "Self-referential weight matrix: one fast matrix per head generates its own output, query, key and learning rates",
    "SRWM paper (ICML 2022) Eq. 5-8",
    block_defaults(feature_map="softmax", dpfp_nu=1, qk_init_scale=1.0, input_layer_norm=True),
)


class SRWMSublayer(nn.Module):
    """Pre-LayerNorm residual self-referential sublayer (SRWM paper Eq. 5-8), see the module
    docstring: ``x + drop(W_out y)``, ``y`` from ``srwm(φ(LN(x)) per head)``.

    The slow parameters are the initial matrices ``W_init [H, 3d + 4, D]`` (N(0, 1/d), the
    authors' initialisation, β rows included) and the output projection. φ runs on the
    input here and on the generated q, k inside the op (whose fused kernel has softmax).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        feature_map: str,
        dpfp_nu: int,
        backend: str,
        *,
        qk_init_scale: float = 1.0,
        input_layer_norm: bool = True,
    ) -> None:
        super().__init__()
        self.H, self.d = num_heads, check_heads(hidden_size, num_heads)
        self.phi = feature_maps.get(feature_map, self.d, dpfp_nu)
        self.D = feature_maps.feature_dim(feature_map, self.d, dpfp_nu)
        # the official RL code softmaxes each head's input without a LayerNorm before it
        self.norm = nn.LayerNorm(hidden_size) if check_bool("input_layer_norm", input_layer_norm) else nn.Identity()
        W_init = torch.randn(num_heads, srwm_rows(self.d), self.D) / math.sqrt(self.d)
        # The q and k rows' logits go through a softmax over d entries; at N(0, 1/d) they are small,
        # softmax(q) ~ softmax(k) ~ uniform, so v - v̄ = W (φ(q) - φ(k)) is small next to W φ(x) and
        # little is written. qk_init_scale multiplies those rows' initial values.
        W_init[:, self.d : 3 * self.d] *= check_positive_float("qk_init_scale", qk_init_scale)
        self.W_init = nn.Parameter(W_init)
        self.out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.drop = nn.Dropout(dropout)
        self.op = ops.resolve("srwm", backend, ops.Dims(self.D, self.d, feature_map), feature_map=self.phi)

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.H, srwm_rows(self.d), self.D)]

    def forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        T, B, hidden = x.shape
        z = self.phi(self.norm(x).view(T, B, self.H, self.d))
        y, dW = self.op(z, self.W_init, state[0], reset)
        return x + self.drop(self.out(y.reshape(T, B, hidden))), (dW,)


class SRWMCore(FastWeightCore):
    """``srwm``: self-referential weight matrix block stack (SRWM paper Eq. 5-8)."""

    kind = "srwm"
    sublayer_cls = SRWMSublayer

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
        feature_map: str = "softmax",
        dpfp_nu: int = 1,
        qk_init_scale: float = 1.0,
        input_layer_norm: bool = True,
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
            feature_map,
            dpfp_nu,
            backend,
            detach_state_every_step,
            sublayer_config={"qk_init_scale": qk_init_scale, "input_layer_norm": input_layer_norm},
        )
        self.keep_config(SPEC.defaults)
