"""Environment factories for the trainers.

    env = make_env("Pong", seed=1)              # Atari: uint8 [4, 84, 84], Discrete(6)
    env = make_env("CartPole-v1")               # any gymnasium id: float32 [4], Discrete(2)
    env = make_env("mypkg.envs:Maze-v0")        # imports mypkg.envs first (it registers Maze-v0)
    info = env_spec("ALE/Pong-v5", repeat_action_probability=0.25)   # effective settings

Contract of every env ``make_env`` returns (gymnasium API):
* observations: Atari ``uint8 [frame_stack, 84, 84]`` (kind ``'atari'``); other ids (kind
  ``'vector'``) in the tensor form of :mod:`rfwp_rl.envs.spaces` (a float32 vector, an image, a
  one-hot-able integer, or a flat dict of these), each checked against the env's declared space;
* rewards: finite floats (an env that returns another observation or a reward that is None, NaN or
  inf raises a ValueError naming it, which the env workers count as that env's failure);
* actions: the env's own action space (the agent picks its distribution from it:
  :mod:`rfwp_rl.distributions`);
* ``info["episode"] = {"r": return, "l": length, "t": seconds}`` on the step where a full
  episode ends (for Atari: the full game, also with ``episodic_life=True``);
* ``seed`` given to ``make_env`` seeds the first ``reset()`` (later resets continue the RNG).

Ids: see :mod:`rfwp_rl.envs.registry`. Atari settings: :data:`ATARI_DEFAULTS`
(``env_specs/atari.toml`` in the repository holds the same values, for editing and ``--env-config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from rfwp_rl.envs.atari import ATARI_DEFAULTS, PAPER_GAMES, AtariGame, check_atari_settings, make_atari
from rfwp_rl.envs.registry import (
    POMDP_GRAPH_ID,
    ResolvedId,
    atari_games,
    ensure_registered,
    import_env_module,
    resolve_env_id,
)
from rfwp_rl.envs.spaces import action_space_dict, skipped_parts, space_to_dict, to_tensor_obs
from rfwp_rl.errors import UserError

__all__ = [
    "ATARI_DEFAULTS",
    "PAPER_GAMES",
    "POMDP_GRAPH_ID",
    "AtariGame",
    "EnvInfo",
    "ResolvedId",
    "atari_games",
    "declared_reward_range",
    "env_spec",
    "ensure_registered",
    "import_env_module",
    "load_env_config",
    "make_env",
    "resolve_env_id",
]

# gymnasium.make keyword arguments that Atari ids pass through (not preprocessing settings)
_ATARI_GYM_KWARGS = ("mode", "difficulty", "render_mode")


class SeedFirstReset(gymnasium.Wrapper, gymnasium.utils.RecordConstructorArgs):
    """Uses ``seed`` for the first ``reset()`` that is called without one."""

    def __init__(self, env: gymnasium.Env, seed: int | None) -> None:
        # recorded so that ``env.spec.make()`` can rebuild the wrapper stack
        gymnasium.utils.RecordConstructorArgs.__init__(self, seed=seed)
        super().__init__(env)
        self._pending_seed = seed
        if seed is not None:
            env.action_space.seed(seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is None:
            seed, self._pending_seed = self._pending_seed, None
        else:
            self._pending_seed = None
        return self.env.reset(seed=seed, options=options)


class FiniteReward(gymnasium.RewardWrapper, gymnasium.utils.RecordConstructorArgs):
    """Rewards as floats, each a finite number: an env that returns None, NaN or inf stops in one line
    naming it (the value would otherwise reach the agent's input and its return statistics)."""

    def __init__(self, env: gymnasium.Env, env_id: str) -> None:
        gymnasium.utils.RecordConstructorArgs.__init__(self, env_id=env_id)
        super().__init__(env)
        self._env_id = env_id

    def reward(self, reward: Any) -> float:
        try:
            value = float("nan") if isinstance(reward, (str, bytes)) else float(reward)
        except (TypeError, ValueError):
            value = float("nan")
        if not np.isfinite(value):
            raise ValueError(f"{self._env_id} returned the reward {reward!r}; allowed: a finite number")
        return value


def make_env(env_id: str, seed: int | None = None, **overrides: Any) -> gymnasium.Env:
    """Create an environment in the form the trainers consume (see the module docstring).

    Args:
        env_id: gymnasium id, Atari game name, or ``module:EnvId``.
        seed: seeds the first reset (emulator, no-op starts, action space).
        overrides: Atari ids: keys of :data:`ATARI_DEFAULTS` (plus ``mode``, ``difficulty``,
            ``render_mode`` for ``gymnasium.make``);
            other ids: keyword arguments of ``gymnasium.make`` (e.g. ``max_episode_steps``).
    """
    r = resolve_env_id(env_id)
    if r.kind == "atari":
        gym_kwargs = {k: overrides.pop(k) for k in _ATARI_GYM_KWARGS if k in overrides}
        env = make_atari(r.gym_id, seed, gym_kwargs=gym_kwargs, **overrides)
    else:
        env = _gym_make(env_id, r.gym_id, overrides)
        try:
            env = to_tensor_obs(env, env_id)
        except UserError:
            env.close()
            raise
        env = FiniteReward(env, env_id)
        env = gymnasium.wrappers.RecordEpisodeStatistics(env)
        env = SeedFirstReset(env, seed)
    return env


def _gym_make(env_id: str, gym_id: str, kwargs: dict[str, Any]) -> gymnasium.Env:
    try:
        return gymnasium.make(gym_id, **kwargs)
    except ImportError as e:
        raise UserError(f"environment {env_id!r} is registered but its module cannot be imported: {e}") from e
    except TypeError as e:
        raise UserError(f"bad option for environment {env_id!r}: {e}") from e
    except ValueError as e:
        if not kwargs:  # the env's own code failed: its traceback is what its author needs
            raise
        raise UserError(f"bad option for environment {env_id!r} ({', '.join(kwargs)}): {e}") from e
    except gymnasium.error.Error as e:
        raise UserError(f"cannot make environment {env_id!r}: {e}") from e


@dataclass(frozen=True)
class EnvInfo:
    """Effective description of an environment as ``make_env`` builds it."""

    env_id: str  # as given
    gym_id: str  # the gymnasium id that is made
    kind: str  # 'atari' (uint8 image [C, H, W]) or 'vector' (any other gymnasium env)
    obs_shape: tuple[int, ...] | None  # None for a Dict observation
    obs_dtype: str | None
    num_actions: int | None  # n of a Discrete(n) action space, else None
    obs_space: dict = field(default_factory=dict)  # the tensor observation space (rfwp_rl.envs.spaces.space_to_dict)
    action_space: dict = field(default_factory=dict)  # the action space, as plain data
    settings: dict[str, Any] = field(default_factory=dict)  # Atari settings / gymnasium kwargs
    action_meanings: tuple[str, ...] | None = None  # Atari only
    max_episode_steps: int | None = None  # agent steps (Atari: max_episode_frames / frame_skip)
    memory_horizon: int | None = None  # steps a memory must span at most, if the env states it (``memory_horizon``)
    reward_range: tuple[float, float] | None = None  # (low, high) of one step's reward, if the env declares it


def env_spec(env_id: str, **overrides: Any) -> EnvInfo:
    """Create the env once and report what it is (kind, shapes, actions, effective settings)."""
    r = resolve_env_id(env_id)
    if r.kind == "atari":
        gym_kwargs = {k: overrides[k] for k in _ATARI_GYM_KWARGS if k in overrides}
        settings = {**check_atari_settings({k: v for k, v in overrides.items() if k not in gym_kwargs}), **gym_kwargs}
    else:
        settings = dict(overrides)
    env = make_env(env_id, **overrides)
    try:
        space, actions = env.observation_space, env.action_space
        n = int(actions.n) if isinstance(actions, gymnasium.spaces.Discrete) else None
        for part in skipped_parts(getattr(env.unwrapped, "observation_space", space)):
            print(f"observation part {part!r} of {env_id} is a Text space: the agent skips it")
        meanings = None
        if r.kind == "atari":
            meanings = tuple(env.unwrapped.get_action_meanings())
            frames = settings["max_episode_frames"]
            max_steps = -(-frames // settings["frame_skip"]) if frames else None
        else:
            spec = env.spec
            max_steps = spec.max_episode_steps if spec is not None else None
            if max_steps is None:  # envs that bound their own episodes (the memory suite) say so
                max_steps = getattr(env.unwrapped, "max_episode_steps", None)
        return EnvInfo(
            env_id=env_id,
            gym_id=r.gym_id,
            kind=r.kind,
            obs_shape=None if space.shape is None else tuple(int(d) for d in space.shape),
            obs_dtype=None if space.dtype is None else str(space.dtype),
            num_actions=n,
            obs_space=space_to_dict(space),
            action_space=action_space_dict(actions, env_id),
            settings=settings,
            action_meanings=meanings,
            max_episode_steps=max_steps,
            memory_horizon=_memory_horizon(env),
            reward_range=declared_reward_range(env),
        )
    finally:
        env.close()


def declared_reward_range(env: gymnasium.Env) -> tuple[float, float] | None:
    """The env's own ``reward_range`` (low, high), if it declares one that is a pair of numbers with
    ``low <= high`` (gymnasium 1.x envs no longer have the attribute unless they set it)."""
    value = getattr(env.unwrapped, "reward_range", None)
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    return (low, high) if low <= high else None


def _memory_horizon(env: gymnasium.Env) -> int | None:
    value = getattr(env.unwrapped, "memory_horizon", None)
    return int(value) if isinstance(value, (int, np.integer)) and value > 0 else None


def load_env_config(path: str | Path, section: str = "atari") -> dict[str, Any]:
    """Read one table of a TOML env config (e.g. ``env_specs/atari.toml``) as ``make_env`` overrides.

    Atari tables are validated (unknown keys or bad values: one-line UserError).
    """
    from rfwp_rl.overrides import read_toml_file

    path = Path(path)
    data = read_toml_file(path, "env config")
    if section not in data or not isinstance(data[section], dict):
        raise UserError(f"env config {str(path)!r} has no [{section}] table; tables: {', '.join(data) or 'none'}")
    table = dict(data[section])
    if section == "atari":
        check_atari_settings({k: v for k, v in table.items() if k not in _ATARI_GYM_KWARGS})
    return table
