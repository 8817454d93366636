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
    env_error       bool (only with a ``make`` to replace the env): the env failed (raised in ``step``/``reset``) and was replaced by a new
                    one; this is the new env's first observation (also ``done``; the failed
                    episode is dropped from the episode statistics).
"done" is ``terminated or truncated`` (time limits end the unroll's episode too).

Fault tolerance: an exception inside a moolib worker aborts the whole worker process (moolib
calls ``fatal``), so :class:`PoolEnv` catches every exception of its env, prints one line
(env id, slot, pid, exception), closes the broken env, makes a new one and reports the step as
an episode end with ``env_error``. The trainer counts these (``--max-env-failures``). If a new
env cannot be made ``MAX_RECREATE`` times in a row, the error is raised (the worker dies, which
the trainer detects and handles).

At exit of a moolib worker, :func:`close_all` (registered with ``atexit``) closes its envs and
drops the references to them: moolib never destroys the env objects it holds, so without this
every ALE emulator is still alive at interpreter shutdown and nanobind prints a page of
"leaked ..." warnings.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any, Callable

import numpy as np

from rfwp_rl.envs import make_env

MAX_RECREATE = 3  # attempts to make and reset a new env after a failure, before giving up
_live_envs: "weakref.WeakSet[PoolEnv]" = weakref.WeakSet()
_atexit_registered = False


def close_all() -> None:
    """Close every live :class:`PoolEnv` of this process and drop its env (see module doc)."""
    for env in list(_live_envs):
        env.close()
    _live_envs.clear()


def _describe(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class PoolEnv:
    """Adapter from a ``make_env`` env to the interface ``moolib.EnvPool`` drives.

    Args:
        env: the env (gymnasium API).
        make: ``make(k)`` makes a replacement env after the ``k``-th failure (k = 1, 2, ...);
            None: failures are raised.
        name: how the env is named in failure messages, e.g. ``"CartPole-v1 #3"``.
    """

    def __init__(self, env: Any, make: Callable[[int], Any] | None = None, name: str = "env") -> None:
        self.env = env
        self.make = make
        self.name = name
        self.failures = 0  # env failures of this slot
        self._return = 0.0
        self._steps = 0
        self._end = False  # the last step ended a full episode
        self._stats: tuple[float, int] | None = None  # (return, steps) of the ended episode
        self._failed = False  # the env raised; the next reset() replaces it
        self._last: dict[str, np.ndarray] | None = None
        _live_envs.add(self)
        global _atexit_registered
        if not _atexit_registered:
            atexit.register(close_all)
            _atexit_registered = True

    def _pack(self, obs: np.ndarray, episode_return: float, episode_step: int, end: bool,
              error: bool = False) -> dict[str, np.ndarray]:
        self._last = {
            "obs": obs,
            "episode_return": np.float32(episode_return),
            "episode_step": np.int32(episode_step),
            "episode_end": np.bool_(end),
        }
        if self.make is not None:  # only envs that can be replaced report failures
            self._last["env_error"] = np.bool_(error)
        return self._last

    def _report(self, where: str, e: BaseException) -> None:
        # one write per line: several worker processes share the trainer's stderr
        sys.stderr.write(f"warning: env {self.name} (pid {os.getpid()}) raised {_describe(e)} in {where} "
                         f"(failure {self.failures} of this env); replacing it\n")
        sys.stderr.flush()

    def _replace(self) -> dict[str, np.ndarray]:
        """Close the broken env, make and reset a new one; its first observation, flagged."""
        for attempt in range(1, MAX_RECREATE + 1):
            try:
                self.env.close()
            except Exception:
                pass
            try:
                self.env = self.make(self.failures)
                obs, _ = self.env.reset()
                break
            except Exception as e:
                if attempt == MAX_RECREATE:
                    raise RuntimeError(f"env {self.name}: could not make a working env after failure "
                                       f"{self.failures} ({attempt} attempts; last: {_describe(e)})") from e
                self.failures += 1
                self._report("reset of a replacement", e)
        self._failed, self._stats = False, None
        self._return, self._steps = 0.0, 0
        return self._pack(obs, 0.0, 0, False, error=True)

    def reset(self) -> dict[str, np.ndarray]:
        """New (training) episode. After a done step, reports the ended episode's stats."""
        if self._failed:
            return self._replace()
        try:
            obs, _ = self.env.reset()
        except Exception as e:
            if self.make is None:
                raise
            self.failures += 1
            self._report("reset", e)
            return self._replace()
        if self._stats is not None:  # reset right after a step that ended a full episode
            ret, steps = self._stats
            self._stats = None
            self._return, self._steps = 0.0, 0
            return self._pack(obs, ret, steps, True)
        # first reset, or episodic-life reset: the full-game counters run on
        return self._pack(obs, self._return, self._steps, False)

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        try:
            obs, reward, terminated, truncated, info = self.env.step(int(action))
        except Exception as e:
            if self.make is None or self._last is None:
                raise
            # Ends the episode: the pool calls reset() next, which replaces the env.
            self.failures += 1
            self._report("step", e)
            self._failed = True
            return dict(self._last, episode_end=np.bool_(False)), 0.0, True, {}
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
        """Close the env and drop it (idempotent)."""
        env, self.env = self.env, None
        _live_envs.discard(self)
        if env is not None:
            try:
                env.close()
            except Exception:
                pass


class PoolEnvFactory:
    """Zero-argument factory for ``moolib.EnvPool``: ``EnvPool(PoolEnvFactory("Pong"), ...)``.

    Each call makes one env with ``make_env(env_id, seed=None, **overrides)``. EnvPool forks
    its workers and calls the factory inside them; the envs are seeded from OS entropy
    (a fixed seed would give every env of the pool the same episode). A failed env is
    replaced by a new one made the same way.
    """

    def __init__(self, env_id: str, **overrides: Any) -> None:
        self.env_id = env_id
        self.overrides = overrides
        self.calls = 0  # envs made in this (worker) process

    def _make(self, failures: int = 0) -> Any:
        return make_env(self.env_id, **self.overrides)

    def __call__(self) -> PoolEnv:
        self.calls += 1
        return PoolEnv(self._make(), make=self._make, name=f"{self.env_id} (worker slot {self.calls - 1})")
