"""The softmax-attention Transformer baseline of the sequence trainer (``--core transformer``).

The same pre-LayerNorm block stack as the fast-weight cores (it reuses
:class:`rfwp_rl.cores.lm_cores.LMFastWeightCore`), with causal multi-head softmax attention
(Vaswani et al.) as the sequence sublayer. It keeps every past key and value, so it has no
constant-size state: ``initial_state`` is the empty tuple and each call attends only within
that call. It therefore cannot carry context from one call to the next
(``carries_state = False``; the trainer refuses ``--context carried`` with it and evaluates
language models with the sliding window instead). A reset inside a call starts a new
attention span: position t attends to s <= t only when no reset lies in (s, t].
It lives here, not in :mod:`rfwp_rl.cores`, because the RL trainers need constant-size states.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rfwp_rl.cores.base import State
from rfwp_rl.cores.fast_weight import FastWeightSublayer
from rfwp_rl.cores.lm_cores import LMFastWeightCore

DEFAULTS = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "ff_size": 512, "dropout": 0.0}


def attention_mask(reset: Tensor | None, T: int, device: torch.device) -> Tensor | None:
    """Boolean ``[B, 1, T, T]`` (True = may attend) or None for a plain causal mask.

    Position t may attend to s when s <= t and the same number of resets occurred up to both.
    """
    if reset is None:
        return None
    seg = reset.long().cumsum(0).T  # [B, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return (causal & (seg[:, :, None] == seg[:, None, :])).unsqueeze(1)


class AttentionSublayer(FastWeightSublayer):
    """Pre-LN residual causal softmax self-attention: q, k, v = slow(LN(x)) per head,
    ``y_t = Σ_{s<=t} softmax_s(q_t·k_s / sqrt(d)) v_s``. No state."""

    kind = "lt"  # only for the parent's op check; no fast-weight op is used

    def slow_per_head(self) -> int:
        return 3 * self.d

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return []

    def recurrence(self, p: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        q, k, v = (t.permute(1, 2, 0, 3) for t in p.split(self.d, dim=-1))  # [B, H, T, d]
        mask = attention_mask(reset, p.shape[0], p.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return y.permute(2, 0, 1, 3), ()  # [T, B, H, d]


class TransformerCore(LMFastWeightCore):
    """Softmax-attention block stack: x ``[T, B, input_size]`` -> y ``[T, B, hidden_size]``;
    state ``()``. Config: hidden_size, num_layers, num_heads, ff_size, dropout."""

    carries_state = False

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        ff_size: int = 512,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(
            "transformer",
            AttentionSublayer,
            input_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            ff_size=ff_size,
            dropout=dropout,
            backend="reference",
        )
        self.config = {k: self.config[k] for k in DEFAULTS}
