"""Glue between ``make_env`` (gymnasium API) and ``moolib.EnvPool`` (old gym API).

moolib 0.0.9b0's EnvPool worker calls, per env (see third_party/moolib/README.md):
* ``reset()`` on its first step and right after any step that returned done=True; it takes the
  return value as the observation (a dict of arrays, or one array stored under "state");
* ``step(action: int)`` and reads only items 0, 1, 2 of the result: obs, reward, done.
It adds the keys "reward" (float32) and "done" (bool) itself; every other key of the
observation dict becomes a tensor ``[batch_size, ...]`` of ``EnvPool.step(...).result()``.

:class:`PoolEnv` gives it, per env and step:
    obs             the observation (Atari uint8 [4, 84, 84], else float32 [D])
    episode_return  float32: return of the running episode including this step's reward; on a
                    done step, the return of the episode that just ended
    episode_step    int32: agent steps of the running episode (same convention)
    episode_end     bool: a full episode ended at this step. Equals "done" unless Atari
                    ``episodic_life=True``, where "done" also marks lost lives but
                    ``episode_return`` / ``episode_end`` count full games only.
"done" is ``terminated or truncated`` (time limits end the unroll's episode too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rfwp_rl.envs import make_env


class PoolEnv:
    """Adapter from a ``make_env`` env to the interface ``moolib.EnvPool`` drives."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._return = 0.0
        self._steps = 0
        self._end = False  # the last step ended a full episode
        self._stats: tuple[float, int] | None = None  # (return, steps) of the ended episode

    def _pack(self, obs: np.ndarray, episode_return: float, episode_step: int, end: bool) -> dict[str, np.ndarray]:
        return {
            "obs": obs,
            "episode_return": np.float32(episode_return),
            "episode_step": np.int32(episode_step),
            "episode_end": np.bool_(end),
        }

    def reset(self) -> dict[str, np.ndarray]:
        """New (training) episode. After a done step, reports the ended episode's stats."""
        obs, _ = self.env.reset()
        if self._stats is not None:  # reset right after a step that ended a full episode
            ret, steps = self._stats
            self._stats = None
            self._return, self._steps = 0.0, 0
            return self._pack(obs, ret, steps, True)
        # first reset, or episodic-life reset: the full-game counters run on
        return self._pack(obs, self._return, self._steps, False)

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(int(action))
        self._return += float(reward)
        self._steps += 1
        end = "episode" in info
        if end:
            # trust the env's own full-episode statistics (Atari: full game)
            self._return = float(info["episode"]["r"])
            self._steps = int(info["episode"]["l"])
            self._stats = (self._return, self._steps)
        return self._pack(obs, self._return, self._steps, end), float(reward), bool(terminated or truncated), {}

    def close(self) -> None:
        self.env.close()


class PoolEnvFactory:
    """Zero-argument factory for ``moolib.EnvPool``: ``EnvPool(PoolEnvFactory("Pong"), ...)``.

    Each call makes one env with ``make_env(env_id, seed=None, **overrides)``. EnvPool forks
    its workers and calls the factory inside them; the envs are seeded from OS entropy
    (a fixed seed would give every env of the pool the same episode).
    """

    def __init__(self, env_id: str, **overrides: Any) -> None:
        self.env_id = env_id
        self.overrides = overrides

    def __call__(self) -> PoolEnv:
        return PoolEnv(make_env(self.env_id, **self.overrides))
