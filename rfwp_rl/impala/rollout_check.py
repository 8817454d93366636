"""What a rollout from a remote actor must look like before the learner trains on it.

The expected layout is taken once, at server start, from what a local actor stores
(:func:`rfwp_rl.impala.actors.rollout_spec` of the agent's spaces); each received rollout is then
checked tensor by tensor against it (:class:`RolloutCheck`): exactly the layout's keys, each tensor of
exactly its dtype and shape ``[T+1, b, ...]`` with one ``b`` for all and ``1 <= b <= max_envs``,
floating values finite, rewards within :func:`reward_bounds`, actions in the action space (the action
distribution's ``valid``), the core state of the agent's shapes and dtypes, and the finished episodes
bounded and finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from rfwp_rl.impala.wire import Refused, check_finite_number, check_int

Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]  # key -> (dtype, shape of one env's entry)
ACTION_KEYS = ("action", "prev_action")
MAX_EPISODE_STEPS = 10**9
# One step's reward from a remote actor, for an env that declares no finite reward_range: beyond this
# magnitude a reward is taken for an attack or a bug (the V-trace targets of such rewards would swamp
# every other batch's); far past any game score a single step of a supported env gives.
MAX_ABS_REWARD = 1e9


def reward_bounds(declared: tuple[float, float] | None) -> tuple[float, float]:
    """``(low, high)`` of the rewards a remote rollout may hold: the env's declared ``reward_range`` where an
    end is finite, else -/+ :data:`MAX_ABS_REWARD`; 0 always (an env pool's blank and reset entries)."""
    low, high = declared if declared is not None else (-math.inf, math.inf)
    low = low if math.isfinite(low) else -MAX_ABS_REWARD
    high = high if math.isfinite(high) else MAX_ABS_REWARD
    return min(low, 0.0), max(high, 0.0)


class RolloutCheck:
    """Checks received rollouts against a :data:`Layout` (see the module docstring).

    Args:
        layout: from :func:`rfwp_rl.impala.actors.rollout_spec`.
        state_spec: ``[(shape, dtype)]`` of the core state tensors, per env.
        unroll_length: T (a rollout has T+1 entries).
        max_envs: the most envs one rollout may carry.
        actions_ok: the action space's check of a tensor of actions (``ActionDistribution.valid``).
        reward_range: the env's declared reward range, if any (:func:`reward_bounds`).
    """

    def __init__(
        self,
        layout: Layout,
        state_spec: list[tuple[tuple[int, ...], torch.dtype]],
        unroll_length: int,
        max_envs: int,
        actions_ok: Callable[[torch.Tensor], bool],
        reward_range: tuple[float, float] | None = None,
    ):
        self.layout, self.state_spec = dict(layout), list(state_spec)
        self.length, self.max_envs, self.actions_ok = unroll_length + 1, int(max_envs), actions_ok
        self.rewards = reward_bounds(reward_range)

    def envs(self, data: Any, state: Any) -> int:
        """The rollout's env count ``b``; :class:`Refused` (naming the first problem) unless it fits."""
        if not isinstance(data, dict) or set(data) != set(self.layout):
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise Refused(f"rollout keys must be {sorted(self.layout)}, got {keys}")
        b = None
        for key, (dtype, shape) in self.layout.items():
            t = data[key]
            if not isinstance(t, torch.Tensor) or t.dim() < 2:
                raise Refused(f"rollout {key} must be a tensor [T+1, b, ...]")
            b = int(t.shape[1]) if b is None else b
            if not 1 <= b <= self.max_envs:
                raise Refused(f"rollout has {b} envs; allowed: 1..{self.max_envs}")
            want = (self.length, b, *shape)
            if t.dtype != dtype or tuple(t.shape) != want:
                raise Refused(f"rollout {key} is {list(t.shape)} {t.dtype}; the learner needs {list(want)} {dtype}")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise Refused(f"rollout {key} holds NaN or inf values")
            if key == "reward" and not bool(((t >= self.rewards[0]) & (t <= self.rewards[1])).all()):
                raise Refused(
                    f"rollout reward holds values outside [{self.rewards[0]:g}, {self.rewards[1]:g}] (from "
                    f"{float(t.min()):g} to {float(t.max()):g})"
                )
            if key in ACTION_KEYS and not self.actions_ok(t):
                raise Refused(
                    f"rollout {key} holds actions outside the action space "
                    f"({getattr(self.actions_ok, '__self__', 'see the env')})"
                )
        if not isinstance(state, (tuple, list)) or len(state) != len(self.state_spec):
            raise Refused(f"rollout core state must be a tuple of {len(self.state_spec)} tensors")
        for i, (s, (shape, dtype)) in enumerate(zip(state, self.state_spec)):
            if not isinstance(s, torch.Tensor) or tuple(s.shape) != (b, *shape) or s.dtype != dtype:
                raise Refused(f"rollout core state {i} must be [{', '.join(map(str, (b, *shape)))}] {dtype}")
            if s.is_floating_point() and not bool(torch.isfinite(s).all()):
                raise Refused(f"rollout core state {i} holds NaN or inf values")
        return b

    def episodes(self, episodes: Any, envs: int) -> list[tuple[float, int]]:
        """``[(return, length)]`` of the episodes an actor reports with a rollout: at most the episodes
        its envs can have ended meanwhile (two rollouts' worth of steps per env), finite returns."""
        limit = 4 * envs * self.length
        if not isinstance(episodes, (list, tuple)) or len(episodes) > limit:
            raise Refused(f"episodes must be a list of at most {limit} (return, length) pairs")
        out = []
        for i, item in enumerate(episodes):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise Refused(f"episode {i} must be a (return, length) pair")
            out.append(
                (
                    check_finite_number(item[0], f"episode {i} return"),
                    check_int(item[1], f"episode {i} length", 0, MAX_EPISODE_STEPS),
                )
            )
        return out
