"""The learner's optimizer and its learning-rate schedule: the optimizer of ``cfg.optimizer``
(:func:`make_optimizer`), the linear decay over the run's env steps (:func:`linear_decay_of_steps`)
and one optimizer step on the gradients in ``.grad`` (:func:`apply_gradients`: grad-norm clip,
step, schedule).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn as nn

from rfwp_rl.impala.config import ImpalaConfig


def linear_decay_of_steps(total_steps: int, steps_trained: Callable[[], int]):
    """LR multiplier for ``LambdaLR`` that reads the env steps trained so far (``steps_trained()``)
    instead of counting updates: 1 at the start, 0 after ``total_steps``. In a learner group an
    update consumes the env steps of every learner that handed in gradients, a number that varies
    with the group's size. Call ``scheduler.step()`` after adding the update's env steps to the count."""

    def factor(_update: int) -> float:
        return max(0.0, 1.0 - min(steps_trained(), total_steps) / total_steps)

    return factor


def make_optimizer(agent: nn.Module, cfg: ImpalaConfig) -> torch.optim.Optimizer:
    """``cfg.optimizer``: RMSProp as in TorchBeast / the paper (``learning_rate``, ``rmsprop_alpha``,
    ``rmsprop_eps``, ``rmsprop_momentum``) or Adam (``learning_rate``, ``adam_eps``)."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    return torch.optim.RMSprop(
        agent.parameters(),
        lr=cfg.learning_rate,
        alpha=cfg.rmsprop_alpha,
        eps=cfg.rmsprop_eps,
        momentum=cfg.rmsprop_momentum,
    )


def apply_gradients(
    agent: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    grad_norm_clip: float,
    step: bool = True,
) -> dict[str, float]:
    """One optimizer step on the gradients in ``.grad``: grad-norm clip, the optimizer (RMSProp or Adam), LR schedule.

    ``step=False`` (a skipped, non-finite update) only advances the schedule. The caller zeroes
    the gradients afterwards (one learner: set to None; a learner group keeps them allocated).
    Returns ``learner/grad_norm`` (before clipping; NaN when skipped), ``learner/lr`` (used for
    this step) and ``learner/skipped``.
    """
    lr = optimizer.param_groups[0]["lr"]
    stats = {"learner/grad_norm": float("nan"), "learner/skipped": 1.0, "learner/lr": lr}
    if step:
        # 0: no clipping (the norm is still measured)
        stats["learner/grad_norm"] = float(nn.utils.clip_grad_norm_(agent.parameters(), grad_norm_clip or math.inf))
        optimizer.step()
        stats["learner/skipped"] = 0.0
    with warnings.catch_warnings():  # torch warns when the very first update was skipped
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()  # the schedule counts learner steps, skipped ones included
    return stats
