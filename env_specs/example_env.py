"""How to add a new environment: a T-maze memory task in one file.

The agent sees a cue (left or right) only on the first step, walks down a corridor, and at the
junction must turn the way the cue said: +1 if right, -1 if wrong. Solving it needs memory,
which makes it a small test bed for the recurrent and fast-weight cores.

Three things make an environment usable by rfwp-rl:
1. a ``gymnasium.Env`` whose spaces the agent supports (this one: ``Discrete`` actions, a ``Box``
   observation; every supported space: the README's "Environments and spaces");
2. ``gymnasium.register(...)`` of an id when this module is imported;
3. the trainer imports the module before it calls ``make_env``:

    rfwp-rl train --env env_specs/example_env.py:rfwp_examples/TMaze-v0 --core lstm
    # or, for a module on the Python path:  --env mypackage.mymodule:TMaze-v0

Optionally, an int attribute ``memory_horizon`` on the env (the most steps a memory must span, cue to
use) sets the vector profile's unroll to twice it; without it the unroll is twice the episode limit, at
most 128 steps (``docs/profiles/vector.md``). This maze leaves it out: a walker that bumps into the
wall keeps the cue longer than the corridor, up to the 50-step limit.

Check it without training:  python env_specs/example_env.py
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "rfwp_examples/TMaze-v0"

FORWARD, LEFT, RIGHT = 0, 1, 2


class TMaze(gymnasium.Env):
    """Observation float32 [4]: (cue says left, cue says right, at junction, 1)."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.action_space = spaces.Discrete(3)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(4,), dtype=np.float32)
        self._pos = 0
        self._goal = LEFT

    def _obs(self, show_cue: bool) -> np.ndarray:
        obs = np.zeros(4, dtype=np.float32)
        if show_cue:
            obs[0 if self._goal == LEFT else 1] = 1.0
        obs[2] = float(self._pos == self.length)
        obs[3] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)  # seeds self.np_random
        self._pos = 0
        self._goal = LEFT if self.np_random.random() < 0.5 else RIGHT
        return self._obs(show_cue=True), {}

    def step(self, action: int):
        action = int(action)
        if self._pos < self.length:
            if action == FORWARD:
                self._pos += 1
            return self._obs(False), (0.0 if action == FORWARD else -0.01), False, False, {}
        if action == FORWARD:  # bumping into the wall at the junction
            return self._obs(False), -0.01, False, False, {}
        reward = 1.0 if action == self._goal else -1.0
        return self._obs(False), reward, True, False, {}


# Idempotent: the module may be imported by path more than once. The entry point may be the
# class itself (works for modules imported by path) or a "package.module:Class" string.
if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=TMaze, max_episode_steps=50, kwargs={"length": 5})


if __name__ == "__main__":
    from rfwp_rl.envs import env_spec, make_env

    print(env_spec(ENV_ID))
    env = make_env(ENV_ID, seed=0)
    obs, _ = env.reset()
    total, done = 0.0, False
    while not done:  # a random policy: about half its turns are right
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += float(reward)
        done = terminated or truncated
    print(f"random episode: return {total:.2f}, length {info['episode']['l']}")
