"""Recall of the past: an auxiliary task that asks the core's output at step t to reconstruct the
agent's observation features at step t - k, for a lag k drawn uniformly in 1..L per step (Trinh,
Dai, Luong, Le 2018, *Learning Longer-term Dependencies in RNNs with Auxiliary Losses*, Sec. 3:
reconstructing the past from an anchor point; here one lag per step, predicted by one head).

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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RecallHead(nn.Module):
    """Predicts features ``[..., F]`` of the step ``k`` back from the core output ``[..., H]`` and
    the lag ``k`` in 1..``lags`` (one-hot): a two-layer MLP, ReLU."""

    def __init__(self, core_size: int, feature_size: int, lags: int, hidden_size: int = 256) -> None:
        super().__init__()
        self.lags = lags
        self.net = nn.Sequential(
            nn.Linear(core_size + lags, hidden_size), nn.ReLU(), nn.Linear(hidden_size, feature_size)
        )

    def forward(self, core_out: Tensor, lag: Tensor) -> Tensor:
        return self.net(torch.cat([core_out, F.one_hot(lag - 1, self.lags).to(core_out.dtype)], dim=-1))


def draw_lags(
    shape: tuple[int, int],
    lags: int,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One lag per (t, b), uniform in 1..min(``lags``, T - 1) (a longer one never lies in the unroll):
    ``[T, B]`` int64."""
    return torch.randint(1, max(min(lags, shape[0] - 1), 1) + 1, shape, device=device, generator=generator)


def recall_loss(
    head: RecallHead, core_out: Tensor, features: Tensor, done: Tensor, lag: Tensor
) -> tuple[Tensor, Tensor]:
    """The recall loss (module docstring) for lags ``lag [T, B]`` and the mask ``[T, B]`` of the
    (t, b) it counts: those whose step t - k lies inside the unroll and in the same episode."""
    T = core_out.shape[0]
    lag = lag.to(core_out.device)
    t = torch.arange(T, device=lag.device).unsqueeze(1)
    src = t - lag  # the step whose features are asked for
    episode = done.to(lag.device).long().cumsum(0)  # entries with equal counts lie in one episode
    valid = src >= 0
    src = src.clamp(min=0)
    valid &= episode.gather(0, src) == episode
    target = features.detach().gather(0, src.unsqueeze(-1).expand(-1, -1, features.shape[-1]))
    pred = head(core_out, lag)
    scale = features.detach().flatten(0, 1).var(0, unbiased=False).sum().clamp(min=1e-8)
    err = (pred - target).pow(2).sum(-1) / scale
    mask = valid.to(err.dtype)
    return (err * mask).sum(), mask
