"""Action distributions: what the policy head's output means for each kind of gymnasium action space.

One :class:`ActionDistribution` is chosen from the env's action space (:func:`make_distribution`)
and the agent, actors, learner, rollout server and evaluation use only its interface:

    params = Linear(core_output, dist.num_params)(x)   # [..., num_params]
    action = dist.sample(params)                         # [..., *dist.action_shape] dist.action_dtype
    dist.log_prob(params, action), dist.entropy(params)  # [...]
    dist.mode(params)                                    # greedy action (evaluation)
    dist.prev_action_encoding(action)                    # [..., dist.prev_action_size] core input
    dist.env_action(action)                              # what the env receives
    dist.valid(action)                                   # range check of actions received from peers

Kinds (field practice: Sample Factory, CleanRL, RLlib):

- ``Discrete(n, start)``: a categorical over n logits (sampling as the agent always did); the env gets
  ``action + start``.
- ``MultiDiscrete(nvec)``: one categorical per dimension, independent; log-probs and entropies
  summed (the joint distribution factorises).
- ``MultiBinary(n)``: n independent Bernoullis from n logits.
- ``Box`` of integers with finite bounds: as a ``MultiDiscrete`` of ``high - low + 1`` values per element
  (at most ``rfwp_rl.envs.spaces.MAX_INTEGER_VALUES``), starting at ``low``.
- ``Box`` (float): a diagonal
  Gaussian over the action *normalised* to [-1, 1] per bounded dimension,
  mean from the head and a learned, state-independent log-std (one per dimension). The env gets the
  sample mapped affinely onto ``[low, high]`` and clipped to it; the log-prob is of the unclipped
  sample (as IMPALA/PPO implementations do). Clipping keeps the Gaussian's exact log-prob, entropy
  and a gradient everywhere, where a tanh squash needs a log-det-Jacobian correction that is
  unstable near the bounds and has no closed-form entropy. Nothing in the log-prob keeps the mean
  inside the bounds: where the largest action is best, samples nearer the bound get the higher
  advantages and the mean moves on past it until every sample acts like the bound, a deterministic
  policy that no longer explores there. :meth:`DiagGaussian.out_of_bounds` measures that excess for
  the learner's ``bound_cost``. The affine map to [-1, 1] makes the initial std (1) cover the action
  range whatever its units, and it changes log-probs by a constant only (importance ratios
  unchanged).
- ``Tuple`` / ``Dict`` of the kinds above (nested alike): one distribution per leaf, independent (log-probs
  and entropies summed), their parameters, actions and encodings side by side in one fixed leaf order
  (:func:`rfwp_rl.envs.spaces.action_leaves`); the env gets the space's structure back.

A MultiDiscrete, MultiBinary or Box space of any shape is flattened (``action_shape`` one dimension); the env
gets its own shape back (``env_shape``).
"""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gymnasium import spaces

from rfwp_rl.envs.spaces import action_leaves, action_space_problem, integer_values, torch_dtype
from rfwp_rl.errors import UserError


class ActionDistribution(nn.Module):
    """Interface of an action distribution (see the module docstring). Shapes: ``params [..., num_params]``,
    ``action [..., *action_shape]``, log-prob and entropy ``[...]``."""

    kind: str = ""
    num_params: int
    action_shape: tuple[int, ...]
    action_dtype: torch.dtype
    env_dtype: torch.dtype  # dtype of env_action (the env's own action dtype)
    prev_action_size: int
    plain_index: bool = False  # the env gets each action as it is: one integer 0..n-1 (what moolib's EnvPool carries)
    _env_shape: tuple[int, ...] | None = None  # where the env's shape is not action_shape (a flattened space)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prev_action_encoding(self, action: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        return self._in_env_shape(action.to(self.env_dtype))

    @property
    def env_shape(self) -> tuple[int, ...]:
        """The shape of one action as the env gets it (:meth:`env_action`'s trailing dimensions)."""
        return self.action_shape if self._env_shape is None else self._env_shape

    def _in_env_shape(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., *action_shape]`` as ``[..., *env_shape]``."""
        return x.reshape(tuple(x.shape[: x.dim() - len(self.action_shape)]) + tuple(self.env_shape))

    def valid(self, action: torch.Tensor) -> bool:
        """True if ``action [..., *action_shape]`` has the stored dtype and lies in the action space."""
        raise NotImplementedError

    def out_of_bounds(self, params: torch.Tensor) -> torch.Tensor:
        """``[...]`` how far the distribution's location lies outside the action bounds (a penalty for the
        learner's ``bound_cost``); 0 for distributions that cannot leave them."""
        return torch.zeros(self._batch(params), device=params.device)

    @property
    def has_bounds(self) -> bool:
        """Whether the distribution's location can leave the action bounds (what ``bound_cost`` penalises)."""
        return False

    def act(self, params: torch.Tensor, greedy: bool) -> torch.Tensor:
        return self.mode(params) if greedy else self.sample(params)

    def _batch(self, params: torch.Tensor) -> tuple[int, ...]:
        return tuple(params.shape[:-1])


def _sample_categorical(logits: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``logits [..., n]`` -> int64 ``[...]`` (the agent's sampling since its first version)."""
    probs = F.softmax(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
    return torch.multinomial(probs, 1).view(logits.shape[:-1])


def _categorical_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=-1).gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def _categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = F.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


class Categorical(ActionDistribution):
    """``Discrete(n, start)``: logits ``[..., n]``, actions int64 ``[...]`` in 0..n-1; the env gets
    ``action + start``."""

    kind = "categorical"

    def __init__(self, n: int, start: int = 0):
        super().__init__()
        self.n = self.num_params = self.prev_action_size = int(n)
        self.start = int(start)
        self.plain_index = self.start == 0
        self.action_shape, self.action_dtype, self.env_dtype = (), torch.int64, torch.int64

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return _sample_categorical(params)

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return _categorical_log_prob(params, action)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return _categorical_entropy(params)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(dim=-1)

    def extra_repr(self) -> str:
        shifted = f", the env's {self.start}..{self.start + self.n - 1}" if self.start else ""
        return f"integers 0..{self.n - 1}{shifted}"

    def prev_action_encoding(self, action: torch.Tensor) -> torch.Tensor:
        return F.one_hot(action.long(), self.n).float()

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        return action + self.start if self.start else action

    def valid(self, action: torch.Tensor) -> bool:
        return action.dtype == torch.int64 and bool(((action >= 0) & (action < self.n)).all())


class MultiCategorical(ActionDistribution):
    """``MultiDiscrete(nvec)`` (``nvec`` flattened, k dimensions): logits ``[..., sum(nvec)]`` (one block per
    dimension), actions int64 ``[..., k]``; the env gets ``action + start`` in ``env_shape`` (default ``(k,)``)."""

    kind = "multi_categorical"

    def __init__(
        self,
        nvec: list[int],
        start: list[int] | None = None,
        env_shape: tuple[int, ...] | None = None,
        env_dtype: torch.dtype = torch.int64,
    ):
        super().__init__()
        self._env_shape = None if env_shape is None else tuple(env_shape)
        self.nvec = [int(n) for n in nvec]
        self.num_params = self.prev_action_size = sum(self.nvec)
        self.action_shape, self.action_dtype, self.env_dtype = (len(self.nvec),), torch.int64, env_dtype
        self.register_buffer(
            "start", torch.tensor(list(start or [0] * len(self.nvec)), dtype=torch.int64), persistent=False
        )
        self.register_buffer("high", torch.tensor(self.nvec, dtype=torch.int64), persistent=False)

    def _parts(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return params.split(self.nvec, dim=-1)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([_sample_categorical(p) for p in self._parts(params)], dim=-1)

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        # independent dimensions: log p(a) = sum_i log p_i(a_i)
        parts = [_categorical_log_prob(p, action[..., i]) for i, p in enumerate(self._parts(params))]
        return torch.stack(parts, dim=-1).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([_categorical_entropy(p) for p in self._parts(params)], dim=-1).sum(-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([p.argmax(dim=-1) for p in self._parts(params)], dim=-1)

    def prev_action_encoding(self, action: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.one_hot(action[..., i].long(), n).float() for i, n in enumerate(self.nvec)], dim=-1)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        return self._in_env_shape((action + self.start.to(action.device)).to(self.env_dtype))

    def valid(self, action: torch.Tensor) -> bool:
        return (
            action.dtype == torch.int64
            and tuple(action.shape[-1:]) == self.action_shape
            and bool(((action >= 0) & (action < self.high.to(action.device))).all())
        )


class Bernoulli(ActionDistribution):
    """``MultiBinary(n)`` (n elements once flattened): logits ``[..., n]``, actions int64 ``[..., n]`` of 0/1; the
    env gets int8 in ``env_shape`` (default ``(n,)``)."""

    kind = "bernoulli"

    def __init__(self, n: int, env_shape: tuple[int, ...] | None = None):
        super().__init__()
        self._env_shape = None if env_shape is None else tuple(env_shape)
        self.num_params = self.prev_action_size = int(n)
        self.action_shape, self.action_dtype, self.env_dtype = (int(n),), torch.int64, torch.int8

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return torch.bernoulli(torch.sigmoid(params.float())).long()

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        # log p(a) = a log sigmoid(l) + (1 - a) log sigmoid(-l) = -BCE(l, a)
        return -F.binary_cross_entropy_with_logits(params, action.to(params.dtype), reduction="none").sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(params)
        return F.binary_cross_entropy_with_logits(params, p, reduction="none").sum(-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return (params > 0).long()

    def prev_action_encoding(self, action: torch.Tensor) -> torch.Tensor:
        return action.float()

    def valid(self, action: torch.Tensor) -> bool:
        return (
            action.dtype == torch.int64
            and tuple(action.shape[-1:]) == self.action_shape
            and bool(((action == 0) | (action == 1)).all())
        )


class DiagGaussian(ActionDistribution):
    """``Box`` (A dims once flattened): means ``[..., A]`` from the head, ``log_std`` a learned parameter ``[A]``
    (state-independent); actions float32 ``[..., A]`` in normalised units (see the module docstring).

    A dimension with finite bounds maps ``u`` to ``low + (u + 1) / 2 * (high - low)``, clipped to
    ``[low, high]``; an unbounded one passes ``u`` as it is. The env gets the Box's own shape."""

    kind = "gaussian"

    def __init__(
        self, low: np.ndarray, high: np.ndarray, env_dtype: torch.dtype = torch.float32, log_std_init: float = 0.0
    ):
        super().__init__()
        self._env_shape = tuple(int(n) for n in np.shape(low))
        low, high = np.asarray(low, np.float64).reshape(-1), np.asarray(high, np.float64).reshape(-1)
        A = low.shape[0]
        self.num_params = self.prev_action_size = A
        self.action_shape, self.action_dtype, self.env_dtype = (A,), torch.float32, env_dtype
        self.log_std = nn.Parameter(torch.full((A,), float(log_std_init)))
        bounded = np.isfinite(low) & np.isfinite(high)
        low0, high0 = np.where(bounded, low, 0.0), np.where(bounded, high, 0.0)  # no inf - inf below
        scale = np.where(bounded, (high0 - low0) / 2, 1.0)
        centre = (high0 + low0) / 2
        for name, value in (
            ("scale", scale),
            ("centre", centre),
            ("low", np.where(bounded, low, -np.inf)),
            ("high", np.where(bounded, high, np.inf)),
        ):
            self.register_buffer(name, torch.tensor(value, dtype=torch.float32), persistent=False)
        self.register_buffer("bounded", torch.tensor(bounded), persistent=False)

    @property
    def has_bounds(self) -> bool:
        return bool(self.bounded.any())

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        mean = params.float()
        return mean + self.log_std.exp() * torch.randn_like(mean)

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        # log N(a; mu, sigma) = -(a - mu)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2, summed over dimensions
        z = (action - params) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def out_of_bounds(self, params: torch.Tensor) -> torch.Tensor:
        # sum over bounded dimensions of relu(|mu| - 1)^2 in normalised units (rl_games' bounds loss)
        excess = torch.relu(params.float().abs() - 1.0) * self.bounded
        return (excess * excess).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        # H = sum (1/2 + log(2 pi)/2 + log sigma), independent of the mean
        per_dim = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum()
        return per_dim.expand(self._batch(params))

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return params.float()

    def prev_action_encoding(self, action: torch.Tensor) -> torch.Tensor:
        return torch.where(self.bounded, action.clamp(-1.0, 1.0), action)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        mapped = self.centre + action * self.scale
        return self._in_env_shape(torch.maximum(torch.minimum(mapped, self.high), self.low).to(self.env_dtype))

    def valid(self, action: torch.Tensor) -> bool:
        return (
            action.dtype == torch.float32
            and tuple(action.shape[-1:]) == self.action_shape
            and bool(torch.isfinite(action).all())
        )


class Composite(ActionDistribution):
    """``Tuple`` / ``Dict``: one distribution per leaf (``parts``, in :func:`rfwp_rl.envs.spaces.action_leaves`
    order). ``params [..., sum of the parts' num_params]``; actions float32 ``[..., A]``, each part's action
    flattened in turn (a categorical's index as a float, exact); the env gets float64 ``[..., E]``, each part's
    env action flattened in turn, which :func:`rfwp_rl.envs.spaces.env_step_action` turns into the space's
    structure."""

    kind = "composite"

    def __init__(self, parts: list[ActionDistribution]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.sizes = [math.prod(p.action_shape) for p in parts]
        self.num_params = sum(p.num_params for p in parts)
        self.prev_action_size = sum(p.prev_action_size for p in parts)
        self.action_shape, self.action_dtype, self.env_dtype = (sum(self.sizes),), torch.float32, torch.float64
        self._env_shape = (sum(math.prod(p.env_shape) for p in parts),)

    @property
    def has_bounds(self) -> bool:
        return any(p.has_bounds for p in self.parts)

    def _params(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return params.split([p.num_params for p in self.parts], dim=-1)

    def _actions(self, action: torch.Tensor) -> list[torch.Tensor]:
        """Each part's action, in its own shape and dtype, from ``action [..., A]``."""
        batch = action.shape[:-1]
        return [
            a.reshape(tuple(batch) + tuple(p.action_shape)).to(p.action_dtype)
            for p, a in zip(self.parts, action.split(self.sizes, dim=-1))
        ]

    @staticmethod
    def _join(values: list[torch.Tensor], shapes: list[tuple[int, ...]], dtype: torch.dtype) -> torch.Tensor:
        """The parts' ``values [..., *shape]`` flattened side by side: ``[..., sum of sizes]``."""
        flat = [v.reshape(*v.shape[: v.dim() - len(s)], -1).to(dtype) for v, s in zip(values, shapes)]
        return torch.cat(flat, dim=-1)

    def _joined_actions(self, values: list[torch.Tensor]) -> torch.Tensor:
        return self._join(values, [p.action_shape for p in self.parts], torch.float32)

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        return self._joined_actions([p.sample(x) for p, x in zip(self.parts, self._params(params))])

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return self._joined_actions([p.mode(x) for p, x in zip(self.parts, self._params(params))])

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        # independent parts: log p(a) = sum_i log p_i(a_i)
        parts = zip(self.parts, self._params(params), self._actions(action))
        return torch.stack([p.log_prob(x, a) for p, x, a in parts], dim=-1).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([p.entropy(x) for p, x in zip(self.parts, self._params(params))], dim=-1).sum(-1)

    def out_of_bounds(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([p.out_of_bounds(x) for p, x in zip(self.parts, self._params(params))], dim=-1).sum(-1)

    def prev_action_encoding(self, action: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.prev_action_encoding(a) for p, a in zip(self.parts, self._actions(action))], dim=-1)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        values = [p.env_action(a) for p, a in zip(self.parts, self._actions(action))]
        return self._join(values, [p.env_shape for p in self.parts], torch.float64)

    def valid(self, action: torch.Tensor) -> bool:
        if not (
            action.dtype == torch.float32
            and tuple(action.shape[-1:]) == self.action_shape
            and bool(torch.isfinite(action).all())
        ):
            return False
        for p, a in zip(self.parts, action.split(self.sizes, dim=-1)):
            if p.action_dtype != torch.float32 and not bool((a == a.round()).all()):
                return False  # an integer part must hold whole numbers
        return all(p.valid(a) for p, a in zip(self.parts, self._actions(action)))


def make_distribution(space: gymnasium.Space, log_std_init: float = 0.0) -> ActionDistribution:
    """The :class:`ActionDistribution` of a gymnasium action space; any other space is a one-line
    :class:`UserError` naming it and what is supported (:func:`rfwp_rl.envs.spaces.action_space_problem`)."""
    problem = action_space_problem(space)
    if problem is not None:
        raise UserError(f"action space {space}: {problem}")
    if isinstance(space, (spaces.Tuple, spaces.Dict)):
        return Composite([_leaf_distribution(leaf, log_std_init) for _, leaf in action_leaves(space)])
    return _leaf_distribution(space, log_std_init)


def _leaf_distribution(space: gymnasium.Space, log_std_init: float) -> ActionDistribution:
    """The distribution of one supported leaf space."""
    if isinstance(space, spaces.Discrete):
        return Categorical(int(space.n), int(space.start))
    if isinstance(space, spaces.MultiDiscrete):
        start = np.broadcast_to(np.asarray(getattr(space, "start", 0), np.int64), space.shape)
        return MultiCategorical(space.nvec.reshape(-1).tolist(), start.reshape(-1).tolist(), space.shape)
    if isinstance(space, spaces.MultiBinary):
        return Bernoulli(math.prod(space.shape), space.shape)
    if np.issubdtype(space.dtype, np.integer):
        low = space.low.astype(np.int64).reshape(-1)
        return MultiCategorical(integer_values(space).tolist(), low.tolist(), space.shape, torch_dtype(space.dtype))
    return DiagGaussian(space.low, space.high, torch_dtype(space.dtype), log_std_init)  # a float Box: all that is left
