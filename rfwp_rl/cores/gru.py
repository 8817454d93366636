"""``gru``: torch ``nn.GRU`` (Cho et al. 2014), one call per segment between reset times.

The equations are torch's (``nn.GRU`` documentation; gate order r, z, n)::

    r = σ(W_ir x + b_ir + W_hr h + b_hr)
    z = σ(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
    h' = (1 - z) ⊙ n + z ⊙ h

cuDNN runs it on CUDA; on the CPU it is torch's own kernel (no fused op: one ``nn.GRU`` call
per segment between steps where some entry resets, one call when none does).
"""

from __future__ import annotations

from torch import Tensor, nn

from rfwp_rl.cores.base import CoreSpec, State
from rfwp_rl.cores.torch_rnn import TorchRNNCore, check_gate_bias, init_gate_bias, init_recurrent, run_segments

SPEC = CoreSpec(
    name="gru",
    description="GRU (torch nn.GRU); state (h,) [B, num_layers, hidden_size]",
    equations="Cho et al. 2014 (nn.GRU: the reset gate scales W_hn h + b_hn)",
    defaults={
        "hidden_size": 256,
        "num_layers": 1,
        "detach_state_every_step": False,
        "recurrent_init": "default",
        "update_bias": None,
    },
)


class GRUCore(TorchRNNCore):
    """``nn.GRU(input_size, hidden_size, num_layers)``; y ``[T, B, hidden_size]``.

    State: ``(h,)``, ``[B, num_layers, hidden_size]`` (batch first, unlike nn.GRU).
    ``recurrent_init`` (``default`` or ``orthogonal``) and ``update_bias`` (None: torch's init):
    :mod:`rfwp_rl.cores.torch_rnn`.
    """

    name = "gru"
    num_states = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 256,
        num_layers: int = 1,
        detach_state_every_step: bool = False,
        recurrent_init: str = "default",
        update_bias: float | None = None,
    ) -> None:
        update_bias = check_gate_bias("update_bias", update_bias)
        super().__init__(
            input_size, hidden_size, num_layers, detach_state_every_step, recurrent_init, update_bias=update_bias
        )
        self.gru = nn.GRU(input_size, hidden_size, num_layers)
        init_recurrent(self.gru, recurrent_init)
        init_gate_bias(self.gru, 1, update_bias)  # gate order r, z, n

    def _run(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        return run_segments(self.gru, x, state, reset)
