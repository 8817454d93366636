"""The sequence model: token embedding -> a core -> output layer.

    x [T, B] (or [T, B, F] for inputs made of F fields, e.g. key and value)
      -> sum of the fields' embeddings [T, B, emb_size] (+ sinusoidal positions) -> dropout
      -> core (any of rfwp_rl.cores, or the softmax ``transformer`` baseline)
      -> LayerNorm (block-stack cores: they are pre-LN residual stacks without a final norm)
      -> Linear -> logits [T, B, num_classes]

The layers live in the core: the fast-weight cores and the Transformer baseline are
stacks of ``num_layers`` blocks [sequence sublayer, feed-forward sublayer] (pre-LN residual),
``lstm`` has ``num_layers`` stacked LSTM layers. The model adds only what a token task needs
around the core, so the same core (and the same checkpointable state) serves the RL
trainers and this one.

Sinusoidal positions (Vaswani et al.) are on by default only for the Transformer (RFWP App.
B.2: the other models use none); positions count from the start of each call and restart
at a reset, so they are only meaningful for a model that does not carry state between calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfwp_rl import cores
from rfwp_rl.cores.fast_weight import FastWeightCore
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.seq.attention import DEFAULTS, TransformerCore

TRANSFORMER = "transformer"


def core_names() -> list[str]:
    """Every core the sequence model accepts: ``rfwp_rl.cores.available()`` + transformer."""
    return sorted([*cores.available(), TRANSFORMER])


def core_defaults(name: str) -> dict[str, Any]:
    check_choice("core", name, core_names())
    if name == TRANSFORMER:
        return dict(DEFAULTS)
    return dict(cores.available()[name].defaults)


def make_core(name: str, input_size: int, **config: Any) -> nn.Module:
    """``rfwp_rl.cores.make`` plus the ``transformer`` baseline (same errors for bad keys)."""
    check_choice("core", name, core_names())
    if name != TRANSFORMER:
        return cores.make(name, input_size, **config)
    for key in config:
        if key not in DEFAULTS:
            raise UserError(f"unknown config key {key!r} for core 'transformer'; allowed: {', '.join(DEFAULTS)}")
    return TransformerCore(input_size, **{**DEFAULTS, **config})


def sinusoidal(positions: Tensor, size: int) -> Tensor:
    """Vaswani et al. position encodings: positions ``[T, B]`` (long) -> ``[T, B, size]``."""
    half = size // 2
    freq = torch.exp(
        -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=positions.device) / max(half, 1)
    )
    angle = positions.float()[..., None] * freq
    enc = torch.cat([angle.sin(), angle.cos()], dim=-1)
    return enc if size % 2 == 0 else torch.cat([enc, torch.zeros_like(enc[..., :1])], dim=-1)


def positions_since_reset(reset: Tensor | None, T: int, B: int, device: torch.device) -> Tensor:
    """Position of each step ``[T, B]``: steps since the call start or the last reset."""
    t = torch.arange(T, device=device)[:, None].expand(T, B)
    if reset is None:
        return t
    start = torch.where(reset.bool(), t, torch.zeros_like(t)).cummax(dim=0).values
    return t - start


class SeqModel(nn.Module):
    """Embedding, core, output layer (see the module docstring).

    Args:
        core: core name (``core_names()``).
        field_sizes: vocabulary size of each input field (one field: plain tokens).
        num_classes: output vocabulary size.
        emb_size: embedding size (the core's input size).
        core_config: the core's config over its defaults (e.g. hidden_size, num_layers).
        dropout: dropout on the embeddings.
        positions: sinusoidal positions; None = only for the transformer.
    """

    def __init__(
        self,
        core: str,
        field_sizes: Sequence[int],
        num_classes: int,
        emb_size: int = 128,
        core_config: dict[str, Any] | None = None,
        dropout: float = 0.0,
        positions: bool | None = None,
    ) -> None:
        super().__init__()
        self.core_name = core
        self.field_sizes = tuple(int(n) for n in field_sizes)
        self.embeddings = nn.ModuleList(nn.Embedding(n, emb_size) for n in self.field_sizes)
        self.core = make_core(core, emb_size, **(core_config or {}))
        self.positions = (core == TRANSFORMER) if positions is None else positions
        self.emb_size = emb_size
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(self.core.output_size) if isinstance(self.core, FastWeightCore) else nn.Identity()
        self.head = nn.Linear(self.core.output_size, num_classes)

    @property
    def carries_state(self) -> bool:
        """Whether a call can continue from the state of the previous one."""
        return getattr(self.core, "carries_state", True) and not self.positions

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> tuple:
        return self.core.initial_state(batch_size, device)

    def describe(self) -> dict[str, Any]:
        """The model settings recorded with results and checkpoints."""
        return {
            "model": "seq",
            "core": self.core_name,
            "core_config": dict(self.core.config),
            "emb_size": self.emb_size,
            "positions": self.positions,
            "dropout": self.drop.p,
        }

    @staticmethod
    def loss(logits: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
        """Cross-entropy over the scored positions (targets ``IGNORE`` = -100 are skipped)."""
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction=reduction
        )

    def embed(self, x: Tensor) -> Tensor:
        """x ``[T, B]`` or ``[T, B, F]`` (long) -> ``[T, B, emb_size]``."""
        fields = x.unsqueeze(-1) if x.dim() == 2 else x
        if fields.dim() != 3 or fields.shape[-1] != len(self.embeddings):
            raise UserError(
                f"model input has shape {tuple(x.shape)}; allowed: [T, B] or "
                f"[T, B, {len(self.embeddings)}] token indices"
            )
        return sum(emb(fields[..., i]) for i, emb in enumerate(self.embeddings))

    def forward(
        self, x: Tensor, state: Sequence[Tensor] | None = None, reset: Tensor | None = None
    ) -> tuple[Tensor, tuple]:
        """x ``[T, B]`` / ``[T, B, F]`` -> logits ``[T, B, num_classes]`` and the core state."""
        e = self.embed(x)
        if self.positions:
            T, B = e.shape[:2]
            e = e + sinusoidal(positions_since_reset(reset, T, B, e.device), self.emb_size)
        y, state = self.core(self.drop(e), state, reset)
        return self.head(self.norm(y)), state
