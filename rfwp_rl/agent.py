"""The actor-critic agent: torso -> (features, clipped reward[, previous action]) -> core -> heads.

Atari (image observations, uint8 ``[C, H, W]``): the IMPALA "large" residual torso
(Espeholt et al. 2018, Fig. 3 right; RFWP paper Sec. 4.3 and App. C): for C in (16, 32, 32)
a 3x3 conv (stride 1, pad 1), a 3x3 max-pool (stride 2, pad 1) and two residual blocks
``x + conv(relu(conv(relu(x))))``; then relu, flatten (32 x 11 x 11 = 3872 for 84x84), a
linear layer to 256 and relu. The reward clipped to [-1, 1] is concatenated (257 inputs to
the core). Vector observations (``[D]``, e.g. CartPole) use an MLP torso instead: by default
two tanh layers of 64 units (CleanRL's choice for classic control).

The core is any :mod:`rfwp_rl.cores` core; a policy head ``Linear(core.output_size, A)``
and a baseline head ``Linear(core.output_size, 1)`` read its output. Actions are sampled
from the policy during training and taken greedily (argmax) in evaluation.

Parameter counts of the paper's Atari agents (A actions; :func:`atari_param_counts`):
FF 1,089,490 + 258A, LSTM 1,616,849 + 257A, LT 1,517,905 + 129A, Delta 1,518,929 + 129A,
RDN 1,543,761 + 129A, Delta RNN 1,585,489 + 129A; and of the two that are not the paper's:
GRU (312 units, sized to the LSTM's count) 1,624,001 + 313A, FWM 1,683,122 + 257A.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from rfwp_rl.errors import UserError, check_choice

TORSOS = ("auto", "resnet", "mlp")
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


@dataclasses.dataclass
class AgentConfig:
    """Agent options besides the core (the ``[agent]`` table of a preset).

    torso: ``resnet`` (images ``[C, H, W]``), ``mlp`` (vectors) or ``auto`` (by observation rank).
    resnet_channels: channels of the three residual stages. torso_output: width of the
    torso's last linear layer (ResNet). mlp_sizes / mlp_activation: the MLP torso.
    use_prev_action: also feed the one-hot previous action to the core (zeros at episode starts).
    """

    torso: str = "auto"
    resnet_channels: tuple[int, ...] = (16, 32, 32)
    torso_output: int = 256
    mlp_sizes: tuple[int, ...] = (64, 64)
    mlp_activation: str = "tanh"
    use_prev_action: bool = False

    @classmethod
    def from_dict(cls, d: dict | None) -> "AgentConfig":
        d = dict(d or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            check_choice("agent option", key, sorted(fields))
        for key in ("resnet_channels", "mlp_sizes"):
            if key in d:
                d[key] = tuple(int(v) for v in d[key])
        cfg = cls(**d)
        check_choice("agent torso", cfg.torso, TORSOS)
        check_choice("agent mlp_activation", cfg.mlp_activation, sorted(ACTIVATIONS))
        return cfg

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


class ResidualBlock(nn.Module):
    """``x + conv(relu(conv(relu(x))))`` with 3x3 convs keeping the channel count."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, stride=1, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


def _pooled_size(n: int) -> int:
    """Output size of max-pool 3x3, stride 2, pad 1 on a side of length n."""
    return (n + 2 * 1 - 3) // 2 + 1


class ResNetTorso(nn.Module):
    """IMPALA "large" torso: uint8 ``[N, C, H, W]`` -> ``[N, output_size]`` (divides by 255).

    The convolutions run in ``channels_last`` memory format (same numbers as the default
    layout; measured ~1.8x faster forward+backward on CPU); :meth:`use_memory_format` switches."""

    def __init__(self, obs_shape: Sequence[int], channels: Sequence[int] = (16, 32, 32), output_size: int = 256):
        super().__init__()
        in_ch, h, w = obs_shape
        stages = []
        for out_ch in channels:
            stages += [nn.Conv2d(in_ch, out_ch, 3, stride=1, padding=1),
                       nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out_ch), ResidualBlock(out_ch)]
            in_ch, h, w = out_ch, _pooled_size(h), _pooled_size(w)
        self.stages = nn.Sequential(*stages)
        self.flat_size = in_ch * h * w  # 32 * 11 * 11 = 3872 for 84x84 frames
        self.fc = nn.Linear(self.flat_size, output_size)
        self.output_size = output_size
        self.use_memory_format(torch.channels_last)

    def use_memory_format(self, memory_format: torch.memory_format) -> "ResNetTorso":
        """Run the convolutions in ``memory_format`` (``torch.channels_last`` or ``torch.contiguous_format``)."""
        self.memory_format = memory_format
        self.stages.to(memory_format=memory_format)
        return self

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = (obs.float() / 255.0).contiguous(memory_format=self.memory_format)
        x = F.relu(self.stages(x))
        return F.relu(self.fc(x.flatten(1)))  # flatten reads the logical [C, H, W] order in any layout


class MLPTorso(nn.Module):
    """Vector observations ``[N, *obs_shape]`` (flattened) -> ``[N, sizes[-1]]``."""

    def __init__(self, obs_shape: Sequence[int], sizes: Sequence[int] = (64, 64), activation: str = "tanh"):
        super().__init__()
        layers: list[nn.Module] = []
        n_in = 1
        for s in obs_shape:
            n_in *= int(s)
        for size in sizes:
            layers += [nn.Linear(n_in, size), ACTIVATIONS[activation]()]
            n_in = size
        self.net = nn.Sequential(*layers)
        self.output_size = n_in

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float().flatten(1))


class Agent(nn.Module):
    """Actor-critic agent around a :mod:`rfwp_rl.cores` core.

    Args:
        obs_shape: one observation's shape: ``(C, H, W)`` uint8 frames or ``(D,)`` vectors.
        num_actions: size A of the discrete action space.
        core: core name (``rfwp_rl.cores.available()``), e.g. ``"rdn"``.
        core_config: keyword options of the core (e.g. ``hidden_size``).
        agent_config: :class:`AgentConfig` or its dict form.
    """

    def __init__(self, obs_shape: Sequence[int], num_actions: int, core: str = "lstm",
                 core_config: dict | None = None, agent_config: AgentConfig | dict | None = None):
        super().__init__()
        from rfwp_rl import cores

        self.obs_shape = tuple(int(s) for s in obs_shape)
        self.num_actions = int(num_actions)
        self.core_name = core
        self.core_config = dict(core_config or {})
        cfg = agent_config if isinstance(agent_config, AgentConfig) else AgentConfig.from_dict(agent_config)
        self.config = cfg
        torso = cfg.torso
        if torso == "auto":
            torso = "resnet" if len(self.obs_shape) == 3 else "mlp"
        if torso == "resnet":
            if len(self.obs_shape) != 3:
                raise UserError(f"agent torso 'resnet' needs image observations [C, H, W], got shape {self.obs_shape}; "
                                "use torso = 'mlp'")
            self.torso: nn.Module = ResNetTorso(self.obs_shape, cfg.resnet_channels, cfg.torso_output)
        else:
            self.torso = MLPTorso(self.obs_shape, cfg.mlp_sizes, cfg.mlp_activation)
        core_input = self.torso.output_size + 1 + (self.num_actions if cfg.use_prev_action else 0)
        self.core = cores.make(core, core_input, **self.core_config)
        self.policy = nn.Linear(self.core.output_size, self.num_actions)
        self.baseline = nn.Linear(self.core.output_size, 1)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
        """The core's zero state for ``batch_size`` entries (batch is dim 0 of every tensor)."""
        return tuple(self.core.initial_state(batch_size, device=device))

    def forward(self, obs: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, state: tuple,
                prev_action: torch.Tensor | None = None, greedy: bool = False) -> tuple[dict[str, torch.Tensor], tuple]:
        """Run T steps of B environments.

        Args:
            obs: ``[T, B, *obs_shape]`` (uint8 frames or float vectors).
            reward: ``[T, B]`` reward received on arriving at ``obs[t]`` (clipped to [-1, 1] here).
            done: ``[T, B]`` bool, True where ``obs[t]`` is the first frame of a new episode:
                the core state of that entry is reset before step t.
            state: core state (tuple of ``[B, ...]`` tensors) before step 0.
            prev_action: ``[T, B]`` int64 action taken before ``obs[t]`` (only used with
                ``use_prev_action``; zeroed at episode starts).
            greedy: take the argmax action instead of sampling.
        Returns:
            ``({"policy_logits": [T, B, A], "baseline": [T, B], "action": [T, B]}, new_state)``.
            Under a caller's autocast (``--precision bf16``) only the torso runs in low precision;
            the core and the heads get fp32 features and return fp32 values.
        """
        T, B = obs.shape[:2]
        features = self.torso(obs.reshape(T * B, *obs.shape[2:])).view(T, B, -1)
        with torch.autocast(features.device.type, enabled=False):  # only the torso runs in the caller's autocast
            return self._core_and_heads(features.float(), reward, done, state, prev_action, greedy)

    def _core_and_heads(self, features: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, state: tuple,
                        prev_action: torch.Tensor | None, greedy: bool) -> tuple[dict[str, torch.Tensor], tuple]:
        """``features [T, B, F]`` fp32 -> the core (its fused kernels are fp32) -> policy and baseline heads."""
        T, B = features.shape[:2]
        done = done.bool()
        inputs = [features, reward.float().clamp(-1.0, 1.0).unsqueeze(-1)]
        if self.config.use_prev_action:
            if prev_action is None:
                raise ValueError("this agent uses the previous action: pass prev_action [T, B]")
            one_hot = F.one_hot(prev_action.long(), self.num_actions).float()
            inputs.append(one_hot * (~done).unsqueeze(-1).float())
        core_out, state = self.core(torch.cat(inputs, dim=-1), state, done)
        logits = self.policy(core_out)
        baseline = self.baseline(core_out).squeeze(-1)
        if greedy:
            action = logits.argmax(dim=-1)
        else:
            action = torch.multinomial(F.softmax(logits.reshape(T * B, -1).float(), dim=-1), 1).view(T, B)
        return {"policy_logits": logits, "baseline": baseline, "action": action}, state


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


ATARI_OBS_SHAPE = (4, 84, 84)
# The Atari agent presets by core: the paper's six, then the GRU and FWM baselines.
ATARI_PRESETS = {"ff": "atari_ff", "lstm": "atari_lstm", "lt": "atari_lt", "delta": "atari_delta",
                 "rdn": "atari_rdn", "delta_rnn": "atari_delta_rnn", "gru": "atari_gru", "fwm": "atari_fwm"}


def build_agent(preset: Any, obs_shape: Sequence[int], num_actions: int) -> Agent:
    """An :class:`Agent` from a loaded :class:`rfwp_rl.presets.Preset`."""
    return Agent(obs_shape, num_actions, preset.core, preset.core_config, preset.agent)


def atari_param_counts(num_actions: int) -> dict[str, int]:
    """Parameter counts of the Atari presets (``agents/atari_<core>.toml``) for A actions,
    e.g. ``{"ff": 1091038, ...}`` for A = 6. Built on the meta device (no memory used)."""
    from rfwp_rl.presets import load_preset

    counts = {}
    for core, name in ATARI_PRESETS.items():
        preset = load_preset(name)
        with torch.device("meta"):
            agent = build_agent(preset, ATARI_OBS_SHAPE, num_actions)
        counts[core] = count_parameters(agent)
    return counts
