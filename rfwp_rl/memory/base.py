"""Shared parts of the memory tasks: levels, parameter checks, precomputed episodes.

Every task is a :class:`MemoryEnv`: a ``gymnasium.Env`` with a flat ``float32`` Box
observation of 0/1 entries and a ``Discrete(n)`` action space, built from a difficulty level
whose parameters (:data:`rfwp_rl.memory.suite.LEVEL_PARAMS`) any keyword argument overrides.
All randomness comes from ``self.np_random``, so ``reset(seed=s)`` fixes the episode.

Tasks whose observations do not depend on the actions (everything but navigation) derive
from :class:`SequenceTask`: ``reset`` draws the whole episode at once (observations, the
correct answer and its reward per step), and ``step`` only compares the action with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.memory.suite import LEVEL_PARAMS, LEVELS


def check_int(task: str, name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int if it is an integer in ``minimum..maximum``, else a one-line UserError
    such as ``DelayedRecall: delay 0 is invalid; allowed: an integer >= 1``."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if ok and value >= minimum and (maximum is None or value <= maximum):
        return int(value)
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer in {minimum}..{maximum}"
    raise UserError(f"{task}: {name} {value!r} is invalid; allowed: {allowed}")


def resolve_level(task: str, level: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The level's parameters with the keyword arguments on top (unknown level or option
    name: one-line UserError with the allowed names)."""
    if not isinstance(level, str):
        raise UserError(f"{task}: level {level!r} is invalid; allowed: {', '.join(LEVELS)}")
    check_choice(f"{task} level", level, LEVELS)
    params = dict(LEVEL_PARAMS[task][level])
    for name in overrides:
        check_choice(f"{task} option", name, params)
    params.update(overrides)
    return params


class MemoryEnv(gymnasium.Env):
    """Common interface of the memory tasks.

    Subclasses set ``observation_space`` (Box of 0/1, ``float32 [D]``), ``action_space``
    (``Discrete(n)``) and implement :meth:`optimal_action` and the four numbers below.

    Attributes:
        task: task name, e.g. ``"DelayedRecall"``.
        level: the level the parameters started from.
        params: effective parameters (level values with keyword overrides applied).
        max_episode_steps: the most steps an episode can have (fixed-length tasks: the length).
        memory_horizon: the most steps between seeing an item and the step whose action needs it.
        optimal_return: return of the policy that always takes :meth:`optimal_action`.
        random_return: expected return of the uniformly random policy.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    task: str = ""

    def __init__(self, level: str, overrides: dict[str, Any]) -> None:
        # overrides: the subclass's keyword arguments, names as in LEVEL_PARAMS
        self.level = level
        self.params = resolve_level(self.task, level, overrides)
        self.render_mode = None

    @property
    def max_episode_steps(self) -> int:
        raise NotImplementedError

    @property
    def memory_horizon(self) -> int:
        raise NotImplementedError

    @property
    def optimal_return(self) -> float:
        raise NotImplementedError

    @property
    def random_return(self) -> float:
        raise NotImplementedError

    def optimal_action(self) -> int:
        """The action an optimal agent takes now (it may look at the hidden state)."""
        raise NotImplementedError

    def _check_action(self, action: Any) -> int:
        if not self.action_space.contains(action):
            raise ValueError(f"{self.task}: action {action!r} is not in {self.action_space}")
        return int(action)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.task}(level={self.level!r}, {args})"


@dataclass
class Episode:
    """A whole episode of a :class:`SequenceTask`, drawn at reset.

    obs: ``float32 [T, D]``, the observation before each of the T actions.
    target: ``int64 [T]``, the correct action at each step, -1 where the action is not scored.
    reward: ``float64 [T]``, the reward of a correct action at each step (0 where not scored).
    """

    obs: np.ndarray
    target: np.ndarray
    reward: np.ndarray

    @classmethod
    def empty(cls, length: int, obs_size: int) -> Episode:
        return cls(
            np.zeros((length, obs_size), np.float32), np.full(length, -1, np.int64), np.zeros(length, np.float64)
        )


class SequenceTask(MemoryEnv):
    """A task whose observations do not depend on the actions.

    An episode has exactly ``episode_length`` steps; the step at which the action is
    compared with ``Episode.target`` pays ``Episode.reward`` for a correct action and 0 for a
    wrong one; actions at unscored steps change nothing. The episode terminates after the
    last step (``terminated=True``; no truncation), whose returned observation is all zeros.
    """

    def _generate(self) -> Episode:
        raise NotImplementedError

    @property
    def episode_length(self) -> int:
        raise NotImplementedError

    @property
    def max_episode_steps(self) -> int:
        return self.episode_length

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._episode = self._generate()
        self._t = 0
        return self._episode.obs[0].copy(), {}

    def step(self, action: Any):
        action = self._check_action(action)
        ep = getattr(self, "_episode", None)
        if ep is None or self._t >= len(ep.target):
            raise RuntimeError(f"{self.task}: the episode is over (or never started); call reset()")
        t = self._t
        target = int(ep.target[t])
        reward = float(ep.reward[t]) if target >= 0 and action == target else 0.0
        self._t = t + 1
        terminated = self._t == len(ep.target)
        obs = np.zeros_like(ep.obs[0]) if terminated else ep.obs[self._t].copy()
        return obs, reward, terminated, False, {}

    @property
    def episode(self) -> Episode:
        """The episode drawn by the last ``reset`` (observations, answers and rewards of every step)."""
        ep = getattr(self, "_episode", None)
        if ep is None:
            raise RuntimeError(f"{self.task}: no episode yet; call reset()")
        return ep

    def optimal_action(self) -> int:
        """The scored answer at a scored step, else 0 (any action does there)."""
        ep = getattr(self, "_episode", None)
        if ep is None or self._t >= len(ep.target):
            raise RuntimeError(f"{self.task}: the episode is over (or never started); call reset()")
        return max(int(ep.target[self._t]), 0)

    @property
    def optimal_return(self) -> float:
        return 1.0

    @property
    def random_return(self) -> float:
        # every scored step is answered correctly with probability 1/n; the rewards of one
        # episode's scored steps add up to 1
        return 1.0 / int(self.action_space.n)
