"""Small synthetic envs, one per kind of space (used by tests/test_spaces.py).

Importing this module registers ``SpaceBox-v0`` (Box actions), ``SpaceBoxMatrix-v0`` (2x3 Box actions),
``SpaceMultiDiscrete-v0``, ``SpaceMultiBinary-v0``, ``SpaceDiscreteStart-v0`` (Discrete actions -1..1),
``SpaceComposite-v0`` (Dict actions holding a Box, a Tuple and a MultiDiscrete, keys unsorted),
``SpaceGridDiscrete-v0`` (2x2 MultiDiscrete actions with starts), ``SpaceShapedTuple-v0`` (a 2x2 MultiBinary
and a scalar Box), ``SpaceShapedObs-v0`` (observed: a 2x2 MultiDiscrete with starts and a 2x3 MultiBinary),
``SpaceIntBox-v0`` (int32 Box actions), ``SpaceDict-v0`` (a grid-world-like Dict observation: image, direction
and a Text mission), ``SpaceTuple-v0`` (nested Tuple/Dict observation) and ``SpaceGraph-v0`` /
``SpaceSequence-v0`` (unsupported observation spaces). Every episode lasts 5 steps; the reward tells how close
the action came to one that depends on the observation, so a policy can learn.
"""

from __future__ import annotations

from collections import OrderedDict

import gymnasium
import numpy as np
from gymnasium import spaces

LENGTH = 5


class SpaceEnv(gymnasium.Env):
    def __init__(self, obs_space: gymnasium.Space, action_space: gymnasium.Space):
        self.observation_space, self.action_space = obs_space, action_space
        self._t = 0
        self._target = 0

    def _obs(self):
        return self.observation_space.sample()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self._t = 0
        self._target = int(self.np_random.integers(2))
        return self._observe(), {}

    def _observe(self):
        obs = self._obs()
        return obs

    def step(self, action):
        as_given = isinstance(self.action_space, (spaces.Discrete, spaces.Tuple, spaces.Dict))
        assert self.action_space.contains(action if as_given else np.asarray(action, self.action_space.dtype)), action
        self._t += 1
        reward = self.reward(action)
        return self._observe(), float(reward), self._t >= LENGTH, False, {}

    def reward(self, action) -> float:
        if isinstance(self.action_space, (spaces.Tuple, spaces.Dict)):
            action = spaces.flatten(self.action_space, action)
        flat = np.asarray(action, np.float64).reshape(-1)
        return -float(np.abs(flat - flat.mean()).sum()) + float(flat[0] > 0)


def box_env():
    return SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Box(-2.0, 2.0, (2,), np.float32))


def box_matrix_env():
    low = np.array([[-2.0, 0.0, -np.inf], [-1.0, -1.0, 5.0]], np.float32)
    high = np.array([[2.0, 1.0, np.inf], [1.0, 3.0, 6.0]], np.float32)
    return SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Box(low, high, dtype=np.float32))


def multi_discrete_env():
    return SpaceEnv(spaces.Discrete(4, start=1), spaces.MultiDiscrete([3, 2]))


def multi_binary_env():
    return SpaceEnv(spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(3))


def discrete_start_env():
    return SpaceEnv(spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(3, start=-1))


def composite_env():
    parts = [
        ("pick", spaces.Tuple((spaces.Discrete(3, start=1), spaces.MultiBinary(2)))),
        ("move", spaces.Box(-1.0, 1.0, (2,), np.float32)),
        ("aim", spaces.MultiDiscrete([2, 3])),
    ]
    return SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Dict(OrderedDict(parts)))


def grid_discrete_env():
    space = spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[0, 1], [-1, 0]]))
    return SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), space)


def shaped_tuple_env():
    space = spaces.Tuple((spaces.MultiBinary([2, 2]), spaces.Box(-3.0, 3.0, (), np.float32)))
    return SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), space)


def shaped_obs_env():
    obs = spaces.Dict(
        {
            "grid": spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[0, 1], [-1, 0]])),
            "bits": spaces.MultiBinary([2, 3]),
        }
    )
    return SpaceEnv(obs, spaces.Discrete(2))


def int_box_env():
    actions = spaces.Box(np.array([0, -2]), np.array([4, 2]), dtype=np.int32)
    return SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), actions)


def dict_env():
    obs = spaces.Dict(
        {"image": spaces.Box(0, 255, (7, 7, 3), np.uint8), "direction": spaces.Discrete(4), "mission": spaces.Text(20)}
    )
    return SpaceEnv(obs, spaces.Discrete(3))


def tuple_env():
    obs = spaces.Tuple((spaces.Box(-1.0, 1.0, (2,), np.float64), spaces.Dict({"pos": spaces.Discrete(3)})))
    return SpaceEnv(obs, spaces.Discrete(2))


def graph_env():
    return SpaceEnv(spaces.Graph(spaces.Box(0, 1, (2,)), None), spaces.Discrete(2))


def sequence_env():
    return SpaceEnv(spaces.Sequence(spaces.Discrete(3)), spaces.Discrete(2))


for _name, _entry in [
    ("SpaceBox-v0", box_env),
    ("SpaceBoxMatrix-v0", box_matrix_env),
    ("SpaceMultiDiscrete-v0", multi_discrete_env),
    ("SpaceMultiBinary-v0", multi_binary_env),
    ("SpaceDiscreteStart-v0", discrete_start_env),
    ("SpaceComposite-v0", composite_env),
    ("SpaceGridDiscrete-v0", grid_discrete_env),
    ("SpaceShapedTuple-v0", shaped_tuple_env),
    ("SpaceShapedObs-v0", shaped_obs_env),
    ("SpaceIntBox-v0", int_box_env),
    ("SpaceDict-v0", dict_env),
    ("SpaceTuple-v0", tuple_env),
    ("SpaceGraph-v0", graph_env),
    ("SpaceSequence-v0", sequence_env),
]:
    if _name not in gymnasium.registry:
        gymnasium.register(_name, entry_point=_entry, disable_env_checker=True)
