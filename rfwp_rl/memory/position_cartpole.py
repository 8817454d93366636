"""PositionOnlyCartPole: CartPole-v1 whose observation hides the two velocities.

The cart-pole dynamics of gymnasium's ``CartPoleEnv`` (Barto, Sutton & Anderson 1983) with the
cart velocity and the pole's angular velocity zeroed in every observation, so a policy must
infer them from successive positions: a dense-reward control task that needs a (short) memory,
like POPGym's stateless cart-pole. The reward is ``1 / max_steps`` per step, so the return is
the fraction of the step limit the pole stayed up: 1.0 = balanced to the limit, where the
episode is truncated (not terminated: the learner bootstraps there).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

from rfwp_rl.memory.base import check_int, resolve_level

TASK = "PositionOnlyCartPole"
VELOCITIES = (1, 3)  # cart velocity, pole angular velocity in CartPole's observation


class PositionOnlyCartPole(gymnasium.Env):
    """CartPole with observations ``[x, 0, θ, 0]`` (``float32 [4]``), ``Discrete(2)`` actions,
    reward ``1 / max_steps`` per step, truncated after ``max_steps`` steps."""

    metadata = {"render_modes": []}

    def __init__(self, level: str = "easy", **overrides: Any) -> None:
        self.task, self.level = TASK, level
        self.params = resolve_level(TASK, level, overrides)
        self.max_episode_steps = check_int(TASK, "max_steps", self.params["max_steps"], 1)
        self.memory_horizon = 1  # a velocity is the difference of two successive positions
        self.optimal_return = 1.0  # balanced to the limit (optimal_action() does it, tested)
        self._cartpole = CartPoleEnv()
        self.observation_space = self._cartpole.observation_space
        self.action_space = self._cartpole.action_space
        self._steps = 0
        self._previous: np.ndarray | None = None

    def _hide(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32).copy()
        self._true = obs.copy()
        obs[list(VELOCITIES)] = 0.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        obs, info = self._cartpole.reset(seed=int(self.np_random.integers(2**31)))
        self._steps, self._previous = 0, None
        return self._hide(obs), info

    def step(self, action: int):
        self._previous = self._true.copy()
        obs, _, terminated, _, info = self._cartpole.step(int(action))
        self._steps += 1
        truncated = not terminated and self._steps >= self.max_episode_steps
        return self._hide(obs), 1.0 / self.max_episode_steps, bool(terminated), truncated, info

    def optimal_action(self) -> int:
        """A linear controller on the positions and their finite differences (what an agent
        with memory can compute from its observations); balances to the step limit."""
        x, theta = self._true[0], self._true[2]
        if self._previous is None:
            x_dot = theta_dot = 0.0
        else:
            tau = self._cartpole.tau
            x_dot, theta_dot = (x - self._previous[0]) / tau, (theta - self._previous[2]) / tau
        return int(3.0 * theta + theta_dot + 0.1 * x + 0.5 * x_dot > 0.0)
