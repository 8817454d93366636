"""Atari in ale-py's own vector env: the ``ale`` env backend.

``ale_py.vector_env.AtariVectorEnv`` steps many emulators in a pool of C++ threads and does the
DeepMind preprocessing there (no-op starts, frame skip with the max of the last two frames, grayscale,
resize, frame stack), as EnvPool does; this process's interpreter only hands it the actions. Each
env batch is one such vector env, stepped with ``send``/``recv``, so one batch steps while the
trainer acts on the other, with the same ``step(batch_index, action) -> future`` as ``moolib.EnvPool``:
a batch's first step resets its envs and ignores the action; an env whose game ended is reset in the
same step and reports ``done`` with the new game's first observation (the ended game's return and
length in ``episode_return``/``episode_step``, ``episode_end`` set). A game cut by the frame limit first
shows its last observation with ``truncated`` (the learner bootstraps from it), and the new game's first
observation comes with the next step, as in the other pools; ALE has already reset that game, so the
action taken on the cut game's last observation is its new game's first (one step after the no-op start),
and that last frame is ALE's, not pooled with the frame before it (a few pixels differ from the other pools').

The settings are :data:`rfwp_rl.envs.atari.ATARI_DEFAULTS` (``env_specs/atari.toml``). ALE gives one
frame per step and the frames are stacked here, the stack filled with a game's first frame, as
:class:`rfwp_rl.envs.atari.AtariPreprocessing` does (ALE's own stack starts with blank frames). Not supported
here: ``episodic_life`` and the options passed to the game itself (``mode``, ``difficulty``): a one-line error
names them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from rfwp_rl.envs.atari import ATARI_DEFAULTS, check_atari_settings
from rfwp_rl.envs.pool_env import NO_FATAL
from rfwp_rl.envs.process_pool import PendingStep
from rfwp_rl.errors import UserError


def rom_name(gym_id: str) -> str:
    """The ALE ROM id of an ale-py gym id: ``ALE/SpaceInvaders-v5`` -> ``space_invaders``."""
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", gym_id)
    if match is None:
        raise UserError(f"--env-backend ale steps Atari games (ALE/<Game>-v5 ids); got {gym_id!r}")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()


def vector_env_options(env_options: dict) -> tuple[dict[str, Any], int]:
    """``AtariVectorEnv`` keyword arguments for this package's Atari ``env_options``, and the frame stack's depth."""
    extra = sorted(k for k in env_options if k not in ATARI_DEFAULTS)
    if extra:
        raise UserError(f"--env-backend ale cannot pass the env option(s) {', '.join(extra)}; use the process backend")
    s = check_atari_settings(env_options)
    if s["episodic_life"]:
        raise UserError("--env-backend ale does not support episodic_life=true; use --env-backend process")
    return {
        "noop_max": s["noop_max"],
        "frameskip": s["frame_skip"],
        "stack_num": 1,  # stacked by the pool
        "img_height": s["screen_size"],
        "img_width": s["screen_size"],
        "repeat_action_probability": s["repeat_action_probability"],
        "full_action_space": s["full_action_space"],
        "max_num_frames_per_episode": s["max_episode_frames"],
        "grayscale": True,
        "maxpool": True,
        "episodic_life": False,
        "reward_clipping": False,  # the learner clips; episode returns are the game's
        "use_fire_reset": False,  # as AtariPreprocessing: the agent presses FIRE itself
        "autoreset_mode": "SameStep",
    }, s["frame_stack"]


class AleVectorPool:
    """``num_batches`` batches of ``batch_size`` Atari games, each batch one ``AtariVectorEnv`` of
    ``num_threads // num_batches`` threads. Env ``i`` of batch ``b`` is
    seeded ``seed * 100_003 + b * batch_size + i``, as in the other pools."""

    def __init__(
        self,
        gym_id: str,
        env_options: dict,
        seed: int,
        batch_size: int,
        num_batches: int,
        num_threads: int,
    ):
        from ale_py.vector_env import AtariVectorEnv

        game, (kwargs, stack) = rom_name(gym_id), vector_env_options(env_options)
        side = kwargs["img_height"]
        threads = max(1, num_threads // num_batches)
        self.envs = [AtariVectorEnv(game, batch_size, num_threads=threads, **kwargs) for _ in range(num_batches)]
        self.seeds = [seed * 100_003 + b * batch_size for b in range(num_batches)]
        self.batch_size, self.num_batches = batch_size, num_batches
        self.stacks = np.zeros((num_batches, batch_size, stack, side, side), np.uint8)  # oldest frame first
        self.started = [False] * num_batches
        self.pending = [False] * num_batches
        self.returns = np.zeros((num_batches, batch_size), np.float64)
        self.lengths = np.zeros((num_batches, batch_size), np.int64)
        self.fatal = torch.from_numpy(np.broadcast_to(NO_FATAL, (batch_size, *NO_FATAL.shape)).copy())
        # per batch: the reset observations of games cut by the frame limit, shown at the next step
        self.held: list[dict[int, tuple[np.ndarray, float, int]]] = [{} for _ in range(num_batches)]

    def step(self, batch_index: int, action: torch.Tensor) -> PendingStep:
        """Start stepping batch ``batch_index`` with ``action [batch_size]`` (ignored by its first step)."""
        if self.pending[batch_index]:
            raise RuntimeError(f"env batch {batch_index} is stepped again before its result was taken")
        if self.started[batch_index]:
            self.envs[batch_index].send(action.numpy().astype(np.int64).reshape(self.batch_size))
        self.pending[batch_index] = True
        return PendingStep(self, batch_index)

    def _collect(self, b: int) -> dict[str, torch.Tensor]:
        self.pending[b] = False
        n = self.batch_size
        if not self.started[b]:
            self.started[b] = True
            obs, _ = self.envs[b].reset(seed=self.seeds[b])
            zeros = np.zeros(n, bool)
            return self._pack(obs[:, 0], np.zeros(n, np.float32), zeros, np.ones(n, bool), zeros, b)
        obs, reward, terminated, truncated, info = self.envs[b].recv()
        frame, reward = np.array(obs[:, 0]), np.asarray(reward, np.float32).copy()
        terminated = np.asarray(terminated, bool)
        cut = np.asarray(truncated, bool) & ~terminated
        self.returns[b] += reward
        self.lengths[b] += 1
        done = terminated.copy()
        for i, (first, ret, length) in self.held[b].items():  # the step after a cut: the new game
            frame[i], reward[i], done[i] = first, 0.0, True
            self.returns[b][i], self.lengths[b][i] = ret, length
        self.held[b] = {}
        for i in np.flatnonzero(cut):  # show the cut game's last frame; its new game's first next step
            self.held[b][int(i)] = (frame[i].copy(), float(self.returns[b][i]), int(self.lengths[b][i]))
            frame[i] = info["final_obs"][i, 0]
        return self._pack(frame, reward, done, done, cut, b)

    def _pack(
        self,
        frame: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        first: np.ndarray,
        cut: np.ndarray,
        b: int,
    ) -> dict[str, torch.Tensor]:
        """The batch's outputs for this step's ``frame [n, H, W]``; ``done``: the games that ended (their
        counters restart); ``first``: the frames that start a game (their stack is filled with them)."""
        stack = self.stacks[b]
        stack[:, :-1] = stack[:, 1:]
        stack[:, -1] = frame
        stack[first] = frame[first][:, None]
        episode_return, episode_step = self.returns[b].astype(np.float32), self.lengths[b].astype(np.int32)
        self.returns[b][done], self.lengths[b][done] = 0.0, 0
        n = self.batch_size
        return {
            "obs": torch.from_numpy(stack.copy()),
            "episode_return": torch.from_numpy(episode_return),
            "episode_step": torch.from_numpy(episode_step),
            "episode_end": torch.from_numpy(done.copy()),
            "truncated": torch.from_numpy(cut),
            "env_error": torch.zeros(n, dtype=torch.int32),
            "env_fatal": self.fatal,
            "reward": torch.from_numpy(reward),
            "done": torch.from_numpy(done),
        }

    def close(self) -> None:
        for env in self.envs:
            env.close()
