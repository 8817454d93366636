"""Space helpers: what the IMPALA agent can consume and how to bring an env into that form.

The agent takes either an Atari image ``uint8 [C, H, W]`` (conv torso) or a flat
``float32 [D]`` vector (MLP torso), and a ``Discrete(n)`` action space (actions 0..n-1).
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

from rfwp_rl.errors import UserError


def num_actions(space: gymnasium.Space, env_id: str) -> int:
    """``n`` of a ``Discrete(n)`` action space starting at 0; else a one-line UserError."""
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise UserError(
                f"environment {env_id!r} has action space {space} starting at {int(space.start)}; "
                "IMPALA needs Discrete(n) with actions 0..n-1"
            )
        return int(space.n)
    raise UserError(
        f"environment {env_id!r} has action space {space}; IMPALA needs a Discrete action space "
        "(continuous or multi-discrete actions are not supported)"
    )


def is_flat_vector(space: gymnasium.Space) -> bool:
    """True for a 1-D float32 Box (what the MLP torso takes as it is)."""
    return isinstance(space, spaces.Box) and len(space.shape) == 1 and space.dtype == np.float32


def to_vector_obs(env: gymnasium.Env, env_id: str) -> gymnasium.Env:
    """Wrap ``env`` so that observations are flat ``float32 [D]`` vectors.

    Box of any shape is flattened; Discrete becomes one-hot; Dict/Tuple are flattened and
    concatenated (gymnasium's ``spaces.flatten``). Text or Graph spaces raise a UserError.
    """
    space = env.observation_space
    if is_flat_vector(space):
        return env
    try:
        spaces.flatdim(space)
    except (NotImplementedError, ValueError, TypeError) as e:
        raise UserError(
            f"environment {env_id!r} has observation space {space}, which cannot be flattened "
            "into a vector"
        ) from e
    if not (isinstance(space, spaces.Box) and len(space.shape) == 1):
        env = gymnasium.wrappers.FlattenObservation(env)
    if env.observation_space.dtype != np.float32:
        env = gymnasium.wrappers.DtypeObservation(env, np.float32)
    return env
