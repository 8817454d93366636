"""Recall of the past: an auxiliary task that asks the core's output at step t to reconstruct the
agent's observation features at step t - k, for a lag k drawn per step uniformly over the steps of its
episode that lie in the unroll, at most L back (Trinh, Dai, Luong, Le 2018, *Learning Longer-term
Dependencies in RNNs with Auxiliary Losses*, Sec. 3: reconstructing the past from an anchor point; here
one lag per step, predicted by one head). Drawn within the episode, not uniform in 1..L: where episodes
are short against the unroll, most uniform lags reach into another episode and are lost, and the few left
rarely reach its first steps, where a cue is seen (``results/envs/minigrid.md``: MemoryS7).

Why: a memory task's reward reaches the core's writes only through the policy gradient at the step
that needs the memory, a signal of about 1/n of a supervised label's for n answers
(``results/memory/probe/``: the cores store what RL does not find). Reconstruction gives every
step a dense, supervised signal that trains the memory to keep what it has seen.

Shapes: core output ``[T, B, H]``; features ``[T, B, F]`` (the agent's torso output, detached: the
task trains the core and the head, never the features it is asked for); ``done [T, B]`` (True
where entry t starts an episode: a lag never reaches into an earlier episode). The loss is the
sum over valid (t, b) of ``||head(h_t, k) - f_{t-k}||^2 / sum_i Var(f_i)`` (the variance over
the batch's steps: predicting the mean features costs about 1 per step whatever the torso's scale,
so only what tells steps apart lowers it; a sum over steps as the learner's other losses).

Symbols: where the agent embeds a uint8 grid's cells as symbols (``agent.grid_embedding``), the head also
names every symbol of that grid k steps back (a cross-entropy over the values of its channel that the learner
has seen so far, of the 256 a uint8 allows: a grid uses a few, MiniGrid at most 11, and a value never seen is
never a target, so the softmax leaves the others out and costs a few instead of 256 logits a symbol), each
weighted by one over how often its (channel, value) is a target in the batch, the weights' mean 1: walls and
floor then count as much as the one key that must be remembered, which the features' squared error, dominated
by the common cells, leaves unlearned (``results/envs/minigrid.md``: MemoryS7's supervised probe). The step's
term is the weighted mean over its symbols, summed over steps as above.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SYMBOL_VALUES = 256  # a uint8 cell channel's values
SYMBOL_WIDTH = 16  # the width of the head's prediction for one cell, read by each channel's decoder


class RecallHead(nn.Module):
    """Predicts features ``[..., F]`` of the step ``k`` back from the core output ``[..., H]`` and
    the lag ``k`` in 1..``lags`` (one-hot): a two-layer MLP, ReLU. With ``grids`` (the ``(cells, channels)``
    of each embedded grid) a second MLP of the same input predicts a ``SYMBOL_WIDTH`` vector per cell, which
    a linear decoder per grid channel turns into the logits of that channel's ``SYMBOL_VALUES`` values."""

    def __init__(
        self,
        core_size: int,
        feature_size: int,
        lags: int,
        hidden_size: int = 256,
        grids: Sequence[tuple[int, int]] = (),
    ) -> None:
        super().__init__()
        self.lags = lags
        self.net = nn.Sequential(
            nn.Linear(core_size + lags, hidden_size), nn.ReLU(), nn.Linear(hidden_size, feature_size)
        )
        self.symbols = None
        if grids:
            # symbol position p (grids in order, cell-major, channel last) is read from cell cell_of[p] by the
            # decoder of its channel channel_of[p]
            cell_of, channel_of, cells, channels = [], [], 0, 0
            for n_cells, n_channels in grids:
                cell_of += [cells + p // n_channels for p in range(n_cells * n_channels)]
                channel_of += [channels + p % n_channels for p in range(n_cells * n_channels)]
                cells, channels = cells + n_cells, channels + n_channels
            self.register_buffer("cell_of", torch.tensor(cell_of), persistent=False)
            self.register_buffer("channel_of", torch.tensor(channel_of), persistent=False)
            self.symbols = nn.Sequential(
                nn.Linear(core_size + lags, hidden_size), nn.ReLU(), nn.Linear(hidden_size, cells * SYMBOL_WIDTH)
            )
            self.decoder_weight = nn.Parameter(torch.randn(channels, SYMBOL_WIDTH, SYMBOL_VALUES) / SYMBOL_WIDTH**0.5)
            self.decoder_bias = nn.Parameter(torch.zeros(channels, SYMBOL_VALUES))
            # the values seen in each channel: the symbols' softmax runs over them (module docstring)
            self.register_buffer("seen", torch.zeros(channels, SYMBOL_VALUES, dtype=torch.bool), persistent=False)

    def _input(self, core_out: Tensor, lag: Tensor) -> Tensor:
        return torch.cat([core_out, F.one_hot(lag - 1, self.lags).to(core_out.dtype)], dim=-1)

    def forward(self, core_out: Tensor, lag: Tensor) -> Tensor:
        return self.net(self._input(core_out, lag))

    def see(self, symbols: Tensor) -> None:
        """Add the values of ``symbols [..., P]`` (position p in channel ``channel_of[p]``) to those seen."""
        self.seen[self.channel_of.expand(symbols.shape).flatten(), symbols.flatten()] = True

    def vocabulary(self) -> tuple[Tensor, Tensor, Tensor]:
        """The values seen, per channel: ``values [C, V]`` (ascending, then padding; V: the most of one channel),
        ``valid [C, V]`` (False on the padding) and ``place [C, SYMBOL_VALUES]``, each value's column in ``values``."""
        counts = self.seen.sum(1)
        width = max(int(counts.max()), 1)
        values = torch.argsort((~self.seen).to(torch.int8), dim=1, stable=True)[:, :width]  # seen values first
        valid = torch.arange(width, device=counts.device) < counts[:, None]
        return values, valid, self.seen.long().cumsum(1) - 1

    def symbol_logits(self, core_out: Tensor, lag: Tensor, values: Tensor, valid: Tensor) -> Tensor:
        """``core_out [M, H]``, ``lag [M]`` -> logits ``[M, P, V]`` of the P symbols ``lag`` back, over the values
        of :meth:`vocabulary` (``-inf`` on its padding)."""
        cells = self.symbols(self._input(core_out, lag)).view(core_out.shape[0], -1, SYMBOL_WIDTH)
        x = cells[:, self.cell_of]  # [M, P, W]
        weight = self.decoder_weight.gather(2, values.unsqueeze(1).expand(-1, SYMBOL_WIDTH, -1))  # [C, W, V]
        bias = self.decoder_bias.gather(1, values)  # [C, V]
        logits = torch.einsum("mpw,pwv->mpv", x, weight[self.channel_of]) + bias[self.channel_of]
        return logits.masked_fill(~valid[self.channel_of], float("-inf"))


def draw_lags(
    done: Tensor,
    lags: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One lag per (t, b), uniform over the steps of its own episode that lie in the unroll, at most ``lags``
    back: 1..min(``lags``, t - s) for the episode's first entry s in the unroll (0 where it starts before
    it). ``done [T, B]`` (True where entry t starts an episode) -> ``[T, B]`` int64; where there is no
    earlier step (t = s) the lag is 1 and the step is masked by :func:`recall_loss`."""
    t, start = _episode_starts(done)
    high = (t - start).clamp(max=lags, min=1)
    u = torch.rand(done.shape, device=done.device, generator=generator)
    return (u * high).long().clamp(max=high - 1) + 1


def _episode_starts(done: Tensor) -> tuple[Tensor, Tensor]:
    """``done [T, B]`` -> the step ``t`` of each entry and the first entry of its episode in the unroll
    (0 where the episode began before it), both ``[T, B]`` int64."""
    t = torch.arange(done.shape[0], device=done.device).unsqueeze(1).expand(done.shape)
    return t, torch.where(done.bool(), t, torch.zeros_like(t)).cummax(0).values


def _sources(done: Tensor, lag: Tensor) -> tuple[Tensor, Tensor]:
    """For lags ``[T, B]``: the step each (t, b) asks for, ``t - lag`` clamped to 0, and whether it is
    valid (inside the unroll and in the same episode), both ``[T, B]``."""
    t, start = _episode_starts(done.to(lag.device))
    src = t - lag
    return src.clamp(min=0), src >= start


def recall_loss(
    head: RecallHead, core_out: Tensor, features: Tensor, done: Tensor, lag: Tensor, symbols: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The recall loss (module docstring) for lags ``lag [T, B]`` and the mask ``[T, B]`` of the
    (t, b) it counts: those whose step t - k lies inside the unroll and in the same episode. ``symbols``
    ``[T, B, P]`` int64: the embedded grids' symbols, for a head with ``grids``."""
    lag = lag.to(core_out.device)
    src, valid = _sources(done, lag)
    target = features.detach().gather(0, src.unsqueeze(-1).expand(-1, -1, features.shape[-1]))
    pred = head(core_out, lag)
    scale = features.detach().flatten(0, 1).var(0, unbiased=False).sum().clamp(min=1e-8)
    err = (pred - target).pow(2).sum(-1) / scale
    mask = valid.to(err.dtype)
    total = (err * mask).sum()
    if head.symbols is not None and symbols is not None and bool(valid.any()):
        head.see(symbols)
        total = total + symbol_recall_sum(
            head,
            core_out[valid],
            lag[valid],
            symbols.gather(0, src.unsqueeze(-1).expand(-1, -1, symbols.shape[-1]))[valid],
        )
    return total, mask


def symbol_recall_sum(head: RecallHead, core_out: Tensor, lag: Tensor, target: Tensor) -> Tensor:
    """The symbols' term summed over ``M`` steps: ``core_out [M, H]``, ``lag [M]``, ``target [M, P]`` the
    symbols asked for (each one seen: :meth:`RecallHead.see`). Each symbol's cross-entropy, over the values seen
    in its channel, is weighted by one over the count of its (channel, value) among the ``M x P`` targets, the
    weights scaled to mean 1; a step's term is its weighted mean."""
    values, valid, place = head.vocabulary()
    logits = head.symbol_logits(core_out, lag, values, valid)
    column = place[head.channel_of.expand(target.shape), target]  # [M, P]: each target's column in its channel
    ce = F.cross_entropy(logits.flatten(0, 1), column.flatten(), reduction="none").view(target.shape)
    kind = head.channel_of * SYMBOL_VALUES + target  # [M, P]: which (channel, value) each target is
    counts = torch.bincount(kind.flatten(), minlength=int(head.decoder_bias.numel()))
    weight = 1.0 / counts[kind].to(ce.dtype)
    weight = weight / weight.mean()
    return (weight * ce).mean(-1).sum()
