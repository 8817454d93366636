"""``lstm``: torch ``nn.LSTM`` (the Atari baseline: 1 layer of 256 units).

On the CPU (backend ``kernel``, or ``auto`` up to hidden size 64, where it is the faster) each
layer runs the fused ``lstm`` op
(:mod:`rfwp_rl.ops.lstm`: one C++ call per unroll, forward and backward, resets inside the
kernel) on the ``nn.LSTM``'s own parameters, so state dicts do not depend on the backend.
Elsewhere (CUDA: cuDNN), with backend ``reference``, or without built kernels, ``nn.LSTM``
runs once per segment between reset times (one call when the unroll has no reset), zeroing
the resetting entries' (h, c) in between. The initialisation options (``forget_bias``,
``recurrent_init``: :mod:`rfwp_rl.cores.torch_rnn`) set the ``nn.LSTM``'s parameters, which
both paths read.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rfwp_rl.cores.base import CoreSpec, State, check_backend
from rfwp_rl.cores.torch_rnn import TorchRNNCore, check_gate_bias, init_gate_bias, init_recurrent, run_segments
from rfwp_rl.ops import lstm as lstm_op

SPEC = CoreSpec(
    name="lstm",
    description="LSTM (torch nn.LSTM); state (h, c) each [B, num_layers, hidden_size]",
    equations="Hochreiter & Schmidhuber 1997 (nn.LSTM, two bias vectors per gate block)",
    defaults={
        "hidden_size": 256,
        "num_layers": 1,
        "detach_state_every_step": False,
        "backend": "auto",
        "forget_bias": None,
        "recurrent_init": "default",
    },
)


def _fused_layers(lstm: nn.LSTM, x: Tensor, backend: str):
    """The fused op for ``lstm``'s layers on inputs like ``x``, or None where ``nn.LSTM``
    runs (see :func:`rfwp_rl.ops.lstm.layer`; also for the options the op does not have)."""
    if (
        lstm.bidirectional
        or lstm.proj_size
        or lstm.batch_first
        or not lstm.bias
        or (lstm.dropout and lstm.training and lstm.num_layers > 1)
    ):
        return None
    return lstm_op.layer(backend, x, lstm.hidden_size)


def run_lstm(
    lstm: nn.LSTM, x: Tensor, h: Tensor, c: Tensor, reset: Tensor | None, backend: str = "auto"
) -> tuple[Tensor, Tensor, Tensor]:
    """Run ``lstm`` over x ``[T, B, I]`` from (h, c) ``[L, B, H]`` with resets ``[T, B]``.

    Returns the outputs ``[T, B, H]`` and the final (h, c) ``[L, B, H]``. The fused ``lstm``
    op per layer where it runs (``backend`` ``auto``/``kernel`` on the CPU), else one
    ``nn.LSTM`` call per segment between steps where some entry resets.
    """
    op = _fused_layers(lstm, x, backend)
    if op is not None:
        hs, cs = [], []
        for layer in range(lstm.num_layers):
            x, h_l, c_l = op(
                x,
                h[layer],
                c[layer],
                *(getattr(lstm, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
                reset,
            )
            hs.append(h_l)
            cs.append(c_l)
        return x, torch.stack(hs), torch.stack(cs)
    y, (h, c) = run_segments(lstm, x, (h, c), reset)
    return y, h, c


class LSTMCore(TorchRNNCore):
    """``nn.LSTM(input_size, hidden_size, num_layers)``; y ``[T, B, hidden_size]``.

    State: ``(h, c)``, each ``[B, num_layers, hidden_size]`` (batch first, unlike nn.LSTM).
    ``backend``: ``reference`` runs ``nn.LSTM`` always; ``auto``/``kernel`` the fused op on the
    CPU (see the module docstring). ``forget_bias`` (None: torch's init) and ``recurrent_init``
    (``default`` or ``orthogonal``): :mod:`rfwp_rl.cores.torch_rnn`.
    """

    name = "lstm"
    num_states = 2

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 256,
        num_layers: int = 1,
        detach_state_every_step: bool = False,
        backend: str = "auto",
        forget_bias: float | None = None,
        recurrent_init: str = "default",
    ) -> None:
        forget_bias = check_gate_bias("forget_bias", forget_bias)
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            detach_state_every_step,
            recurrent_init,
            backend=backend,
            forget_bias=forget_bias,
        )
        self.backend = check_backend(backend)
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers)
        init_recurrent(self.lstm, recurrent_init)
        init_gate_bias(self.lstm, 1, forget_bias)  # gate order i, f, g, o

    def _run(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        y, h, c = run_lstm(self.lstm, x, *state, reset, self.backend)
        return y, (h, c)
