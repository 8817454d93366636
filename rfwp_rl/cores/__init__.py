"""The shared recurrent cores: one contract for every trainer.

    core = rfwp_rl.cores.make(name, input_size, **config)     # an nn.Module
    core.output_size                                           # int
    state = core.initial_state(batch_size, device=None, dtype=None)   # tuple, batch is dim 0
    y, state = core(x, state, reset)    # x [T, B, input_size], reset [T, B] bool or None
    stepper = core.stepper(batch_size)  # acting one step at a time from the zero state:
    y_t = stepper.step(x_t)             # x_t [B, input_size] -> y_t [B, output_size]

``reset[t, b]`` True sets entry b's state to zeros before step t. One call on T steps equals
T calls of one step carrying the state; gradients flow through the whole call unless
``detach_state_every_step=True`` (every recurrent core accepts it). ``stepper`` gives the same
values and gradients as one call on the whole sequence (:mod:`rfwp_rl.cores.base` has the full
contract; made without gradients, for acting, ``fwm`` returns the fused op's incremental
stepper).

``available()`` lists every core with its equations and default config. Other modules add
cores with ``register(spec, cls)`` where ``cls(input_size, **config)`` builds the core;
``rfwp_rl.cores.lm_cores`` (the language-modelling variants), when present, is imported on
first use of ``make``/``available``.

Adding a core: subclass :class:`rfwp_rl.cores.base.Core` (set ``input_size``,
``output_size``, ``detach_state_every_step``; implement ``state_shapes`` and ``_forward``;
``forward``, resets, input checks and the generic ``stepper`` come with the base class), or,
for a Transformer-like fast-weight block stack, subclass
:class:`rfwp_rl.cores.fast_weight.FastWeightCore` with your own ``sublayer_cls`` (or pass
``sublayer_cls=`` at construction, as :mod:`rfwp_rl.cores.lm_cores` does; the public
``rfwp_rl.ops.common.read`` / ``delta_update`` help write the recurrence). Register it with a
:class:`CoreSpec` whose ``defaults`` list every config key, and add a small config for it to
``SMALL`` in ``tests/test_cores.py``: the contract tests (chunking, resets, gradients, state
layout, stepping) run on every registered core, and a core without a small config fails
``test_every_registered_core_has_a_small_config``.

Built-in cores: ``ff`` (identity), ``lstm``, ``gru``, ``lt``, ``delta``, ``delta_rnn``, ``rdn``
(fast-weight block stacks, :mod:`rfwp_rl.cores.fast_weight`), ``fwm``
(:mod:`rfwp_rl.cores.fwm`); language-modelling variants ``delta_lstm``, ``delta_mlp``,
``delta_delta`` (:mod:`rfwp_rl.cores.lm_cores`); ``gated_delta`` (Gated DeltaNet) and
``delta_product`` (DeltaProduct) (:mod:`rfwp_rl.cores.householder`); ``srwm`` (self-referential
weight matrix, :mod:`rfwp_rl.cores.srwm`).
``ffm``: Fast and Forgetful Memory (:mod:`rfwp_rl.cores.ffm`).
``lru``: the Linear Recurrent Unit (:mod:`rfwp_rl.cores.lru`).
``mlstm``: xLSTM's matrix-memory cell (:mod:`rfwp_rl.cores.mlstm`).
``mamba``: the selective SSM of Mamba (:mod:`rfwp_rl.cores.mamba`).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from torch import nn

from rfwp_rl.cores.base import MAX_REPEATS, Core, CoreSpec, State, build_bounded, check_size
from rfwp_rl.cores.fast_weight import CORES as _FW_CORES
from rfwp_rl.cores.fast_weight import SPECS as _FW_SPECS
from rfwp_rl.cores.ff import SPEC as _FF_SPEC
from rfwp_rl.cores.ff import FFCore
from rfwp_rl.cores.ffm import SPEC as _FFM_SPEC
from rfwp_rl.cores.ffm import FFMCore
from rfwp_rl.cores.fwm import SPEC as _FWM_SPEC
from rfwp_rl.cores.fwm import FWMCore
from rfwp_rl.cores.gru import SPEC as _GRU_SPEC
from rfwp_rl.cores.gru import GRUCore
from rfwp_rl.cores.householder import CORES as _HOUSEHOLDER_CORES
from rfwp_rl.cores.householder import SPECS as _HOUSEHOLDER_SPECS
from rfwp_rl.cores.lru import SPEC as _LRU_SPEC
from rfwp_rl.cores.lru import LRUCore
from rfwp_rl.cores.lstm import SPEC as _LSTM_SPEC
from rfwp_rl.cores.lstm import LSTMCore
from rfwp_rl.cores.mamba import SPEC as _MAMBA_SPEC
from rfwp_rl.cores.mamba import MambaCore
from rfwp_rl.cores.mlstm import SPEC as _MLSTM_SPEC
from rfwp_rl.cores.mlstm import MLSTMCore
from rfwp_rl.cores.srwm import SPEC as _SRWM_SPEC
from rfwp_rl.cores.srwm import SRWMCore
from rfwp_rl.errors import UserError, check_choice, choices_hint

__all__ = ["Core", "CoreSpec", "State", "available", "make", "register"]

_REGISTRY: dict[str, tuple[CoreSpec, Callable[..., nn.Module]]] = {}
_PLUGINS = ("rfwp_rl.cores.lm_cores",)
_plugins_loaded = False


def register(spec: CoreSpec, cls: Callable[..., nn.Module]) -> None:
    """Add core ``spec.name``, built by ``cls(input_size, **config)``.

    ``spec.defaults`` must list every config key the core accepts. Registering the same
    name again replaces the entry only if it is the same class (module reloads).
    """
    old = _REGISTRY.get(spec.name)
    if old is not None and (getattr(old[1], "__module__", None), getattr(old[1], "__qualname__", None)) != (
        getattr(cls, "__module__", None),
        getattr(cls, "__qualname__", None),
    ):
        raise ValueError(f"core {spec.name!r} is already registered by {old[1]!r}")
    _REGISTRY[spec.name] = (spec, cls)


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for module in _PLUGINS:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def available() -> dict[str, CoreSpec]:
    """``{name: CoreSpec(name, description, equations, defaults)}`` for every core."""
    _load_plugins()
    return {name: spec for name, (spec, _) in _REGISTRY.items()}


def _check_type(core: str, key: str, value: Any, default: Any) -> None:
    """Config values must have the type of their default (ints may stand in for floats)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise UserError(
            f"core {core!r}: {key}={value!r} has type {type(value).__name__}; "
            f"allowed: {type(default).__name__} (default {default!r})"
        )


REPEAT_OPTIONS = ("num_layers", "fast_layers", "num_householder", "num_reads")
"""Integer options that repeat modules or steps: bounded by :data:`rfwp_rl.cores.base.MAX_REPEATS`."""


def make(name: str, input_size: int, **config: Any) -> nn.Module:
    """Build core ``name`` for inputs of size ``input_size`` with ``config`` over its defaults.

    Unknown names, unknown config keys, badly typed values and sizes past the bounds of
    :mod:`rfwp_rl.cores.base` (checked before any memory is taken) raise a one-line UserError.
    """
    _load_plugins()
    check_choice("core", name, _REGISTRY)
    spec, cls = _REGISTRY[name]
    for key, value in config.items():
        if key not in spec.defaults:
            raise UserError(
                f"unknown config key {key!r} for core {name!r}; "
                f"{choices_hint(key, spec.defaults) if spec.defaults else 'allowed: none'}"
            )
        _check_type(name, key, value, spec.defaults[key])
        if key in REPEAT_OPTIONS:
            check_size(f"core {name!r}: {key}", value, MAX_REPEATS)
        else:
            check_size(f"core {name!r}: {key}", value)
    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 1:
        raise UserError(f"input_size {input_size!r} is invalid; allowed: an integer >= 1")
    check_size("core input_size", input_size)
    return build_bounded(f"core {name!r}", lambda: cls(input_size, **{**spec.defaults, **config}))


register(_FF_SPEC, FFCore)
register(_LSTM_SPEC, LSTMCore)
register(_GRU_SPEC, GRUCore)
for _kind, _spec in _FW_SPECS.items():
    register(_spec, _FW_CORES[_kind])
register(_FWM_SPEC, FWMCore)
for _kind, _spec in _HOUSEHOLDER_SPECS.items():
    register(_spec, _HOUSEHOLDER_CORES[_kind])
register(_SRWM_SPEC, SRWMCore)
register(_FFM_SPEC, FFMCore)
register(_LRU_SPEC, LRUCore)
register(_MLSTM_SPEC, MLSTMCore)
register(_MAMBA_SPEC, MambaCore)
