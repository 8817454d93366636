"""What the ``lstm`` and ``gru`` cores share around torch's ``nn.LSTM`` / ``nn.GRU``: the base
class (sizes, batch-first state), one call per segment between reset times, and the
initialisation options.

``run_segments(rnn, x, state, reset)``: x ``[T, B, I]``, state a tuple of ``[L, B, H]`` tensors
(``(h, c)`` for ``nn.LSTM``, ``(h,)`` for ``nn.GRU``), reset ``[T, B]`` bool or None.

Initialisation (applied once, at construction; a checkpoint's weights replace it):

- ``recurrent_init``: ``default`` keeps torch's uniform(-1/sqrt(H), 1/sqrt(H)); ``orthogonal``
  draws each gate's ``[H, H]`` block of every layer's ``weight_hh`` as an orthogonal matrix
  (Saxe et al. 2014), as many RL code bases do.
- ``forget_bias`` (``lstm``): the forget gate's bias at init (Gers et al. 2000;
  Jozefowicz et al. 2015 use 1.0). ``update_bias`` (``gru``): the same for the update gate z, the
  GRU's share of the old state in h' = (1 - z) n + z h, so that a positive bias keeps the state by
  default. torch's RNNs add two bias vectors, ``b_ih + b_hh``: the gate's slice of ``b_ih`` is set
  to the value and that of ``b_hh`` to zero, so their sum is the value; the other gates keep
  torch's init. ``None`` keeps torch's init.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from rfwp_rl.cores.base import Core, State, check_bool, check_positive_int, reset_steps, zero_entries
from rfwp_rl.errors import UserError, check_choice

RECURRENT_INITS = ("default", "orthogonal")


def run_segments(rnn: nn.RNNBase, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
    """``rnn`` over x ``[T, B, I]`` from ``state`` (tensors ``[L, B, H]``), one call per segment
    between the steps where some entry resets (one call when none does), the resetting entries'
    state zeroed in between. Returns y ``[T, B, H]`` and the final state (same layout)."""
    T = x.shape[0]
    # one step (acting): zero the resetting entries without asking the device where they are (no host sync)
    flags = [reset is not None] if T == 1 else reset_steps(reset, T)
    bounds = [0] + [t for t in range(1, T) if flags[t]] + [T]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if flags[a]:
            state = tuple(zero_entries(s, reset[a], dim=1) for s in state)
        out, new = rnn(x[a:b], state if len(state) > 1 else state[0])
        state = tuple(new) if isinstance(new, tuple) else (new,)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else torch.cat(outs)), state


def check_recurrent_init(value: Any) -> str:
    return check_choice("recurrent_init", value, RECURRENT_INITS)


def check_gate_bias(name: str, value: Any) -> float | None:
    """``forget_bias`` / ``update_bias``: None or a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(
            f"{name} {value!r} is invalid; allowed: a finite number "
            "(the gate's bias at init), or unset for torch's init"
        )
    return float(value)


@torch.no_grad()
def init_recurrent(rnn: nn.RNNBase, recurrent_init: str) -> None:
    """``orthogonal``: every gate block ``[H, H]`` of every layer's ``weight_hh`` orthogonal;
    ``default``: leave torch's init (and the random stream) as it is."""
    if recurrent_init == "default":
        return
    for layer in range(rnn.num_layers):
        for block in getattr(rnn, f"weight_hh_l{layer}").split(rnn.hidden_size, dim=0):
            nn.init.orthogonal_(block)


@torch.no_grad()
def init_gate_bias(rnn: nn.RNNBase, gate: int, value: float | None) -> None:
    """Bias ``b_ih + b_hh = value`` of gate number ``gate`` in every layer (torch's gate order:
    LSTM i, f, g, o; GRU r, z, n)."""
    if value is None:
        return
    H = rnn.hidden_size
    for layer in range(rnn.num_layers):
        getattr(rnn, f"bias_ih_l{layer}")[gate * H : (gate + 1) * H] = value
        getattr(rnn, f"bias_hh_l{layer}")[gate * H : (gate + 1) * H] = 0.0


class TorchRNNCore(Core):
    """Base of ``lstm`` and ``gru``: ``num_layers`` layers of ``hidden_size`` units; y
    ``[T, B, hidden_size]``; ``num_states`` state tensors, each ``[B, num_layers, hidden_size]``
    (batch first, unlike torch's ``[L, B, H]``). Subclasses make their torch module after
    ``super().__init__`` and implement ``_run`` on the ``[L, B, H]`` layout."""

    num_states: int

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int,
        detach_state_every_step: bool,
        recurrent_init: str,
        **config: Any,
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.detach_state_every_step = check_bool("detach_state_every_step", detach_state_every_step)
        self.recurrent_init = check_recurrent_init(recurrent_init)
        self.config = {
            "hidden_size": hidden_size,
            "num_layers": num_layers,
            "detach_state_every_step": detach_state_every_step,
            **config,
            "recurrent_init": recurrent_init,
        }

    def _run(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """x ``[T, B, I]``, state tensors ``[L, B, H]`` -> y ``[T, B, H]``, final state (same layout)."""
        raise NotImplementedError

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return [(batch_size, self.num_layers, self.hidden_size)] * self.num_states

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        y, state = self._run(x, tuple(s.transpose(0, 1).contiguous() for s in state), reset)
        return y, tuple(s.transpose(0, 1) for s in state)
