"""IMPALA learner: V-trace actor-critic loss and one optimizer update.

A batch holds B rollouts of T+1 time steps (time-major ``[T+1, B, ...]``). Entry t of a
rollout holds what the actor saw and did at step t:

- ``obs[t]``, ``reward[t]`` (received on arriving at ``obs[t]``), ``done[t]`` (``obs[t]`` is
  the first frame of a new episode), ``prev_action[t]`` (the action before ``obs[t]``);
- ``action[t]`` and ``policy_logits[t]``: what the behaviour policy chose at ``obs[t]``;
- ``truncated[t]``: ``obs[t]`` is the last observation of an episode cut by a time limit. Its
  action was never executed (the next entry starts a new episode): the step is masked out of the
  losses and the step before it bootstraps from ``V(obs[t])`` (see :mod:`rfwp_rl.impala.vtrace`).

Entry 0 repeats the last entry of the previous rollout, and ``initial_state`` is the core
state before entry 0, so the learner re-runs the whole unroll through the core (full BPTT,
resets at episode starts) and bootstraps from its value of the last entry. Losses are sums
over time and batch, as in TorchBeast (whose hyperparameters the paper used)::

    pg       = -sum log pi(a_t|x_t) * A_t                   (A_t: V-trace advantage)
    baseline = baseline_cost * 0.5 * sum (v_t - V(x_t))^2   (v_t: V-trace target)
    entropy  = entropy_cost * sum_t sum_a pi log pi         (minus the entropy)

With ``normalize_advantages`` the policy-gradient advantages are divided by their root mean
square over the batch's unmasked steps, so that the policy step does not scale with the reward
magnitude: a memory task's single +-1 at the end of an episode otherwise meets an entropy bonus
tuned for Atari's dense clipped rewards. They are not centred: on a memory task most steps'
actions do not matter and their advantages are near 0; subtracting the batch mean gives them all
one sign, and that noise made the policy collapse (Recurrent Delta Net on DelayedRecall-easy:
entropy 0 and return 0.75 of 1 after 600k steps centred, return 1.0 after 75k uncentred).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from rfwp_rl.impala import vtrace
from rfwp_rl.safety import NonFiniteGuard


@dataclasses.dataclass
class LossConfig:
    discount: float = 0.99
    reward_clip: float = 1.0  # rewards clipped to [-reward_clip, reward_clip]; 0 disables
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    clip_rho: float = 1.0  # rho-bar
    clip_c: float = 1.0  # c-bar
    clip_pg_rho: float = 1.0
    vtrace_lambda: float = 1.0  # trace factor (IMPALA Sec. 4.1, Remark 2); 1 = the paper's V-trace
    normalize_advantages: bool = False


def compute_loss(agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple,
                 cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss (a scalar with gradient) and its parts as floats.

    Args:
        agent: :class:`rfwp_rl.agent.Agent`.
        batch: ``obs [T+1, B, ...]``, ``reward``, ``done``, ``action``, ``prev_action`` ``[T+1, B]``,
            ``policy_logits [T+1, B, A]`` (behaviour policy), optionally ``truncated [T+1, B]``.
        initial_state: core state before entry 0, tuple of ``[B, ...]`` tensors.
    """
    # greedy: the learner needs no sampled actions (argmax uses no RNG and tolerates NaN logits)
    out, _ = agent(batch["obs"], batch["reward"], batch["done"], initial_state, prev_action=batch["prev_action"],
                   greedy=True)
    bootstrap_value = out["baseline"][-1].detach()

    # Entry t's action led to entry t+1's reward and done.
    target_logits = out["policy_logits"][:-1]
    values = out["baseline"][:-1]
    actions = batch["action"][:-1]
    behaviour_logits = batch["policy_logits"][:-1]
    rewards = batch["reward"][1:].float()
    if cfg.reward_clip > 0:
        rewards = rewards.clamp(-cfg.reward_clip, cfg.reward_clip)
    discounts = (~batch["done"][1:].bool()).float() * cfg.discount
    # 0 where the entry shows a truncated episode's last observation: that action never ran
    mask = (~batch["truncated"][:-1].bool()).float() if "truncated" in batch else torch.ones_like(rewards)

    vt = vtrace.from_logits(behaviour_logits, target_logits.detach(), actions, discounts, rewards,
                            values.detach(), bootstrap_value, cfg.clip_rho, cfg.clip_c, cfg.clip_pg_rho, mask,
                            cfg.vtrace_lambda)
    advantages = vt.pg_advantages
    if cfg.normalize_advantages:  # divided by their root mean square, not centred (see the module docstring)
        rms = ((advantages ** 2 * mask).sum() / mask.sum().clamp(min=1.0)).sqrt()
        advantages = advantages / rms.clamp(min=1e-8)

    log_probs = F.log_softmax(target_logits, dim=-1)
    action_log_probs = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    pg_loss = -(action_log_probs * advantages).sum()
    baseline_loss = cfg.baseline_cost * 0.5 * ((vt.vs - values) ** 2).sum()  # 0 at masked steps: vs = V there
    entropy_loss = cfg.entropy_cost * ((log_probs.exp() * log_probs).sum(-1) * mask).sum()
    total = pg_loss + baseline_loss + entropy_loss
    stats = {
        "loss/total": float(total.detach()),
        "loss/policy": float(pg_loss.detach()),
        "loss/baseline": float(baseline_loss.detach()),
        "loss/entropy": float(entropy_loss.detach()),
        "learner/entropy": float(-(log_probs.exp() * log_probs).sum(-1).mean().detach()),
        "learner/mean_rho": float(vt.log_rhos.exp().mean()),
        "learner/mean_value": float(values.mean().detach()),
    }
    return total, stats


def linear_decay(total_steps: int, steps_per_update: int):
    """LR multiplier for ``LambdaLR``: 1 at the start, 0 after ``total_steps`` env steps."""
    def factor(update: int) -> float:
        return max(0.0, 1.0 - min(update * steps_per_update, total_steps) / total_steps)
    return factor


def linear_decay_of_steps(total_steps: int, steps_trained: Callable[[], int]):
    """LR multiplier for ``LambdaLR`` that reads the env steps trained so far (``steps_trained()``)
    instead of counting updates: 1 at the start, 0 after ``total_steps``. In a learner group an
    update consumes the env steps of every learner that handed in gradients, a number that varies
    with the group's size; for one learner it equals :func:`linear_decay`. Call ``scheduler.step()``
    after adding the update's env steps to the count."""
    def factor(_update: int) -> float:
        return max(0.0, 1.0 - min(steps_trained(), total_steps) / total_steps)
    return factor


def make_optimizer(agent: nn.Module, lr: float, alpha: float, eps: float, momentum: float = 0.0,
                   name: str = "rmsprop", adam_eps: float = 1e-8) -> torch.optim.Optimizer:
    """RMSProp as in TorchBeast / the paper (lr 6e-4, alpha 0.99, eps 0.01), or (``name="adam"``)
    Adam with ``lr`` and ``adam_eps`` (``alpha``, ``eps`` and ``momentum`` are RMSProp's)."""
    if name == "adam":
        return torch.optim.Adam(agent.parameters(), lr=lr, eps=adam_eps)
    return torch.optim.RMSprop(agent.parameters(), lr=lr, alpha=alpha, eps=eps, momentum=momentum)


def compute_gradients(agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple,
                      cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss and ``loss.backward()``: the gradients of the summed loss over the batch are *added* to
    the parameters' ``.grad`` (which must be zero or None, see :func:`apply_gradients`).
    Returns the loss (for the non-finite check) and its parts as floats."""
    agent.train()
    loss, stats = compute_loss(agent, batch, initial_state, cfg)
    loss.backward()
    return loss, stats


def apply_gradients(agent: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, grad_norm_clip: float,
                    step: bool = True) -> dict[str, float]:
    """One optimizer step on the gradients in ``.grad``: grad-norm clip, RMSProp, LR schedule.

    ``step=False`` (a skipped, non-finite update) only advances the schedule. The caller zeroes
    the gradients afterwards (one learner: set to None; a learner group keeps them allocated).
    Returns ``learner/grad_norm`` (before clipping; NaN when skipped), ``learner/lr`` (used for
    this step) and ``learner/skipped``.
    """
    lr = optimizer.param_groups[0]["lr"]
    stats = {"learner/grad_norm": float("nan"), "learner/skipped": 1.0, "learner/lr": lr}
    if step:
        stats["learner/grad_norm"] = float(nn.utils.clip_grad_norm_(agent.parameters(), grad_norm_clip))
        optimizer.step()
        stats["learner/skipped"] = 0.0
    with warnings.catch_warnings():  # torch warns when the very first update was skipped
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()  # the schedule counts learner steps, skipped ones included
    return stats


def update(agent: nn.Module, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
           batch: dict[str, torch.Tensor], initial_state: tuple, cfg: LossConfig, grad_norm_clip: float,
           guard: NonFiniteGuard) -> dict[str, float]:
    """One learner step on its own: loss, backward, non-finite check, grad-norm clip, RMSProp, LR decay.

    Returns the loss parts plus ``learner/grad_norm`` (before clipping), ``learner/lr`` (used for
    this step) and ``learner/skipped`` (1.0 when the non-finite guard skipped it).
    """
    optimizer.zero_grad(set_to_none=True)
    loss, stats = compute_gradients(agent, batch, initial_state, cfg)
    stats.update(apply_gradients(agent, optimizer, scheduler, grad_norm_clip, step=guard.ok(loss, agent.parameters())))
    optimizer.zero_grad(set_to_none=True)
    return stats


class LearnerThread:
    """Runs ``learn(batch)`` for each submitted batch in a background thread.

    ``submit`` waits while an update is still running (one batch in flight, so the policy
    lag stays at most one update); an exception in the thread (e.g.
    :class:`rfwp_rl.safety.TrainingAborted`) is raised again by the next ``submit``,
    ``wait_idle`` or ``close``.
    """

    def __init__(self, learn: Callable[[Any], None]):
        self._learn = learn
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._learn(batch)
            except BaseException as e:  # handed to the main thread
                self._error = e
            finally:
                self._queue.task_done()

    def _check(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, batch: Any) -> None:
        while True:
            self._check()
            try:
                self._queue.put(batch, timeout=0.1)
                return
            except queue.Full:
                continue

    @property
    def pending(self) -> int:
        """Batches submitted and not yet learned (the one being learned included)."""
        return self._queue.unfinished_tasks

    def wait_idle(self) -> None:
        """Wait until every submitted batch is learned."""
        self._queue.join()
        self._check()

    def close(self) -> None:
        """Finish the submitted batches and stop the thread (re-raises its error, if any)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._check()
