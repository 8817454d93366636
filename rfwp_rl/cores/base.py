"""What every core shares: the call contract, input checks, resets, 1-step-BPTT mode.

Contract (used by every trainer)::

    state = core.initial_state(batch_size, device=None, dtype=None)  # tuple, batch is dim 0
    y, state = core(x, state, reset)   # x [T, B, input_size], reset [T, B] bool or None
                                        # y [T, B, core.output_size]

``reset[t, b]`` True sets entry ``b``'s state to its initial value (zeros) *before* step
``t``. One call on T steps equals T calls of one step carrying the state. Gradients flow
through the state over the whole call unless ``detach_state_every_step`` is set, which
detaches the state before every step (the 1-step BPTT of the reference Atari code).

Acting one step at a time from a zero state (the next input depends on the output)::

    stepper = core.stepper(batch_size)     # state starts at core.initial_state(batch_size)
    y = stepper.step(x)                     # x [B, input_size] -> y [B, output_size]

A core may return a cheaper stepper that computes the same values (``fwm`` does when the
stepper is made without gradients, for acting: the fused op's incremental stepper, which
refuses to step with gradients enabled); ``specialised=False`` asks for the generic one, which
calls ``core(x[None], state)`` and gives the same values and gradients as one call. A core
with ``act_without_gradients`` (``fwm``) tells trainers to act without gradients and then call
it once on the whole episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from rfwp_rl.errors import UserError, check_choice

# the state helpers of every recurrence (reset before a step, no gradient across it)
from rfwp_rl.ops.common import reset_steps, zero_entries  # noqa: F401
from rfwp_rl.ops.dispatch import BACKENDS

State = tuple[Tensor, ...]


@dataclass(frozen=True)
class CoreSpec:
    """What ``rfwp_rl.cores.available()`` reports about a core.

    name: the name passed to ``make``; description: one line; equations: paper and equation
    numbers implemented; defaults: every accepted config key with its default value.
    """

    name: str
    description: str
    equations: str
    defaults: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------- config checks

# Sizes read from a preset, a checkpoint or a flag are bounded before any memory is taken, so that
# an absurd value is a one-line error instead of a machine out of memory.
MAX_SIZE = 2**20
"""The largest integer option of a core or an agent (a width, a count, a period)."""
MAX_REPEATS = 1024
"""The largest count of repeated modules or steps per token (layers, reads, Householder steps)."""
MAX_PARAMETERS = 2**28
"""The most weights a core or an agent may have; counted on the meta device before it is built."""


def check_size(what: str, value: Any, limit: int = MAX_SIZE) -> None:
    """A one-line UserError if the integer ``value`` is above ``limit``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > limit:
        raise UserError(f"{what} {value!r} is too large; allowed: at most {limit:,}")


def build_bounded(what: str, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()``, after a build on the meta device (no memory) showed at most :data:`MAX_PARAMETERS`
    weights; else a one-line UserError naming ``what``."""
    with torch.device("meta"):
        count = sum(p.numel() for p in build().parameters())
    if count > MAX_PARAMETERS:
        raise UserError(
            f"{what} would have {count:,} parameters; allowed: at most {MAX_PARAMETERS:,} (a size is too large)"
        )
    return build()


def check_positive_int(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{what} {value!r} is invalid; allowed: an integer >= 1")
    return value


def check_non_negative_int(what: str, value: Any, zero: str) -> int:
    """An integer >= 0 whose 0 means ``zero`` (named in the error)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{what} {value!r} is invalid; allowed: 0 ({zero}) or an integer >= 1")
    return value


def check_positive_float(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < float("inf"):
        raise UserError(f"{what} {value!r} is invalid; allowed: a finite number > 0")
    return float(value)


def check_dropout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise UserError(f"dropout {value!r} is invalid; allowed: a number in [0, 1)")
    return float(value)


def check_bool(what: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{what} {value!r} is invalid; allowed: true or false")
    return value


def check_heads(hidden_size: int, num_heads: int) -> int:
    """Head size ``hidden_size // num_heads``; one-line error if it does not divide."""
    if hidden_size % num_heads:
        raise UserError(
            f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
            f"allowed: hidden_size a multiple of num_heads"
        )
    return hidden_size // num_heads


# ------------------------------------------------------------------------- the base class


class Core(nn.Module):
    """Base of every core. Subclasses set ``input_size``, ``output_size``,
    ``detach_state_every_step`` and implement ``state_shapes`` and ``_forward``.

    ``config`` holds the full configuration the core was made with (for checkpoint meta).
    """

    name: str = "core"
    input_size: int
    output_size: int
    detach_state_every_step: bool = False
    act_without_gradients: bool = False
    """True when the stepper made without gradients is much cheaper than stepping with them
    (``fwm``: the fused incremental stepper): a trainer that needs gradients of an episode it
    acts then steps without gradients and calls the core once on the whole episode (the same
    numbers) instead of stepping with gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.config: dict[str, Any] = {}

    # -- to implement -----------------------------------------------------------------
    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        """Shapes of the state tensors for ``batch_size`` (batch is dim 0 of each)."""
        raise NotImplementedError

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        """The computation on checked inputs: x ``[T,B,input_size]``, reset ``[T,B]`` bool."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------
    def initial_state(
        self, batch_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> State:
        """Zeros of ``state_shapes(batch_size)``; device/dtype default to the parameters'."""
        p = next(self.parameters(), None)
        device = device if device is not None else (p.device if p is not None else None)
        dtype = dtype if dtype is not None else (p.dtype if p is not None else None)
        return tuple(torch.zeros(s, device=device, dtype=dtype) for s in self.state_shapes(batch_size))

    def forward(
        self, x: Tensor, state: Sequence[Tensor] | None = None, reset: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """y ``[T, B, output_size]`` and the state after the last step.

        x: ``[T, B, input_size]``; state: from ``initial_state`` or a previous call (None =
        zeros); reset: ``[T, B]`` (bool; other dtypes: nonzero means reset) or None.
        """
        state, reset = self._check_call(x, state, reset)
        if not self.detach_state_every_step:
            return self._forward(x, state, reset)
        # 1-step BPTT: the state entering each step carries no gradient.
        ys = []
        for t in range(x.shape[0]):
            state = tuple(s.detach() for s in state)
            y, state = self._forward(x[t : t + 1], state, None if reset is None else reset[t : t + 1])
            ys.append(y)
        return torch.cat(ys), state

    def _check_call(
        self, x: Tensor, state: Sequence[Tensor] | None, reset: Tensor | None
    ) -> tuple[State, Tensor | None]:
        if (
            not isinstance(x, Tensor)
            or x.dim() != 3
            or x.shape[-1] != self.input_size
            or x.shape[0] == 0
            or x.shape[1] == 0
        ):
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise UserError(
                f"core {self.name!r}: input x has shape {got}; allowed: "
                f"[T, B, {self.input_size}] (time, batch, input_size; T, B >= 1)"
            )
        T, B = x.shape[0], x.shape[1]
        if reset is not None:
            if not isinstance(reset, Tensor) or tuple(reset.shape) != (T, B):
                got = tuple(reset.shape) if isinstance(reset, Tensor) else type(reset).__name__
                raise UserError(f"core {self.name!r}: reset has shape {got}; allowed: [T, B] = [{T}, {B}] or None")
            reset = reset.to(device=x.device, dtype=torch.bool)
            # an all-False reset is dropped where the test is free; on a GPU it would wait for the device
            if reset.device.type == "cpu" and not bool(reset.any()):
                reset = None
        if state is None:
            return self.initial_state(B, x.device, x.dtype), reset
        state = tuple(state)
        shapes = self.state_shapes(B)
        if len(state) != len(shapes):
            raise UserError(
                f"core {self.name!r}: state has {len(state)} tensors; allowed: "
                f"{len(shapes)} (use core.initial_state(batch_size))"
            )
        for i, (s, shape) in enumerate(zip(state, shapes)):
            if tuple(s.shape) != shape:
                raise UserError(
                    f"core {self.name!r}: state[{i}] has shape {tuple(s.shape)}; "
                    f"allowed: {shape} for batch {B} "
                    "(use core.initial_state(batch_size))"
                )
        return state, reset

    def stepper(
        self, batch_size: int, device: torch.device | str | None = None, specialised: bool = True, record: bool = False
    ) -> CoreStepper:
        """A one-step-at-a-time runner from ``initial_state(batch_size)`` (module docstring).

        Subclasses with a cheaper exact stepping override this and return it when
        ``specialised`` is True; its values must equal the generic stepper's (and its
        gradients, unless it refuses to step with gradients enabled). ``record`` asks a stepper
        made without gradients to keep what its ``replay()`` needs (the outputs of the steps
        taken, with gradients, without computing them again); ``replay()`` returns None where
        there is no record, as for the generic stepper.
        """
        return CoreStepper(self, batch_size, device)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.items())


class CoreStepper:
    """Generic stepping through the contract: ``y, state = core(x[None], state)``.

    ``step(x [B, input_size]) -> y [B, output_size]``; gradients flow through the carried
    state exactly as in one call on the whole sequence.
    """

    def __init__(self, core: Core, batch_size: int, device: torch.device | str | None = None) -> None:
        self.core = core
        self.state = core.initial_state(batch_size, device=device)

    def step(self, x: Tensor) -> Tensor:
        y, self.state = self.core(x.unsqueeze(0), self.state)
        return y[0]

    def replay(self) -> None:
        """No record: the caller runs the core on the whole sequence instead."""
        return None


def check_backend(backend: Any) -> str:
    return check_choice("backend", backend, BACKENDS)
