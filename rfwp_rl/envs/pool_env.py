"""Glue between ``make_env`` (gymnasium API) and ``moolib.EnvPool`` (old gym API).

moolib 0.0.9b0's EnvPool worker calls, per env (see third_party/moolib/README.md):
* ``reset()`` on its first step and right after any step that returned done=True; it takes the
  return value as the observation (a dict of arrays, or one array stored under "state");
* ``step(action: int)`` and reads only items 0, 1, 2 of the result: obs, reward, done.
It adds the keys "reward" (float32) and "done" (bool) itself; every other key of the
observation dict becomes a tensor ``[batch_size, ...]`` of ``EnvPool.step(...).result()``.
moolib carries one int64 per env to the workers: actions that are not one integer 0..n-1
(MultiDiscrete, MultiBinary, Box, a Discrete space's with a start, Tuple and Dict as the flat vector of their
leaves) go through an :class:`ActionTable` in shared memory instead.

:class:`PoolEnv` gives it, per env and step:
    obs             the observation (Atari uint8 [4, 84, 84], else the tensor form of
                    :mod:`rfwp_rl.envs.spaces`); a Dict observation's parts under "obs/<path>"
    episode_return  float32: return of the running episode including this step's reward; on a
                    done step, the return of the episode that just ended
    episode_step    int32: agent steps of the running episode (same convention)
    episode_end     bool: a full episode ended at this step. Equals "done" unless Atari
                    ``episodic_life=True``, where "done" also marks lost lives but
                    ``episode_return`` / ``episode_end`` count full games only.
    env_error       int32 (only with a ``make`` to replace the env): how many envs of this slot
                    failed (raised in ``step``/``reset``, or could not be made) since its previous
                    observation; when > 0 this is a new env's first observation (also ``done``;
                    an episode cut short by the failure is dropped from the episode statistics,
                    one that had ended before a failed ``reset`` is still reported).
    env_fatal       uint8 [FATAL_MESSAGE_BYTES] (only with a ``make``): all zero, unless the slot
                    gave up (see below): then the UTF-8 one-line error, zero-padded, and ``obs``
                    is a placeholder (the last observation, or zeros).
    truncated       bool: this is the last observation of an episode cut by a time limit
                    (gymnasium ``truncated`` without ``terminated``). The env is *not* reset yet:
                    the step reports done=False, so the agent sees the last observation (and the
                    learner can bootstrap from its value); the next step ignores its action,
                    gives reward 0 and done=True, and the pool resets the env. That extra step
                    is the only cost (one step per truncated episode; episode statistics are
                    those of the env's own episode).
"done" is ``terminated`` (or the step after a truncation, see above).

Fault tolerance: an exception inside a moolib worker aborts the whole worker process (moolib
calls ``fatal``), so :class:`PoolEnv` catches every exception of its env, prints one line
(env id, slot, pid, exception), closes the broken env, makes a new one and reports the step as
an episode end with ``env_error``. The trainer counts these (``--max-env-failures``). A new env
is made lazily, on the slot's first ``reset`` (so a failing constructor is handled like a failing
reset). If ``MAX_FAILED_CONSTRUCTIONS`` new envs in a row fail before their first observation
(``make`` raises, or their first ``reset`` does), the env is broken rather than flaky: the slot
gives up and reports ``env_fatal`` (the worker stays alive, so the trainer can stop with that
one-line error instead of restarting its workers over and over). Only when there is not even a
placeholder observation (no env was ever made and no ``blank_obs`` was given) is the error
raised instead.

At exit of a moolib worker, :func:`close_all` (registered with ``atexit``) closes its envs and
drops the references to them: moolib never destroys the env objects it holds, so without this
every ALE emulator is still alive at interpreter shutdown and nanobind prints a page of
"leaked ..." warnings.
"""

from __future__ import annotations

import atexit
import math
import mmap
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rfwp_rl.envs import make_env
from rfwp_rl.envs.spaces import env_step_action, flatten_obs, pick_obs, zero_obs

# New envs of one slot that may fail in a row (make raised, or the first reset did) before the
# slot gives up with ``env_fatal``: a flaky env fails now and then, a broken one every time.
MAX_FAILED_CONSTRUCTIONS = 3
FATAL_MESSAGE_BYTES = 240  # room for the one-line error in ``env_fatal``
NO_FATAL = np.zeros(FATAL_MESSAGE_BYTES, np.uint8)  # env_fatal where the slot works
NO_FATAL.flags.writeable = False
_live_envs: weakref.WeakSet[PoolEnv] = weakref.WeakSet()
_atexit_registered = False


def close_all() -> None:
    """Close every live :class:`PoolEnv` of this process and drop its env (see module doc)."""
    for env in list(_live_envs):
        env.close()
    _live_envs.clear()


def _describe(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def encode_fatal(message: str) -> np.ndarray:
    """``message`` as the ``env_fatal`` field: uint8 [FATAL_MESSAGE_BYTES], UTF-8, zero-padded
    (cut to fit)."""
    data = message.encode("utf-8")[:FATAL_MESSAGE_BYTES]
    out = np.zeros(FATAL_MESSAGE_BYTES, np.uint8)
    out[: len(data)] = np.frombuffer(data, np.uint8)
    return out


def decode_fatal(field: Any) -> str:
    """Inverse of :func:`encode_fatal` for one env's row (array or tensor of uint8); "" if none."""
    data = bytes(np.asarray(field, dtype=np.uint8).tolist())
    return data.rstrip(b"\0").decode("utf-8", "replace")


class ActionTable:
    """Actions that are not one integer, handed to moolib's env workers: ``rows`` rows of ``shape``/``dtype``
    in memory shared with the workers (an anonymous shared mapping, made before the pool forks, so the
    workers inherit it). The trainer writes a batch's actions into its rows and sends the row indices
    as the int64 actions moolib carries; the worker's :class:`PoolEnv` reads its row. A batch's rows are
    written only while the batch is not being stepped (moolib steps it again only after its result was
    taken), so no lock is needed."""

    def __init__(self, rows: int, shape: tuple[int, ...], dtype: Any):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        count = rows * math.prod(self.shape)
        self._buffer = mmap.mmap(-1, max(1, count * self.dtype.itemsize))  # MAP_SHARED | MAP_ANONYMOUS
        self.array = np.frombuffer(self._buffer, self.dtype, count=count).reshape(rows, *self.shape)

    def write(self, first_row: int, actions: torch.Tensor) -> torch.Tensor:
        """Store ``actions [n, *shape]`` in rows ``first_row..first_row+n-1``; returns those indices (int64 [n])."""
        n = actions.shape[0]
        self.array[first_row : first_row + n] = actions.cpu().numpy()
        return torch.arange(first_row, first_row + n, dtype=torch.int64)

    def read(self, row: int) -> np.ndarray:
        """The action of row ``row`` (a copy); a row outside the table is an IndexError."""
        if not 0 <= row < self.array.shape[0]:
            raise IndexError(f"action row {row} outside the table of {self.array.shape[0]} rows")
        return self.array[row].copy()


class PoolEnv:
    """Adapter from a ``make_env`` env to the interface ``moolib.EnvPool`` drives.

    Args:
        env: the env (gymnasium API); None: made with ``make(0)`` on the first ``reset()``.
        make: ``make(k)`` makes a new env after the ``k``-th failure (k = 0 for the first);
            None: failures are raised.
        name: how the env is named in failure messages, e.g. ``"CartPole-v1 #3"``.
        blank_obs: placeholder observation for ``env_fatal`` when no env of this slot ever
            existed (shape and dtype of the real ones); else one is taken from the envs.
        action_table: where ``step``'s integer argument is a row index (see :class:`ActionTable`).
    """

    def __init__(
        self,
        env: Any,
        make: Callable[[int], Any] | None = None,
        name: str = "env",
        blank_obs: Any = None,
        action_table: ActionTable | None = None,
    ) -> None:
        if env is None and make is None:
            raise ValueError("PoolEnv needs an env or a make function")
        self.env = env
        self.make = make
        self.name = name
        self.action_table = action_table
        self.failures = 0  # env failures of this slot
        self._blank = blank_obs
        self._fresh = True  # self.env (if any) has not given its first observation yet
        self._failed_in_row = 0  # new envs in a row that failed before their first observation
        self._pending_errors = 0  # failures not reported in an observation yet (env_error)
        self._fatal: np.ndarray | None = None  # env_fatal once the slot gave up
        self._return = 0.0
        self._steps = 0
        self._stats: tuple[float, int] | None = None  # (return, steps) of the ended episode
        self._failed = False  # the env raised in step(); the next reset() replaces it
        self._truncated = False  # the last step was a time-limit truncation; the next step ends it
        self._last: dict[str, np.ndarray] | None = None
        _live_envs.add(self)
        global _atexit_registered
        if not _atexit_registered:
            atexit.register(close_all)
            _atexit_registered = True

    def _pack(
        self, obs: Any, episode_return: float, episode_step: int, end: bool, truncated: bool = False
    ) -> dict[str, np.ndarray]:
        self._last = {
            **flatten_obs(obs),
            "episode_return": np.float32(episode_return),
            "episode_step": np.int32(episode_step),
            "episode_end": np.bool_(end),
            "truncated": np.bool_(truncated),
        }
        if self.make is not None:  # only envs that can be replaced report failures
            self._last["env_error"] = np.int32(self._pending_errors)
            self._last["env_fatal"] = NO_FATAL if self._fatal is None else self._fatal
            self._pending_errors = 0
        return self._last

    def _report(self, where: str, e: BaseException) -> None:
        # one write per line: several worker processes share the trainer's stderr
        sys.stderr.write(
            f"warning: env {self.name} (pid {os.getpid()}) raised {_describe(e)} in {where} "
            f"(failure {self.failures} of this env); replacing it\n"
        )
        sys.stderr.flush()

    def _failure(self) -> None:
        self.failures += 1
        self._pending_errors += 1

    def _drop_env(self) -> None:
        """Close the current env (ignoring its errors); keep a placeholder observation."""
        env, self.env = self.env, None
        self._fresh = True
        if env is None:
            return
        if self._blank is None:
            space = getattr(env, "observation_space", None)
            if space is not None:
                try:
                    self._blank = zero_obs(space)
                except (TypeError, AttributeError):
                    pass
        try:
            env.close()
        except Exception:
            pass

    def _construct(self) -> np.ndarray | None:
        """The first observation of a new env: makes one if there is none and resets it, up to
        ``MAX_FAILED_CONSTRUCTIONS`` envs in a row. None: the slot gave up (``self._fatal``)."""
        while True:
            stage = "construction"
            try:
                if self.env is None:
                    self.env = self.make(self.failures)
                    self._fresh = True
                stage = "first reset"
                obs, _ = self.env.reset()
            except Exception as e:
                if self.make is None:
                    raise
                self._failure()
                self._failed_in_row += 1
                self._drop_env()
                if self._failed_in_row >= MAX_FAILED_CONSTRUCTIONS:
                    self._give_up(e)
                    return None
                self._report(stage, e)
                continue
            self._fresh = False
            self._failed_in_row = 0
            return obs

    def _give_up(self, e: Exception) -> None:
        message = (
            f"env {self.name}: {self._failed_in_row} new envs in a row failed at construction or first "
            f"reset (limit {MAX_FAILED_CONSTRUCTIONS}); last: {_describe(e)}"
        )
        placeholder = pick_obs(self._last) if self._last is not None else self._blank
        if placeholder is None:  # nothing to report it with: the caller sees the exception
            raise RuntimeError(message) from e
        self._fatal = encode_fatal(message)
        self._stats = None
        self._pack(placeholder, 0.0, 0, False)

    def reset(self) -> dict[str, np.ndarray]:
        """New (training) episode. After a done step, reports the ended episode's stats."""
        if self._fatal is not None:
            return self._last
        stats = None
        if self._failed:  # step() raised: replace the env; the cut episode is dropped
            self._failed, self._stats = False, None
            self._drop_env()
        elif not self._fresh:
            try:
                obs, _ = self.env.reset()
            except Exception as e:
                if self.make is None:
                    raise
                self._failure()
                self._report("reset", e)
                self._drop_env()
                stats, self._stats = self._stats, None  # an episode that had ended still counts
            else:
                if self._stats is not None:  # reset right after a step that ended a full episode
                    ret, steps = self._stats
                    self._stats = None
                    self._return, self._steps = 0.0, 0
                    return self._pack(obs, ret, steps, True)
                # episodic-life reset: the full-game counters run on
                return self._pack(obs, self._return, self._steps, False)
        # a new env: the slot's first one, or a replacement
        self._return, self._steps = 0.0, 0
        obs = self._construct()
        if obs is None:
            return self._last  # gave up: env_fatal
        if stats is not None:
            return self._pack(obs, stats[0], stats[1], True)
        return self._pack(obs, self._return, self._steps, False)

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        """One env step with ``action``: an int (Discrete; with an :class:`ActionTable`, a row index) or an array."""
        if self._fatal is not None:
            return self._last, 0.0, True, {}
        if self._truncated:  # the step after a truncation: ends the episode, the pool resets next
            self._truncated = False
            return dict(self._last, truncated=np.bool_(False)), 0.0, True, {}
        try:
            if self.action_table is not None:
                action = self.action_table.read(int(action))
            obs, reward, terminated, truncated, info = self.env.step(env_step_action(action, self.env.action_space))
        except Exception as e:
            if self.make is None or self._last is None:
                raise
            # Ends the episode: the pool calls reset() next, which replaces the env.
            self._failure()
            self._report("step", e)
            self._failed = True
            last = dict(self._last, episode_end=np.bool_(False))
            last["env_error"] = np.int32(0)  # counted with the replacement's first observation
            return last, 0.0, True, {}
        self._return += float(reward)
        self._steps += 1
        end = "episode" in info
        if end:
            # trust the env's own full-episode statistics (Atari: full game)
            self._return = float(info["episode"]["r"])
            self._steps = int(info["episode"]["l"])
            self._stats = (self._return, self._steps)
        if truncated and not terminated:
            # show the last observation; its statistics are reported with the next episode's first one
            self._truncated = True
            return self._pack(obs, self._return, self._steps, False, truncated=True), float(reward), False, {}
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

    Each call makes one :class:`PoolEnv` whose env is made (on its first reset, inside the
    worker) with ``make_env(env_id, seed=None, **overrides)``. EnvPool forks its workers and
    calls the factory inside them; the envs are seeded from OS entropy (a fixed seed would
    give every env of the pool the same episode). A failed env is replaced by a new one made
    the same way. Set ``blank_obs`` (an array shaped like the observations) so that a slot
    whose envs cannot be made at all can still report ``env_fatal``, and ``action_table`` where the
    actions are not one integer (:class:`ActionTable`).
    """

    def __init__(self, env_id: str, **overrides: Any) -> None:
        self.env_id = env_id
        self.overrides = overrides
        self.calls = 0  # envs made in this (worker) process
        self.blank_obs: Any = None
        self.action_table: ActionTable | None = None

    def _make(self, failures: int = 0) -> Any:
        return make_env(self.env_id, **self.overrides)

    def __call__(self) -> PoolEnv:
        self.calls += 1
        return PoolEnv(
            None,
            make=self._make,
            name=f"{self.env_id} (worker slot {self.calls - 1})",
            blank_obs=self.blank_obs,
            action_table=self.action_table,
        )


def seeded_pool_env(env_id: str, env_options: dict, seed: int, index: int, blank_obs: Any = None) -> PoolEnv:
    """Env ``index`` of an in-process or ``process`` pool: seeded ``seed * 100_003 + index`` (its replacement
    after the k-th failure: ``+ 7919 k``), so runs of these backends are reproducible; made on its first reset,
    where a failing constructor is handled like a failing reset."""

    def make(failures: int) -> Any:
        return make_env(env_id, seed=(seed * 100_003 + index + 7919 * failures) % 2**31, **env_options)

    return PoolEnv(None, make=make, name=f"{env_id} #{index}", blank_obs=blank_obs)


def pool_step(env: PoolEnv, first: bool, action: Any) -> tuple[dict[str, np.ndarray], float, bool]:
    """One step of a pool's env as ``moolib.EnvPool`` makes it: a batch's first step resets (the action is
    ignored); an episode that ends is reset at once, and the step reports ``done`` with the new episode's
    first observation."""
    if first:
        return env.reset(), 0.0, False
    obs, reward, done, _ = env.step(action)
    return (env.reset() if done else obs), reward, done
