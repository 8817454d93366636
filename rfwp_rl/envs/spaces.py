"""Observation spaces in the form the IMPALA agent consumes, and plain-data descriptions of spaces.

``make_env`` brings every supported observation space into a *tensor space*
(:func:`tensor_obs_space`): one leaf, or a flat ``Dict`` of leaves keyed by path (``"image"``,
``"inner/pos"``, ``"0"`` for a Tuple's first part). Leaves:

- ``Box`` kept as it is when float32, or uint8 of rank 3 (an image); any other dtype is cast to float32;
- ``Discrete(n)`` -> int64 scalar 0..n-1 (``start`` subtracted); the encoder one-hots it;
- ``MultiDiscrete(nvec)`` (any shape, flattened to k elements) -> int64 ``[k]`` 0..nvec-1 (``start`` subtracted);
- ``MultiBinary(n)`` (any shape, flattened to n elements) -> ``Box(0, 1, (n,), float32)``.

``Text`` parts of a Dict/Tuple are dropped (an agent usually gets a mission in other ways;
:func:`skipped_parts` names them). Anything else (``Graph``, ``Sequence``, nested ``Text``
at the top level, ``OneOf``) is a one-line :class:`UserError` naming the space and what is supported.
Rollouts hold a leaf observation under ``"obs"`` and a Dict's parts under ``"obs/<path>"``
(:func:`obs_keys`, :func:`pick_obs`), so that moolib's EnvPool, which returns one tensor per key,
carries them.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from rfwp_rl.errors import UserError

SUPPORTED_OBS = "Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple of these (nested; Text parts are skipped)"
SUPPORTED_ACTIONS = (
    "Discrete, MultiDiscrete, MultiBinary, Box (float; integers with finite bounds), Tuple and Dict of these"
)
MAX_INTEGER_VALUES = 1024  # an integer Box element is a categorical over its values: a policy head of this width
OBS_KEY = "obs"
PART_SEP = "/"


def _unsupported(space: gymnasium.Space, env_id: str) -> UserError:
    return UserError(
        f"environment {env_id!r} has observation space {space}, which is not supported; supported: {SUPPORTED_OBS}"
    )


def _leaf(space: gymnasium.Space, env_id: str) -> gymnasium.Space:
    """The tensor form of one leaf space (see the module docstring)."""
    if isinstance(space, spaces.Box):
        if space.dtype == np.float32 or (space.dtype == np.uint8 and len(space.shape) == 3):
            return space
        return spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32)
    if isinstance(space, spaces.Discrete):
        return spaces.Discrete(int(space.n))
    if isinstance(space, spaces.MultiDiscrete):  # any shape, flattened
        return spaces.MultiDiscrete(space.nvec.astype(np.int64).reshape(-1))
    if isinstance(space, spaces.MultiBinary):  # any shape, flattened
        return spaces.Box(0.0, 1.0, (math.prod(space.shape),), np.float32)
    raise _unsupported(space, env_id)


def _flat_parts(space: gymnasium.Space, env_id: str, prefix: str = "") -> dict[str, gymnasium.Space]:
    """``{path: original leaf space}`` of a Dict/Tuple, depth first, Text parts included."""
    if isinstance(space, spaces.Dict):
        items = list(space.spaces.items())
    elif isinstance(space, spaces.Tuple):
        items = [(str(i), s) for i, s in enumerate(space.spaces)]
    else:
        return {prefix: space}
    parts: dict[str, gymnasium.Space] = {}
    for key, sub in items:
        if PART_SEP in str(key):
            raise UserError(
                f"environment {env_id!r}: observation key {key!r} contains {PART_SEP!r}, which joins "
                "the keys of nested parts; rename it"
            )
        parts.update(_flat_parts(sub, env_id, f"{prefix}{PART_SEP}{key}" if prefix else str(key)))
    return parts


def is_text(space: gymnasium.Space) -> bool:
    """A Text space, or another space of strings (e.g. a grid world's mission space)."""
    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, (spaces.Graph, spaces.Sequence)) or space.shape is not None:
        return False
    try:
        return isinstance(space.sample(), str)
    except Exception:  # noqa: BLE001 - a space that cannot sample is not a text space
        return False


def is_structured(space: gymnasium.Space) -> bool:
    return isinstance(space, (spaces.Dict, spaces.Tuple))


def tensor_obs_space(space: gymnasium.Space, env_id: str) -> gymnasium.Space:
    """The tensor space of ``space``: a leaf, or a flat Dict of leaves (Text parts dropped)."""
    if not is_structured(space):
        return _leaf(space, env_id)
    parts = {k: _leaf(s, env_id) for k, s in _flat_parts(space, env_id).items() if not is_text(s)}
    if not parts:
        raise UserError(
            f"environment {env_id!r} has observation space {space} with only Text parts; supported: {SUPPORTED_OBS}"
        )
    return spaces.Dict(parts)


def skipped_parts(space: gymnasium.Space) -> list[str]:
    """Paths of the Text parts :func:`tensor_obs_space` drops (``[]`` for a leaf space)."""
    if not is_structured(space):
        return []
    return [k for k, s in _flat_parts(space, "").items() if is_text(s)]


class TensorObservation(gymnasium.ObservationWrapper, gymnasium.utils.RecordConstructorArgs):
    """Observations of ``env`` in the form of :func:`tensor_obs_space` (arrays, or a flat dict of arrays).
    Recorded in the env's spec, so that ``gymnasium.make(env.spec)`` makes the same env again."""

    def __init__(self, env: gymnasium.Env, env_id: str):
        gymnasium.utils.RecordConstructorArgs.__init__(self, env_id=env_id)
        super().__init__(env)
        self._env_id = env_id
        self._source = env.observation_space
        self.observation_space = tensor_obs_space(self._source, env_id)
        if is_structured(self._source):
            originals = _flat_parts(self._source, env_id)
            self._starts = {k: _start(originals[k]) for k in self.observation_space.spaces}
        else:
            self._starts = {"": _start(self._source)}

    def observation(self, observation: Any) -> Any:
        if not is_structured(self._source):
            return self._leaf_value(observation, self.observation_space, self._starts[""], "")
        out = {}
        for key, space in self.observation_space.spaces.items():
            value = observation
            try:
                for part in key.split(PART_SEP):
                    value = value[int(part)] if isinstance(value, tuple) else value[part]
            except (KeyError, IndexError, TypeError):
                raise ValueError(
                    f"{self._env_id} returned an observation without its part {key!r} "
                    f"(its observation_space: {self._source})"
                ) from None
            out[key] = self._leaf_value(value, space, self._starts[key], key)
        return out

    def _leaf_value(self, value: Any, space: gymnasium.Space, start: Any, key: str) -> np.ndarray:
        """``value`` as an array of the space's dtype and shape; a ValueError naming the env, the part and
        both shapes where it does not fit (the env broke its own observation_space)."""
        try:
            if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
                array = np.asarray(value, np.int64) - start
            else:
                array = np.asarray(value, space.dtype)
        except (TypeError, ValueError) as e:
            array, error = None, str(e)
        if array is None or array.size != int(np.prod(space.shape)):
            got = f"shape {np.shape(value)}" if array is not None else f"a value that is no array ({error})"
            where = f"part {key!r} of an observation" if key else "an observation"
            raise ValueError(
                f"{self._env_id} returned {where} of {got}; its observation_space says shape {space.shape} "
                f"({self._source if not key else space})"
            )
        return array.reshape(space.shape)


def _start(space: gymnasium.Space) -> Any:
    if isinstance(space, spaces.Discrete):
        return np.int64(space.start)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(getattr(space, "start", 0), np.int64)
    return 0


def to_tensor_obs(env: gymnasium.Env, env_id: str) -> gymnasium.Env:
    """``env`` with observations in tensor form, each checked against the env's declared space (a
    flat float32 Box too: an env that returns another shape stops in one line, not in the model)."""
    return TensorObservation(env, env_id)


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (int64 observations of Discrete spaces included)."""
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def obs_keys(space: gymnasium.Space) -> list[str]:
    """Rollout keys of an observation of the tensor space ``space``: ``["obs"]`` or ``["obs/<path>", ...]``."""
    if isinstance(space, spaces.Dict):
        return [f"{OBS_KEY}{PART_SEP}{k}" for k in space.spaces]
    return [OBS_KEY]


def pick_obs(data: dict) -> Any:
    """The observation in ``data`` (a rollout, an env pool result): the tensor under ``"obs"``, or
    ``{path: tensor}`` from the ``"obs/<path>"`` keys."""
    if OBS_KEY in data:
        return data[OBS_KEY]
    prefix = OBS_KEY + PART_SEP
    return {k[len(prefix) :]: v for k, v in data.items() if k.startswith(prefix)}


def flatten_obs(obs: Any) -> dict[str, Any]:
    """Inverse of :func:`pick_obs`: ``{"obs": x}`` or ``{"obs/<path>": x, ...}``."""
    if isinstance(obs, dict):
        return {f"{OBS_KEY}{PART_SEP}{k}": v for k, v in obs.items()}
    return {OBS_KEY: obs}


def map_obs(obs: Any, fn: Any) -> Any:
    """``fn`` applied to the observation tensor, or to each part of a Dict observation."""
    return {k: fn(v) for k, v in obs.items()} if isinstance(obs, dict) else fn(obs)


def zero_obs(space: gymnasium.Space) -> Any:
    """An all-zero observation of the tensor space ``space`` (array, or dict of arrays)."""
    if isinstance(space, spaces.Dict):
        return {k: zero_obs(s) for k, s in space.spaces.items()}
    return np.zeros(space.shape, space.dtype)


def stack_obs(items: list[Any]) -> Any:
    """Observations of several envs -> tensors ``[n, ...]`` (dict of them for Dict observations)."""
    if isinstance(items[0], dict):
        return {k: torch.from_numpy(np.stack([o[k] for o in items])) for k in items[0]}
    return torch.from_numpy(np.stack(items))


def env_step_action(action: Any, space: gymnasium.Space | None = None) -> Any:
    """What ``env.step`` gets: for a Tuple or Dict ``space``, its structure read from the flat vector of its
    leaves' actions (:func:`action_leaves` order); an int for a scalar action (Discrete, or no ``space`` given)
    but a Box's; else the array."""
    if isinstance(space, (spaces.Tuple, spaces.Dict)):
        return _unflatten_action(np.asarray(action).reshape(-1), space, 0)[0]
    if isinstance(space, spaces.Box):
        return np.asarray(action)
    return int(action) if np.ndim(action) == 0 else np.asarray(action)


def _action_parts(space: gymnasium.Space) -> list[tuple[Any, gymnasium.Space]]:
    """A Tuple's or Dict's parts with their keys, in the one order actions use: a Tuple's in order, a Dict's
    keys sorted (gymnasium keeps an OrderedDict's own order); ``[]`` for any other space."""
    if isinstance(space, spaces.Tuple):
        return list(enumerate(space.spaces))
    if isinstance(space, spaces.Dict):
        return [(k, space.spaces[k]) for k in sorted(space.spaces, key=str)]
    return []


def action_leaves(space: gymnasium.Space, path: str = "") -> list[tuple[str, gymnasium.Space]]:
    """The leaves of a Tuple or Dict action space with their paths, in :func:`_action_parts` order, nested
    alike. Any other space is its own one leaf."""
    if not isinstance(space, (spaces.Tuple, spaces.Dict)):
        return [(path, space)]
    return [
        leaf
        for key, s in _action_parts(space)
        for leaf in action_leaves(s, f"{path}{PART_SEP}{key}" if path else str(key))
    ]


def _unflatten_action(flat: np.ndarray, space: gymnasium.Space, at: int) -> tuple[Any, int]:
    """The action of ``space`` whose leaves' values start at ``flat[at]``, and where the next one starts."""
    if isinstance(space, (spaces.Tuple, spaces.Dict)):
        out = {}
        for key, s in _action_parts(space):
            out[key], at = _unflatten_action(flat, s, at)
        return (tuple(out.values()) if isinstance(space, spaces.Tuple) else out), at
    size = math.prod(space.shape) if space.shape else 1
    values = flat[at : at + size]
    if isinstance(space, spaces.Discrete):
        return int(np.rint(values[0])), at + size
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        values = np.rint(values)
    return values.astype(space.dtype).reshape(space.shape), at + size


# ---------------------------------------------------------------- spaces as plain data (checkpoint meta, wire)


def _bound(values: np.ndarray) -> Any:
    flat = np.asarray(values, np.float64).reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return flat.tolist() if flat.size <= 1024 else None


def _bound_array(value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A bound as :func:`_bound` wrote it: one number, or every element in order (reshaped to ``shape``)."""
    flat = np.asarray(value, np.float64)
    return flat.reshape(shape) if flat.ndim == 1 and len(shape) > 1 and flat.size == math.prod(shape) else flat


def space_to_dict(space: gymnasium.Space) -> dict:
    """A JSON-able description of a tensor space or an action space (inverse: :func:`space_from_dict`)."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _bound(space.low),
            "high": _bound(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": np.asarray(getattr(space, "start", np.zeros_like(space.nvec))).tolist(),
        }
    if isinstance(space, spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": int(n) if np.ndim(n) == 0 else [int(k) for k in np.asarray(n).reshape(-1)]}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_dict(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    raise UserError(
        f"space {space} has no plain-data description; supported: Box, Discrete, MultiDiscrete, MultiBinary, Dict, "
        "Tuple"
    )


def space_from_dict(d: dict) -> gymnasium.Space:
    """The space of a :func:`space_to_dict` description; a malformed one is a one-line UserError."""
    try:
        kind = d["type"]
        if kind == "Box":
            shape = tuple(int(s) for s in d["shape"])
            dtype = np.dtype(d["dtype"])
            if dtype.kind not in "fiub":
                raise ValueError(f"dtype {dtype}")
            info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
            low = info.min if d.get("low") is None else _bound_array(d["low"], shape)
            high = info.max if d.get("high") is None else _bound_array(d["high"], shape)
            low = np.broadcast_to(low, shape).astype(dtype)
            high = np.broadcast_to(high, shape).astype(dtype)
            return spaces.Box(low, high, shape, dtype)
        if kind == "Discrete":
            return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(np.asarray(d["nvec"], np.int64), start=np.asarray(d.get("start", 0), np.int64))
        if kind == "MultiBinary":
            n = d["n"]
            return spaces.MultiBinary([int(k) for k in n] if isinstance(n, list) else int(n))
        if kind == "Dict":
            return spaces.Dict({str(k): space_from_dict(v) for k, v in d["spaces"].items()})
        if kind == "Tuple":
            return spaces.Tuple(tuple(space_from_dict(v) for v in d["spaces"]))
        raise ValueError(f"type {kind!r}")
    except RecursionError:
        raise UserError("malformed space description: nested deeper than Python's recursion limit") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"malformed space description {d!r}: {e}") from None


def action_space_problem(space: gymnasium.Space) -> str | None:
    """Why the agent cannot act in ``space``, or None where it can: the one rule of :func:`action_space_dict`
    and :func:`rfwp_rl.distributions.make_distribution`."""
    leaves = [leaf for _, leaf in action_leaves(space)]
    if not leaves:
        return f"it has no parts; supported: {SUPPORTED_ACTIONS}"
    for leaf in leaves:
        if isinstance(leaf, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
            continue
        if isinstance(leaf, spaces.Box) and leaf.dtype.kind == "f":
            continue
        if isinstance(leaf, spaces.Box) and leaf.dtype.kind in "iu":
            if leaf.is_bounded() and integer_values(leaf).max(initial=1) <= MAX_INTEGER_VALUES:
                continue
            return (
                f"an integer Box needs finite bounds with at most {MAX_INTEGER_VALUES} values per element "
                "(each is a categorical over its values)"
            )
        return f"{leaf} is not supported; supported: {SUPPORTED_ACTIONS}"
    return None


def integer_values(space: spaces.Box) -> np.ndarray:
    """``[n]`` how many values each element of a bounded integer Box takes (``high - low + 1``), flattened."""
    return space.high.astype(np.int64).reshape(-1) - space.low.astype(np.int64).reshape(-1) + 1


def action_space_dict(space: gymnasium.Space, env_id: str) -> dict:
    """:func:`space_to_dict` of an action space the agent supports, else a one-line UserError naming it."""
    problem = action_space_problem(space)
    if problem is not None:
        raise UserError(f"environment {env_id!r} has action space {space}: {problem}")
    return space_to_dict(space)
