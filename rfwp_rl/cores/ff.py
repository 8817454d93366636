"""``ff``: no recurrence (the feedforward baseline). The output is the input."""

from __future__ import annotations

from torch import Tensor

from rfwp_rl.cores.base import Core, CoreSpec, State

SPEC = CoreSpec(
    name="ff",
    description="no recurrence: identity core (feedforward baseline), output_size = input_size",
    equations="-",
    defaults={},
)


class FFCore(Core):
    """Identity: ``y = x`` ([T, B, input_size]); the state is the empty tuple."""

    name = "ff"

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.input_size = self.output_size = input_size
        self.config = {}

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        return []

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        return x, ()
