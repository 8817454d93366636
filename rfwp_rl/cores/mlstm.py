"""``mlstm``: a block stack of multi-head mLSTM sublayers, the matrix-memory cell of xLSTM (Beck,
Pöppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter, Hochreiter, *xLSTM: Extended
Long Short-Term Memory*, NeurIPS 2024, Sec. 2.3).

The block stack of :class:`rfwp_rl.cores.fast_weight.FastWeightCore` (input projection, then per
layer a pre-LayerNorm residual mLSTM sublayer and a pre-LayerNorm residual feed-forward sublayer,
no final LayerNorm), so that it compares with ``lt``/``delta``/``rdn``/``gated_delta`` at equal
sizes, with this token mixer (per head of size d = hidden/H)::

    q, k', v, o~, i~, f~ = Linear(LN(x))            one projection with bias (Eq. 22-27)
    k = k' / sqrt(d)                                 (Eq. 23; its bias scaled with it)
    C_t = f_t C_{t-1} + i_t v_t k_tᵀ,  n_t = f_t n_{t-1} + i_t k_t          (Eq. 19-20)
    h~_t = C_t q_t / max(|n_tᵀ q_t|, 1),  i_t = exp(i~_t),  f_t = σ(f~_t)   (Eq. 21, 25-26)
    y = x + drop(W_out (σ(o~) ⊙ h~))                 output gate (Eq. 21, 27), output projection

computed in the stabilised form (Eq. 15-17; :mod:`rfwp_rl.ops.mlstm`): the parallel form over
chunks of ``chunk_size`` steps for an unroll, one recurrent step when T == 1 (acting, 1-step
BPTT). Not the xLSTM paper's mLSTM *block* (up-projection, causal convolution, learnable skip,
per-head norm): the cell inside this package's block stack.

Initialisation as the xLSTM code's mLSTM cell: the gate weights zero; the input-gate bias
N(0, 0.1²) (i_t near 1 at first); the forget-gate bias linspace(3, 6) over the heads, so σ(f~)
starts near 1 and the memory keeps what it stores over many steps from the first update, at a
different time scale per head.

State of each layer (batch dim 0; concatenated over layers): ``C [B, H, d, d]``, ``n [B, H, d]``,
``m [B, H]`` (the stabilised matrix memory, normaliser and stabiliser; all zero at a reset).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from rfwp_rl.cores.base import CoreSpec, State, check_heads, check_positive_int, zero_entries
from rfwp_rl.cores.fast_weight import FastWeightCore
from rfwp_rl.ops.mlstm import mlstm_chunked, mlstm_step

FORGET_BIAS_RANGE = (3.0, 6.0)
"""The forget-gate biases at initialisation, spread linearly over the heads (the xLSTM code's)."""
INPUT_BIAS_STD = 0.1
"""Standard deviation of the input-gate biases at initialisation (the xLSTM code's)."""

SPEC = CoreSpec(
    "mlstm",
    "mLSTM (xLSTM): matrix memory C = f C + i v kᵀ with exponential input gate, sigmoid forget gate, "
    "normaliser state and output gate",
    "xLSTM paper (NeurIPS 2024) Eq. 19-27, stabiliser Eq. 15-17, parallel form App. A",
    {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "ff_size": 512,
        "dropout": 0.0,
        "chunk_size": 32,
        "detach_state_every_step": False,
    },
)


class MLSTMSublayer(nn.Module):
    """Pre-LayerNorm residual multi-head mLSTM token mixer (see the module docstring).

    x ``[T, B, hidden]`` -> ``[T, B, hidden]``; state ``(C [B, H, d, d], n [B, H, d], m [B, H])``.
    The unused ``_feature_map``, ``_dpfp_nu`` and ``_backend`` fill the block stack's sublayer
    signature (no feature map: exp/σ gates and the normaliser; no fused kernel).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        _feature_map: str,
        _dpfp_nu: int,
        _backend: str,
        *,
        chunk_size: int = 32,
    ) -> None:
        super().__init__()
        self.H, self.d = num_heads, check_heads(hidden_size, num_heads)
        self.hidden = hidden_size
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.norm = nn.LayerNorm(hidden_size)
        # q, k, v, o (hidden each), then i~ and f~ (one per head)
        self.sizes = [hidden_size] * 4 + [num_heads] * 2
        self.proj = nn.Linear(hidden_size, sum(self.sizes))
        self.out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.drop = nn.Dropout(dropout)
        with torch.no_grad():
            gates = slice(4 * hidden_size, None)
            self.proj.weight[gates].zero_()
            i_bias, f_bias = self.proj.bias[gates].view(2, num_heads)
            i_bias.normal_(0.0, INPUT_BIAS_STD)
            f_bias.copy_(torch.linspace(*FORGET_BIAS_RANGE, num_heads))

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        B, H, d = batch_size, self.H, self.d
        return [(B, H, d, d), (B, H, d), (B, H)]

    def forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        H, d = self.H, self.d
        q, k, v, o, i_pre, f_pre = self.proj(self.norm(x)).split(self.sizes, dim=-1)
        q, v = q.view(T, B, H, d), v.view(T, B, H, d)
        k = k.view(T, B, H, d) / math.sqrt(d)  # xLSTM Eq. 23
        if T == 1:  # acting and 1-step BPTT: the recurrent step, O(d²) per head, no host sync
            C, n, m = state if reset is None else (zero_entries(s, reset[0]) for s in state)
            h, C, n, m = mlstm_step(q[0], k[0], v[0], i_pre[0], f_pre[0], C, n, m)
            h = h[None]
        else:
            h, C, n, m = mlstm_chunked(q, k, v, i_pre, f_pre, *state, reset, chunk_size=self.chunk_size)
        y = torch.sigmoid(o) * h.reshape(T, B, self.hidden)  # Eq. 21, 27: h_t = o_t ⊙ h~_t
        return x + self.drop(self.out(y)), (C, n, m)


class MLSTMCore(FastWeightCore):
    """``mlstm``: mLSTM block stack (xLSTM paper Eq. 19-27 with Eq. 15-17), see the module docstring."""

    kind = "mlstm"
    sublayer_cls = MLSTMSublayer

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
        chunk_size: int = 32,
        detach_state_every_step: bool = False,
    ) -> None:
        # "softmax", 1, "auto" only fill the block stack's feature-map and backend slots
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            num_heads,
            ff_size,
            dropout,
            "softmax",
            1,
            "auto",
            detach_state_every_step,
            sublayer_config={"chunk_size": chunk_size},
        )
        self.keep_config(SPEC.defaults)
