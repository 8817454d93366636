"""The actor-critic agent: torso -> (features, clipped reward[, previous action]) -> core -> heads.

Atari (image observations, uint8 ``[C, H, W]``): the IMPALA "large" residual torso
(Espeholt et al. 2018, Fig. 3 right; RFWP paper Sec. 4.3 and App. C): for C in (16, 32, 32)
a 3x3 conv (stride 1, pad 1), a 3x3 max-pool (stride 2, pad 1) and two residual blocks
``x + conv(relu(conv(relu(x))))``; then relu, flatten (32 x 11 x 11 = 3872 for 84x84), a
linear layer to 256 and relu. The reward clipped to [-1, 1] is concatenated (257 inputs to
the core). Vector observations (``[D]``, e.g. CartPole) use an MLP torso instead: by default
two tanh layers of 64 units (CleanRL's choice for classic control).

Other observation spaces (images of any size, one-hot-able integers, Dicts of parts) get the
torso :mod:`rfwp_rl.encoders` chooses from the space.

The core is any :mod:`rfwp_rl.cores` core; a policy head ``Linear(core.output_size, P)``
and a baseline head ``Linear(core.output_size, 1)`` read its output. What the P policy outputs
mean is the action distribution's business (:mod:`rfwp_rl.distributions`, chosen from the
action space: for ``Discrete(A)``, P = A logits). Actions are sampled during training and
taken greedily (the distribution's mode) in evaluation.

Parameter counts of the paper's Atari agents (A actions; :func:`atari_param_counts`):
FF 1,089,490 + 258A, LSTM 1,616,849 + 257A, LT 1,517,905 + 129A, Delta 1,518,929 + 129A,
RDN 1,543,761 + 129A, Delta RNN 1,585,489 + 129A; and of the two that are not the paper's:
GRU (312 units, sized to the LSTM's count) 1,624,001 + 313A, FWM 1,683,122 + 257A.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces

from rfwp_rl import cores
from rfwp_rl.cores.base import MAX_REPEATS, build_bounded, check_non_negative_int, check_positive_int, check_size
from rfwp_rl.distributions import ActionDistribution, make_distribution
from rfwp_rl.encoders import (  # noqa: F401 - the torsos, also importable from here
    ACTIVATIONS,
    PART_ENCODERS,
    TORSOS,
    GridTorso,
    MLPTorso,
    ResidualBlock,
    ResNetTorso,
    embedded_grids,
    make_torso,
)
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.presets import load_preset
from rfwp_rl.recall import RecallHead

#: what the agent did before an option existed, where that is not the option's default: a saved meta without
#: the option reads as this (:meth:`rfwp_rl.impala.run_spec.RunSpec.upgrade_meta`)
BEFORE_OPTION = {"grid_embedding": 0, "recall_symbols": False}
#: the largest |log_std_init|: the Gaussian's std, its log-probs and entropy stay finite float32 numbers
MAX_LOG_STD_INIT = 20.0


@dataclasses.dataclass
class AgentConfig:
    """Agent options besides the core (the ``[agent]`` table of a preset).

    torso: ``resnet`` (large images), ``grid`` (small images), ``mlp`` (vectors, one-hot integers) or
    ``auto`` (chosen from the observation space, see :mod:`rfwp_rl.encoders`).
    encoders: for Dict observations, ``{part path: encoder}`` (``auto``, ``resnet``, ``grid``, ``mlp``,
    ``skip``) overriding the automatic choice of those parts.
    resnet_channels: channels of the three residual stages. grid_channels: the grid torso's
    convolutions. grid_embedding: E >= 1 for an E-wide learned embedding of every cell value of a
    uint8 grid, its symbols (:class:`GridTorso`), or 0 for cells scaled by 1/255 (indices then differ
    by 1/255: ``results/envs/minigrid.md``).
    torso_output: width of the conv torsos' last linear layer. mlp_sizes / mlp_activation: the MLP
    torso.
    use_prev_action: also feed the previous action (its distribution's encoding: one-hot for
    Discrete) to the core (zeros at episode starts).
    log_std_init: initial log standard deviation of a Box action space's Gaussian.
    separate_baseline: give the baseline head a torso and core of its own (same kinds and sizes) instead
    of sharing the policy's: value-loss gradients then do not shape the policy's features (separate
    networks are what Andrychowicz et al. 2021, "What Matters in On-Policy Reinforcement Learning?",
    recommend for on-policy continuous control; not the default: see ``docs/profiles/control.md``). The
    state is the policy core's tensors, then the baseline core's.
    recall_lags: 0, or L >= 1 for a recall head (:mod:`rfwp_rl.recall`) that the learner trains to
    reconstruct, from the core's output at step t, the torso features of step t - k, k uniform over
    the episode's steps in the unroll, at most L back (weighted by the trainer's ``recall_cost``); acting never uses it.
    recall_symbols: with a recall head and a uint8 grid embedded as symbols, the head also names that grid's
    symbols k steps back, rare ones weighted up (:mod:`rfwp_rl.recall`); recorded as False where it has no
    effect.
    """

    torso: str = "auto"
    resnet_channels: tuple[int, ...] = (16, 32, 32)
    torso_output: int = 256
    mlp_sizes: tuple[int, ...] = (64, 64)
    mlp_activation: str = "tanh"
    use_prev_action: bool = False
    grid_channels: tuple[int, ...] = (16, 32, 32)
    grid_embedding: int = 16
    encoders: dict = dataclasses.field(default_factory=dict)
    log_std_init: float = 0.0
    separate_baseline: bool = False
    recall_lags: int = 0
    recall_symbols: bool = True

    @classmethod
    def from_dict(cls, d: dict | None) -> AgentConfig:
        d = dict(d or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            check_choice("agent option", key, sorted(fields))
        for key in ("resnet_channels", "mlp_sizes", "grid_channels"):
            if key in d:
                if isinstance(d[key], (str, bytes)) or not isinstance(d[key], (list, tuple)):
                    raise UserError(f"agent {key} {d[key]!r} is invalid; allowed: a list of integers >= 1")
                d[key] = tuple(check_positive_int(f"agent {key}: a width", v) for v in d[key])
        defaults = cls()
        for key, value in d.items():
            if key in ("torso_output", "recall_lags", "grid_embedding"):
                continue  # checked below, with what their 0 means
            default = getattr(defaults, key)
            if isinstance(default, bool) and not isinstance(value, bool):
                raise UserError(f"agent {key} {value!r} is invalid; allowed: true or false")
            if type(default) is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise UserError(f"agent {key} {value!r} is invalid; allowed: an integer")
            if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise UserError(f"agent {key} {value!r} is invalid; allowed: a number")
            if isinstance(default, float) and not math.isfinite(value):
                raise UserError(f"agent {key} {value!r} is invalid; allowed: a finite number")
            if isinstance(default, str) and not isinstance(value, str):
                raise UserError(f"agent {key} {value!r} is invalid; allowed: a name")
            if isinstance(default, dict) and not (
                isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
            ):
                raise UserError(f"agent {key} {value!r} is invalid; allowed: a table of part = encoder name")
        cfg = cls(**d)
        check_choice("agent torso", cfg.torso, TORSOS)
        if abs(cfg.log_std_init) > MAX_LOG_STD_INIT:
            raise UserError(
                f"agent log_std_init {cfg.log_std_init!r} is invalid; allowed: a number within "
                f"[-{MAX_LOG_STD_INIT:g}, {MAX_LOG_STD_INIT:g}]"
            )
        check_choice("agent mlp_activation", cfg.mlp_activation, sorted(ACTIVATIONS))
        for key, value in dict(cfg.encoders).items():
            check_choice(f"agent encoder of part {key!r}", value, PART_ENCODERS)
        check_positive_int("agent torso_output", cfg.torso_output)
        check_non_negative_int("agent recall_lags", cfg.recall_lags, "no recall head")
        check_non_negative_int("agent grid_embedding", cfg.grid_embedding, "uint8 grid cells scaled by 1/255")
        for key in ("resnet_channels", "mlp_sizes", "grid_channels"):
            check_size(f"agent {key}: the number of layers", len(getattr(cfg, key)), MAX_REPEATS)
            for value in getattr(cfg, key):
                check_size(f"agent {key}: a width", value)
        for key in ("torso_output", "recall_lags", "grid_embedding"):
            check_size(f"agent {key}", getattr(cfg, key))
        return cfg

    def to_dict(self) -> dict:
        """Every option as plain data (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def as_obs_space(obs: gymnasium.Space | Sequence[int]) -> gymnasium.Space:
    """A tensor observation space, or a shape: ``(C, H, W)`` uint8 frames or ``(D,)`` float32 vectors."""
    if isinstance(obs, gymnasium.Space):
        return obs
    shape = tuple(int(s) for s in obs)
    if len(shape) == 3:
        return spaces.Box(0, 255, shape, np.uint8)
    return spaces.Box(-np.inf, np.inf, shape, np.float32)


def as_action_space(actions: gymnasium.Space | int) -> gymnasium.Space:
    """An action space, or ``A`` for ``Discrete(A)``."""
    return actions if isinstance(actions, gymnasium.Space) else spaces.Discrete(int(actions))


class Agent(nn.Module):
    """Actor-critic agent around a :mod:`rfwp_rl.cores` core.

    Args:
        obs_space: the tensor observation space (:mod:`rfwp_rl.envs.spaces`), or one observation's
            shape: ``(C, H, W)`` uint8 frames or ``(D,)`` float vectors.
        action_space: the env's action space, or ``A`` for ``Discrete(A)``.
        core: core name (``rfwp_rl.cores.available()``), e.g. ``"rdn"``.
        core_config: keyword options of the core (e.g. ``hidden_size``).
        agent_config: :class:`AgentConfig` or its dict form.
    """

    def __init__(
        self,
        obs_space: gymnasium.Space | Sequence[int],
        action_space: gymnasium.Space | int,
        core: str = "lstm",
        core_config: dict | None = None,
        agent_config: AgentConfig | dict | None = None,
    ):
        super().__init__()
        self.obs_space = as_obs_space(obs_space)
        self.action_space = as_action_space(action_space)
        self.obs_shape = self.obs_space.shape  # None for a Dict
        self.core_name = core
        self.core_config = dict(core_config or {})
        cfg = agent_config if isinstance(agent_config, AgentConfig) else AgentConfig.from_dict(agent_config)
        self.config = cfg
        self.action_dist: ActionDistribution = make_distribution(self.action_space, cfg.log_std_init)
        self.num_actions = self.action_dist.num_params  # width of the policy head
        self.torso = make_torso(self.obs_space, cfg)
        grids = embedded_grids(self.torso)
        if not grids:
            # no uint8 grid to embed: the option has no effect, and the agent records it as off
            self.config = cfg = dataclasses.replace(cfg, grid_embedding=0)
        if not (grids and cfg.recall_lags) and cfg.recall_symbols:  # likewise: no symbols to recall
            self.config = cfg = dataclasses.replace(cfg, recall_symbols=False)
        core_input = self.torso.output_size + 1 + (self.action_dist.prev_action_size if cfg.use_prev_action else 0)
        self.core = cores.make(core, core_input, **self.core_config)
        self.policy = nn.Linear(self.core.output_size, self.num_actions)
        self.baseline_torso = self.baseline_core = None
        if cfg.separate_baseline:
            self.baseline_torso = make_torso(self.obs_space, cfg)
            self.baseline_core = cores.make(core, core_input, **self.core_config)
        self.baseline = nn.Linear(self.core.output_size, 1)
        self.recall = None  # the learner's recall task (rfwp_rl/recall.py); acting never reads it
        if cfg.recall_lags:
            self.recall = RecallHead(
                self.core.output_size,
                self.torso.output_size,
                cfg.recall_lags,
                grids=[(t.symbol_cells, t.symbol_channels) for _, t in grids] if cfg.recall_symbols else (),
            )
        self.symbol_grids = grids if cfg.recall_symbols else []
        self.policy_state_size = len(self.core.state_shapes(1))  # leading tensors of the agent's state

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
        """The zero state for ``batch_size`` entries (batch is dim 0 of every tensor): the core's, then the
        baseline core's with ``separate_baseline``."""
        state = tuple(self.core.initial_state(batch_size, device=device))
        if self.baseline_core is not None:
            state += tuple(self.baseline_core.initial_state(batch_size, device=device))
        return state

    def forward(
        self,
        obs: torch.Tensor | dict[str, torch.Tensor],
        reward: torch.Tensor,
        done: torch.Tensor,
        state: tuple,
        prev_action: torch.Tensor | None = None,
        greedy: bool = False,
        with_features: bool = False,
    ) -> tuple[dict[str, torch.Tensor], tuple]:
        """Run T steps of B environments.

        Args:
            obs: ``[T, B, *obs_shape]`` (uint8 frames or float vectors), or for a Dict space
                ``{path: [T, B, *part_shape]}``.
            reward: ``[T, B]`` reward received on arriving at ``obs[t]`` (clipped to [-1, 1] here).
            done: ``[T, B]`` bool, True where ``obs[t]`` is the first frame of a new episode:
                the core state of that entry is reset before step t.
            state: core state (tuple of ``[B, ...]`` tensors) before step 0.
            prev_action: ``[T, B, *action_shape]`` action taken before ``obs[t]`` (only used with
                ``use_prev_action``; zeroed at episode starts).
            greedy: take the distribution's mode instead of sampling.
            with_features: also return ``"features" [T, B, F]`` (the torso's output) and
            ``"core_output" [T, B, H]`` (what the learner's auxiliary losses read).
        Returns:
            ``({"policy_params": [T, B, P], "baseline": [T, B], "action": [T, B, *action_shape],
            "log_prob": [T, B]}, new_state)``; ``log_prob`` is that of ``action`` under the policy.
            Under a caller's autocast (``--precision bf16``) only the torso runs in low precision;
            the core and the heads get fp32 features and return fp32 values.
        """
        T, B = reward.shape[:2]
        if isinstance(obs, dict):
            flat = {k: v.reshape(T * B, *v.shape[2:]) for k, v in obs.items()}
        else:
            flat = obs.reshape(T * B, *obs.shape[2:])
        done = done.bool()
        policy_state, baseline_state = tuple(state[: self.policy_state_size]), tuple(state[self.policy_state_size :])
        features = self.torso(flat).view(T, B, -1)
        if self.baseline_torso is not None:
            baseline_features = self.baseline_torso(flat).view(T, B, -1)
        with torch.autocast(features.device.type, enabled=False):  # only the torsos run in the caller's autocast
            core_out, policy_state = self._core(self.core, features.float(), reward, done, policy_state, prev_action)
            baseline_out = core_out
            if self.baseline_core is not None:
                baseline_out, baseline_state = self._core(
                    self.baseline_core, baseline_features.float(), reward, done, baseline_state, prev_action
                )
            params = self.policy(core_out)
            baseline = self.baseline(baseline_out).squeeze(-1)
            action = self.action_dist.act(params, greedy)
            out = {
                "policy_params": params,
                "baseline": baseline,
                "action": action,
                "log_prob": self.action_dist.log_prob(params, action),
            }
            if with_features:
                out["features"], out["core_output"] = features.float(), core_out
                if self.symbol_grids:
                    out["symbols"] = torch.cat(
                        [t.symbols(flat if k is None else flat[k]) for k, t in self.symbol_grids], -1
                    ).view(T, B, -1)
            return out, policy_state + baseline_state

    def _core(
        self,
        core: nn.Module,
        features: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
        state: tuple,
        prev_action: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple]:
        """``features [T, B, F]`` fp32 with the clipped reward (and the previous action) -> ``core``
        (its fused kernels are fp32) -> ``([T, B, core.output_size], new state)``."""
        inputs = [features, reward.float().clamp(-1.0, 1.0).unsqueeze(-1)]
        if self.config.use_prev_action:
            if prev_action is None:
                raise ValueError("this agent uses the previous action: pass prev_action [T, B, ...]")
            encoded = self.action_dist.prev_action_encoding(prev_action)
            inputs.append(encoded * (~done).unsqueeze(-1).float())
        out, state = core(torch.cat(inputs, dim=-1), state, done)
        return out, tuple(state)


def count_parameters(module: nn.Module) -> int:
    """Weights of ``module``; of an :class:`Agent`, those of the network that acts (torso, core, heads):
    its recall head only serves the learner's auxiliary loss, so agents compare equal with or without it."""
    recall = getattr(module, "recall", None) if isinstance(module, Agent) else None
    skip = {id(p) for p in recall.parameters()} if recall is not None else set()
    return sum(p.numel() for p in module.parameters() if id(p) not in skip)


ATARI_OBS_SHAPE = (4, 84, 84)
# The Atari agent presets by core: the paper's six, then the baselines that are not the paper's.
ATARI_PRESETS = {
    "ff": "atari_ff",
    "lstm": "atari_lstm",
    "lt": "atari_lt",
    "delta": "atari_delta",
    "rdn": "atari_rdn",
    "delta_rnn": "atari_delta_rnn",
    "gru": "atari_gru",
    "fwm": "atari_fwm",
    "ffm": "atari_ffm",
    "lru": "atari_lru",
    "mlstm": "atari_mlstm",
    "mamba": "atari_mamba",
}


def build_agent(preset: Any, obs_space: gymnasium.Space | Sequence[int], action_space: gymnasium.Space | int) -> Agent:
    """An :class:`Agent` from a loaded :class:`rfwp_rl.presets.Preset` (spaces as :class:`Agent` takes them);
    one past :data:`rfwp_rl.cores.base.MAX_PARAMETERS` weights is a one-line error before any memory is taken."""
    return build_bounded("agent", lambda: Agent(obs_space, action_space, preset.core, preset.core_config, preset.agent))


def atari_param_counts(num_actions: int) -> dict[str, int]:
    """Parameter counts of the Atari presets (``agents/atari_<core>.toml``) for A actions,
    e.g. ``{"ff": 1091038, ...}`` for A = 6. Built on the meta device (no memory used)."""
    counts = {}
    for core, name in ATARI_PRESETS.items():
        preset = load_preset(name)
        with torch.device("meta"):
            agent = build_agent(preset, ATARI_OBS_SHAPE, num_actions)
        counts[core] = count_parameters(agent)
    return counts
