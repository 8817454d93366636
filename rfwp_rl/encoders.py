"""Observation encoders ("torsos"): one observation -> a feature vector, chosen from the observation space.

The space is a tensor space of :mod:`rfwp_rl.envs.spaces` (a leaf, or a flat Dict of leaves):

- images (``Box`` of rank 3, ``[C, H, W]`` or ``[H, W, C]``, the channel axis being the short one
  at either end): :class:`ResNetTorso`, the IMPALA "large" torso, when both sides are at least
  :data:`RESNET_MIN_SIDE` (its three stride-2 poolings fit); else :class:`GridTorso`, a few 3x3
  convolutions without pooling (small symbolic grids such as 7x7x3 grid worlds). uint8 images are
  scaled by 1/255, except in a grid torso with ``grid_embedding`` (the default), where each cell
  value is a symbol (an object, colour or state index) and is embedded instead;
- other ``Box`` (vectors; any other rank is flattened): :class:`MLPTorso`;
- ``Discrete(n)`` / ``MultiDiscrete(nvec)``: one-hot (concatenated), then the MLP;
- ``Dict``: :class:`DictTorso`: every image part through its own conv torso, all other parts
  concatenated into one vector through one MLP, the results concatenated.

:class:`rfwp_rl.agent.AgentConfig` overrides the choice (``torso`` for a leaf space, ``encoders``
per part of a Dict; ``"skip"`` leaves a part out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gymnasium import spaces

from rfwp_rl.errors import UserError

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
TORSOS = ("auto", "resnet", "grid", "mlp")
PART_ENCODERS = ("auto", "resnet", "grid", "mlp", "skip")
RESNET_MIN_SIDE = 32  # smaller images go to the grid torso (after 3 poolings a 32-side image is 4x4)


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


def image_layout(shape: Sequence[int]) -> tuple[tuple[int, int, int], bool]:
    """``((C, H, W), hwc)`` of an image shape: channels first when the first axis is shorter than both
    others (Atari's frame stack ``[4, 84, 84]``), else channels last, gymnasium's image convention
    (MiniGrid's ``[7, 7, 3]``, MinAtar's ``[10, 10, C]`` with C up to 10)."""
    a, b, c = (int(s) for s in shape)
    if a < b and a < c:
        return (a, b, c), False
    return (c, a, b), True


def _image_input(obs: torch.Tensor, hwc: bool, divisor: float) -> torch.Tensor:
    x = obs.float() / divisor if divisor != 1.0 else obs.float()
    return x.permute(0, 3, 1, 2) if hwc else x


def has_image_torso(torso: nn.Module) -> bool:
    """Whether ``torso`` runs the ResNet anywhere (alone or as a part of a Dict/Tuple encoder): the
    thread choice's "heavy model" (:func:`rfwp_rl.perf.choose_torch_threads`)."""
    return any(isinstance(m, ResNetTorso) for m in torso.modules())


class ResNetTorso(nn.Module):
    """IMPALA "large" torso (Espeholt et al. 2018, Fig. 3 right): images ``[N, C, H, W]`` (``[N, H, W, C]``
    with ``hwc``) -> ``[N, output_size]``. For C in ``channels``: a 3x3 conv, a 3x3 max-pool (stride 2,
    pad 1) and two residual blocks; relu, flatten (32 x 11 x 11 = 3872 for 84x84), linear, relu.
    The input is divided by ``divisor`` (255 for uint8 frames).

    The convolutions run in ``channels_last`` memory format (same numbers as the default
    layout, faster forward+backward on CPU); :meth:`use_memory_format` switches."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        channels: Sequence[int] = (16, 32, 32),
        output_size: int = 256,
        hwc: bool = False,
        divisor: float = 255.0,
    ):
        super().__init__()
        in_ch, h, w = obs_shape
        self.hwc, self.divisor = hwc, divisor
        stages = []
        for out_ch in channels:
            stages += [
                nn.Conv2d(in_ch, out_ch, 3, stride=1, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                ResidualBlock(out_ch),
                ResidualBlock(out_ch),
            ]
            in_ch, h, w = out_ch, _pooled_size(h), _pooled_size(w)
        self.stages = nn.Sequential(*stages)
        self.flat_size = in_ch * h * w
        self.fc = nn.Linear(self.flat_size, output_size)
        self.output_size = output_size
        self.use_memory_format(torch.channels_last)

    def use_memory_format(self, memory_format: torch.memory_format) -> ResNetTorso:
        """Run the convolutions in ``memory_format`` (``torch.channels_last`` or ``torch.contiguous_format``)."""
        self.memory_format = memory_format
        self.stages.to(memory_format=memory_format)
        return self

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = _image_input(obs, self.hwc, self.divisor).contiguous(memory_format=self.memory_format)
        x = F.relu(self.stages(x))
        return F.relu(self.fc(x.flatten(1)))  # flatten reads the logical [C, H, W] order in any layout


class GridTorso(nn.Module):
    """Small images (grids) ``[N, C, H, W]`` (``[N, H, W, C]`` with ``hwc``) -> ``[N, output_size]``: 3x3
    convolutions (stride 1, pad 1, relu) with ``channels``, no pooling (every cell of a 7x7 grid keeps its
    own features), flatten, linear, relu.

    With ``embedding`` E > 0 (uint8 grids only) the cells are symbols, not intensities: grid worlds store
    object, colour and state indices, which a 1/255 scale leaves nearly equal (a key 5/255, a ball 6/255).
    Each channel's value then picks a learned E-vector and a cell is the sum over its channels (the
    bag-of-words image embedding of Hui et al. 2020, "BabyAI 1.1"), ``[N, E, H, W]`` into the
    convolutions."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        channels: Sequence[int] = (16, 32, 32),
        output_size: int = 256,
        hwc: bool = False,
        divisor: float = 255.0,
        embedding: int = 0,
    ):
        super().__init__()
        in_ch, h, w = obs_shape
        self.hwc, self.divisor = hwc, divisor
        self.embed: nn.Embedding | None = None
        self.symbol_cells, self.symbol_channels = h * w, in_ch  # with an embedding: a symbol per cell and channel
        if embedding:
            # one table of 256 values per channel: channel c's value v is row 256 c + v
            self.embed = nn.Embedding(256 * in_ch, embedding)
            self.register_buffer("offsets", torch.arange(in_ch) * 256, persistent=False)
            in_ch = embedding
        layers: list[nn.Module] = []
        for out_ch in channels:
            layers += [nn.Conv2d(in_ch, out_ch, 3, stride=1, padding=1), nn.ReLU()]
            in_ch = out_ch
        self.convs = nn.Sequential(*layers)
        self.flat_size = in_ch * h * w
        self.fc = nn.Linear(self.flat_size, output_size)
        self.output_size = output_size

    def cells(self, obs: torch.Tensor) -> torch.Tensor:
        """The convolutions' input ``[N, C or E, H, W]`` of observations ``obs``."""
        if self.embed is None:
            return _image_input(obs, self.hwc, self.divisor)
        x = obs if self.hwc else obs.permute(0, 2, 3, 1)  # [N, H, W, C]
        return self.embed(x.long() + self.offsets).sum(-2).permute(0, 3, 1, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(self.convs(self.cells(obs)).flatten(1)))

    def symbols(self, obs: torch.Tensor) -> torch.Tensor:
        """The cells' symbols ``[N, H * W * C]`` int64 (cell-major, channel last): what the embedding reads."""
        x = obs if self.hwc else obs.permute(0, 2, 3, 1)
        return x.reshape(x.shape[0], -1).long()


def embedded_grids(torso: nn.Module) -> list[tuple[str | None, GridTorso]]:
    """The grid torsos of ``torso`` that embed their cells as symbols, with their observation part's path
    (None for a leaf observation)."""
    if isinstance(torso, GridTorso):
        return [(None, torso)] if torso.embed is not None else []
    if isinstance(torso, DictTorso):
        return [(k, t) for k, t in torso.images.items() if isinstance(t, GridTorso) and t.embed is not None]
    return []


def vector_width(space: gymnasium.Space) -> int:
    """Width of :func:`vector_features` for one leaf space."""
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return int(math.prod(space.shape))


def vector_features(space: gymnasium.Space, x: torch.Tensor) -> torch.Tensor:
    """One leaf ``[N, *shape]`` -> float ``[N, vector_width(space)]``: one-hot for Discrete/MultiDiscrete, else
    flattened."""
    if isinstance(space, spaces.Discrete):
        return F.one_hot(x.long(), int(space.n)).float()
    if isinstance(space, spaces.MultiDiscrete):
        return torch.cat([F.one_hot(x[:, i].long(), int(n)).float() for i, n in enumerate(space.nvec)], dim=-1)
    return x.float().flatten(1)


class MLPTorso(nn.Module):
    """Vector observations ``[N, *obs_shape]`` (flattened) -> ``[N, sizes[-1]]``. With ``space`` (a Discrete
    or MultiDiscrete leaf) the input is its integer observation, one-hot encoded first."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        space: gymnasium.Space | None = None,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        self.space = space
        n_in = vector_width(space) if space is not None else int(math.prod(int(s) for s in obs_shape))
        for size in sizes:
            layers += [nn.Linear(n_in, size), ACTIVATIONS[activation]()]
            n_in = size
        self.net = nn.Sequential(*layers)
        self.output_size = n_in

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = vector_features(self.space, obs) if self.space is not None else obs.float().flatten(1)
        return self.net(x)


def _is_image(space: gymnasium.Space) -> bool:
    return isinstance(space, spaces.Box) and len(space.shape) == 3


def choose_encoder(space: gymnasium.Space, choice: str, what: str) -> str:
    """The encoder of one leaf: ``choice`` (``auto`` picks from the space), checked against the space."""
    if choice == "auto":
        if not _is_image(space):
            return "mlp"
        (_, h, w), _ = image_layout(space.shape)
        return "resnet" if min(h, w) >= RESNET_MIN_SIDE else "grid"
    if choice in ("resnet", "grid") and not _is_image(space):
        raise UserError(f"{what} {choice!r} needs image observations [C, H, W] or [H, W, C], got {space}; use 'mlp'")
    return choice


def image_torso(kind: str, space: gymnasium.Space, cfg: Any) -> nn.Module:
    """A :class:`ResNetTorso` or :class:`GridTorso` for the image space ``space`` (``cfg``: AgentConfig)."""
    chw, hwc = image_layout(space.shape)
    uint8 = space.dtype == np.uint8
    divisor = 255.0 if uint8 else 1.0
    if kind == "resnet":
        return ResNetTorso(chw, cfg.resnet_channels, cfg.torso_output, hwc, divisor)
    return GridTorso(chw, cfg.grid_channels, cfg.torso_output, hwc, divisor, cfg.grid_embedding if uint8 else 0)


def leaf_torso(space: gymnasium.Space, cfg: Any) -> nn.Module:
    """The torso of a leaf observation space (``cfg.torso`` overrides the choice)."""
    kind = choose_encoder(space, cfg.torso, "agent torso")
    if kind in ("resnet", "grid"):
        return image_torso(kind, space, cfg)
    onehot = space if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) else None
    return MLPTorso(space.shape, cfg.mlp_sizes, cfg.mlp_activation, onehot)


class DictTorso(nn.Module):
    """A flat Dict observation ``{path: [N, ...]}`` -> ``[N, output_size]``: image parts through their own
    conv torsos (``images``), the other parts one-hot/flattened, concatenated (sorted by path) and through
    one MLP (``vector``); outputs concatenated, vector first. ``encoders`` maps a path to an encoder
    (:data:`PART_ENCODERS`) instead of the automatic choice."""

    def __init__(self, space: spaces.Dict, cfg: Any):
        super().__init__()
        overrides = dict(cfg.encoders)
        for key in overrides:
            if key not in space.spaces:
                raise UserError(
                    f"agent encoders: observation part {key!r} does not exist; parts: {', '.join(space.spaces)}"
                )
        self.images = nn.ModuleDict()
        self.vector_parts: dict[str, gymnasium.Space] = {}
        for key, sub in space.spaces.items():
            kind = choose_encoder(sub, overrides.get(key, "auto"), f"agent encoder of part {key!r}")
            if kind == "skip":
                continue
            if kind in ("resnet", "grid"):
                self.images[key] = image_torso(kind, sub, cfg)
            else:
                self.vector_parts[key] = sub
        width = sum(vector_width(s) for s in self.vector_parts.values())
        self.vector = MLPTorso((width,), cfg.mlp_sizes, cfg.mlp_activation) if width else None
        self.output_size = (self.vector.output_size if self.vector is not None else 0) + sum(
            t.output_size for t in self.images.values()
        )
        if self.output_size == 0:
            raise UserError("agent encoders skip every observation part; keep at least one")

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        outs = []
        if self.vector is not None:
            outs.append(self.vector(torch.cat([vector_features(s, obs[k]) for k, s in self.vector_parts.items()], -1)))
        outs += [torso(obs[key]) for key, torso in self.images.items()]
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


def make_torso(space: gymnasium.Space, cfg: Any) -> nn.Module:
    """The torso of a tensor observation space (leaf or flat Dict); ``cfg`` is an AgentConfig."""
    if isinstance(space, spaces.Dict):
        return DictTorso(space, cfg)
    return leaf_torso(space, cfg)
