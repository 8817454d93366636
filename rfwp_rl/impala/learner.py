"""IMPALA learner: the V-trace actor-critic loss and the :class:`Learner` that owns the model.

A batch holds B rollouts of T+1 time steps (time-major ``[T+1, B, ...]``). Entry t of a
rollout holds what the actor saw and did at step t:

- ``obs[t]`` (a Dict observation: ``obs/<path>[t]``), ``reward[t]`` (received on arriving at
  ``obs[t]``), ``done[t]`` (``obs[t]`` is the first frame of a new episode), ``prev_action[t]``
  (the action before ``obs[t]``);
- ``action[t]`` and ``behaviour_log_prob[t]``: what the behaviour policy mu chose at ``obs[t]``
  and log mu(action[t] | obs[t]) (the agent's action distribution, :mod:`rfwp_rl.distributions`);
- ``truncated[t]``: ``obs[t]`` is the last observation of an episode cut by a time limit. Its
  action was never executed (the next entry starts a new episode): the step is masked out of the
  losses and the step before it bootstraps from ``V(obs[t])`` (see :mod:`rfwp_rl.impala.vtrace`).

Entry 0 repeats the last entry of the previous rollout, and ``initial_state`` is the core
state before entry 0, so the learner re-runs the whole unroll through the core (full BPTT,
resets at episode starts) and bootstraps from its value of the last entry. Losses are sums
over time and batch, as in TorchBeast (whose hyperparameters the paper used)::

    pg       = -sum log pi(a_t|x_t) * A_t                   (A_t: V-trace advantage)
    baseline = baseline_cost * 0.5 * sum (v_t - V(x_t))^2   (v_t: V-trace target)
    entropy  = -entropy_cost * sum_t H(pi(.|x_t))           (H: the action distribution's entropy)
    bound    = bound_cost * sum_t sum_i relu(|mu_i(x_t)| - 1)^2   (Box actions: mean past the bounds)

With ``normalize_advantages`` the policy-gradient advantages are divided by their root mean
square over the batch's unmasked steps, so that the policy step does not scale with the reward
magnitude: a memory task's single +-1 at the end of an episode otherwise meets an entropy bonus
tuned for Atari's dense clipped rewards. They are not centred: on a memory task most steps'
actions do not matter and their advantages are near 0, and subtracting the batch mean would give
them all one sign. The divisor is at least ``advantage_floor`` times the RMS of the V-trace
targets: once a task is solved every advantage is value-function noise, and dividing noise by its
own RMS turns it into unit-sized policy steps that walk the policy off the solution; with the
floor such noise stays small next to the returns it is noise on. The measurements behind both:
``docs/profiles/vector.md``.

``bound_cost`` (Box actions) adds c x relu(|mu| - 1)^2 per step and bounded action dimension, mu
being the Gaussian's mean in the normalised units where the bounds are -1 and 1 (rl_games' "bounds
loss" of the same form). Where the largest action is best, the samples nearer the bound get the
higher advantages and the mean moves past it until every sample acts like the bound: a
deterministic policy whose gradient no longer says where the bound stops being best. The
measurements behind it (Pendulum-v1 with and without it): ``docs/profiles/control.md``.

With ``max_kl`` an update is a trust-region step: after the optimizer step the new policy is
compared with the behaviour policy mu on the batch's own actions, and a step whose mean
KL(mu || pi_new) exceeds ``max_kl`` is shrunk towards the old parameters by sqrt(max_kl / KL)
(KL is quadratic in a small step; TRPO, Schulman et al. 2015, Sec. 6, bounds the same mean KL by a
line search). The bound is on how far one batch can move the policy, whatever the advantages'
scale: an optimizer normalises its steps, so noise around a solved task otherwise moves the
policy as far as a real signal does (measurements: ``docs/profiles/vector.md``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import queue
import threading
import warnings
from typing import Any, Callable, NamedTuple

import torch
import torch.nn as nn

from rfwp_rl.envs.spaces import pick_obs
from rfwp_rl.impala import vtrace
from rfwp_rl.impala.config import DEFAULTS, ImpalaConfig
from rfwp_rl.perf import autocast
from rfwp_rl.safety import NonFiniteGuard


@dataclasses.dataclass
class LossConfig:
    """The loss's settings: the fields of the same names of the trainer's config (:func:`loss_config`,
    :class:`rfwp_rl.impala.config.ImpalaConfig`, where each is described and has its default)."""

    discount: float
    reward_clip: float  # rewards clipped to [-reward_clip, reward_clip]; 0: not clipped
    baseline_cost: float
    entropy_cost: float
    bound_cost: float
    clip_rho: float  # rho-bar
    clip_c: float  # c-bar
    vtrace_lambda: float  # trace factor (IMPALA Sec. 4.1, Remark 2)
    normalize_advantages: bool
    advantage_floor: float
    normalize_value_loss: bool
    max_kl: float
    normalize_returns: bool
    clip_pg_rho: float = 1.0  # the policy gradient's rho clip: 1 as in IMPALA and TorchBeast (not a setting)


def loss_config(cfg: Any = None, **changes: Any) -> LossConfig:
    """The :class:`LossConfig` of a trainer config (default: :class:`rfwp_rl.impala.config.ImpalaConfig`'s
    defaults), with ``changes`` on top."""
    cfg = DEFAULTS if cfg is None else cfg
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(LossConfig) if hasattr(cfg, f.name)}
    return LossConfig(**{**values, **changes})


def step_mask(batch: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``[T, B]`` 1.0 where entry t's action ran, 0.0 where the entry shows a truncated episode's
    last observation (that action never ran); ``like``: a ``[T, B]`` tensor for shape and dtype."""
    return (~batch["truncated"][:-1].bool()).to(like.dtype) if "truncated" in batch else torch.ones_like(like)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the steps where ``mask`` is 1 (0 when there are none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def advantage_scale(advantages: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                    floor: float) -> torch.Tensor:
    """The divisor of normalised advantages ``[T, B]``: their RMS over unmasked steps, at least
    ``floor`` times the RMS of the value targets ``[T, B]`` (and 1e-8)."""
    rms = masked_mean(advantages ** 2, mask).sqrt()
    target_rms = masked_mean(targets ** 2, mask).sqrt()
    return torch.maximum(rms, floor * target_rms).clamp(min=1e-8)


def compute_loss(agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple,
                 cfg: LossConfig, return_scale: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss (a scalar with gradient) and its parts as floats. Rewards (after clipping) are
    divided by ``return_scale`` (:class:`ReturnScale`), so values are in those units;
    ``learner/return_ms`` is the mean square of the V-trace targets in the rewards' own units.

    Args:
        agent: :class:`rfwp_rl.agent.Agent`.
        batch: ``obs [T+1, B, ...]`` (or ``obs/<path>``), ``reward``, ``done`` ``[T+1, B]``, ``action``,
            ``prev_action`` ``[T+1, B, *action_shape]``, ``behaviour_log_prob [T+1, B]`` (log mu of the
            action), optionally ``truncated [T+1, B]``.
        initial_state: core state before entry 0, tuple of ``[B, ...]`` tensors.
    """
    # greedy: the learner needs no sampled actions (the mode uses no RNG and tolerates NaN logits)
    out, _ = agent(pick_obs(batch), batch["reward"], batch["done"], initial_state, prev_action=batch["prev_action"],
                   greedy=True)
    dist = agent.action_dist
    bootstrap_value = out["baseline"][-1].detach()

    # The time shift: entry t holds an observation and the action taken at it; that action's reward
    # and done arrive with entry t+1. So action t pairs with reward[t + 1], done[t + 1], and the
    # value of the last entry (whose action is in the next rollout) only bootstraps.
    target_params = out["policy_params"][:-1]
    values = out["baseline"][:-1]
    actions = batch["action"][:-1]
    action_log_probs = dist.log_prob(target_params, actions)  # log pi(a_t|x_t), with gradient
    rewards = batch["reward"][1:].float()
    if cfg.reward_clip > 0:
        rewards = rewards.clamp(-cfg.reward_clip, cfg.reward_clip)
    rewards = rewards / return_scale
    discounts = (~batch["done"][1:].bool()).float() * cfg.discount
    mask = step_mask(batch, rewards)

    log_rhos = action_log_probs.detach() - batch["behaviour_log_prob"][:-1]
    vt = vtrace.from_importance_weights(log_rhos, discounts, rewards, values.detach(), bootstrap_value,
                                        cfg.clip_rho, cfg.clip_c, cfg.clip_pg_rho, mask, cfg.vtrace_lambda)
    advantages = vt.pg_advantages
    scale = torch.ones(())
    if cfg.normalize_advantages:  # not centred, and never blowing noise up (see the module docstring)
        scale = advantage_scale(advantages, vt.vs, mask, cfg.advantage_floor)
        advantages = advantages / scale

    entropy = dist.entropy(target_params)
    pg_loss = -(action_log_probs * advantages).sum()
    # 0 at masked steps (vs = V there); optionally in the normalised advantages' units, so that at any
    # reward scale the value loss weighs in the shared layers as the normalised policy loss does
    value_scale = scale if cfg.normalize_value_loss else 1.0
    baseline_loss = cfg.baseline_cost * 0.5 * (((vt.vs - values) / value_scale) ** 2).sum()
    entropy_loss = -cfg.entropy_cost * (entropy * mask).sum()
    bound_loss = cfg.bound_cost * (dist.out_of_bounds(target_params) * mask).sum()
    total = pg_loss + baseline_loss + entropy_loss + bound_loss
    stats = {
        "loss/total": float(total.detach()),
        "loss/policy": float(pg_loss.detach()),
        "loss/baseline": float(baseline_loss.detach()),
        "loss/entropy": float(entropy_loss.detach()),
        "loss/bound": float(bound_loss.detach()),
        "learner/entropy": float(entropy.mean().detach()),
        "learner/mean_rho": float(vt.log_rhos.exp().mean()),
        "learner/mean_value": float(values.mean().detach()),
        "learner/advantage_scale": float(scale),
        "learner/return_scale": float(return_scale),
        "learner/return_ms": float(masked_mean((vt.vs * return_scale) ** 2, mask)),
    }
    return total, stats


class ReturnScale:
    """The divisor of the rewards with ``normalize_returns``: the RMS of the discounted returns,
    estimated by an exponential moving average (``rate`` per update) of the mean square of each
    batch's V-trace targets, and never below 1: returns that already lie within [-1, 1] (a memory
    task's +-1, a reward of 1/episode-limit per step) are left as they are, larger ones are brought
    to unit RMS, so that values, value errors and the value loss's gradient keep one size whatever the
    reward's units (Pendulum's rewards lie in -16..0 per step). Reward clipping bounds the size too, but
    changes which of two returns is larger. (PopArt, van Hasselt et al. 2016, also rescales the
    value head when the scale moves; this one moves slowly instead, and the head follows.)"""

    def __init__(self, enabled: bool, rate: float = 0.05):
        self.enabled, self.rate = enabled, rate
        self.mean_square: float | None = None

    @property
    def value(self) -> float:
        if not self.enabled or self.mean_square is None:
            return 1.0
        return max(1.0, math.sqrt(self.mean_square))

    def update(self, batch_mean_square: float) -> None:
        if not self.enabled or not math.isfinite(batch_mean_square):
            return
        if self.mean_square is None:
            self.mean_square = batch_mean_square
        else:
            self.mean_square += self.rate * (batch_mean_square - self.mean_square)

    def state_dict(self) -> dict:
        return {"mean_square": self.mean_square}

    def load_state_dict(self, state: dict) -> None:
        self.mean_square = state.get("mean_square")


def kl_terms(log_r: torch.Tensor) -> torch.Tensor:
    """Per-sample terms of the non-negative KL(mu || pi) estimator E[(r - 1) - log r] for
    ``log_r = log pi(a) - log mu(a)``, a drawn from mu (Schulman, "Approximating KL divergence",
    2020); same shape as ``log_r``."""
    return log_r.exp() - 1 - log_r


def behaviour_kl(agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple) -> torch.Tensor:
    """Mean KL(mu || pi) over the unmasked steps of ``batch`` (as in :func:`compute_loss`), estimated
    on the batch's actions (drawn from mu) with the non-negative estimator E[(r - 1) - log r],
    r = pi(a) / mu(a) (Schulman, "Approximating KL divergence", 2020), so that it needs only
    log-probs and serves every action distribution."""
    with torch.no_grad():
        out, _ = agent(pick_obs(batch), batch["reward"], batch["done"], initial_state,
                       prev_action=batch["prev_action"], greedy=True)
        log_r = agent.action_dist.log_prob(out["policy_params"][:-1], batch["action"][:-1]).float() \
            - batch["behaviour_log_prob"][:-1].float()
        return masked_mean(kl_terms(log_r), step_mask(batch, log_r))


def limit_policy_change(agent: nn.Module, before: list[torch.Tensor], batch: dict[str, torch.Tensor],
                        initial_state: tuple, max_kl: float, start_kl: float = 0.0) -> dict[str, float]:
    """Shrink the step just taken (parameters ``before`` -> now) to mean KL(mu || pi) ``max_kl`` on
    ``batch`` if it went further. ``start_kl``: KL(mu || pi) at ``before`` (0: the policy that acted;
    a later epoch on the same batch starts further away). Quadratic model of the KL along the step,
    KL(s) = start_kl + (KL(1) - start_kl) s^2, so s = sqrt((max_kl - start_kl) / (KL(1) - start_kl));
    at or past the bound already, the step is undone. Returns ``learner/policy_kl`` (before
    shrinking) and ``learner/step_scale``."""
    kl = float(behaviour_kl(agent, batch, initial_state))
    scale = 1.0
    if not kl <= max_kl:  # also a non-finite KL: that step is undone
        room = max_kl - start_kl
        scale = math.sqrt(room / (kl - start_kl)) if math.isfinite(kl) and room > 0 else 0.0
        with torch.no_grad():
            for p, old in zip(agent.parameters(), before):
                p.copy_(old + scale * (p - old) if scale > 0 else old)
    return {"learner/policy_kl": kl, "learner/step_scale": scale}


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
    return torch.optim.RMSprop(agent.parameters(), lr=cfg.learning_rate, alpha=cfg.rmsprop_alpha,
                               eps=cfg.rmsprop_eps, momentum=cfg.rmsprop_momentum)


def apply_gradients(agent: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, grad_norm_clip: float,
                    step: bool = True) -> dict[str, float]:
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


class Gradients(NamedTuple):
    """What :meth:`Learner.learn` left in the parameters' ``.grad``: the gradient of the summed
    loss over ``env_steps`` env steps, and whether loss and gradients are finite."""

    finite: bool
    env_steps: int
    stats: dict


@dataclasses.dataclass
class GroupStep:
    """One optimizer step: the gradients now in ``.grad`` and what they were computed on."""

    env_steps: int  # env steps of all gradients averaged into this step (summed over a group's learners)
    gradients: int  # batches averaged (0: nothing to apply, e.g. one learner's non-finite batch)
    own_steps: int  # this learner's part of env_steps


class Learner:
    """The learner: the agent being trained, its optimizer, LR schedule, step counters and
    non-finite guard.

    - :meth:`learn`: V-trace loss of one batch, gradients added to ``.grad`` -> :class:`Gradients`;
    - :meth:`apply`: one optimizer step on ``.grad`` (RMSProp or Adam; alone: this learner's gradients; in a
      learner group: the group's weighted mean), counts it, queues its stats in ``learned`` and
      hands the new parameters to the ``followers`` (:meth:`publish`: the actors' copy, remote actors);
    - :meth:`state_dict` / :meth:`load_state_dict`: the checkpoint; :meth:`shared_state` /
      :meth:`load_shared_state`: what a learner group hands a joining learner besides the parameters.

    ``counters["step"]`` counts env steps trained (in a group: the group's), ``["updates"]``
    optimizer steps; the LR decays linearly to 0 over ``cfg.total_steps`` env steps. ``lock``
    guards the model, optimizer and counters (updates vs checkpoints vs the group's thread).
    """

    def __init__(self, agent: nn.Module, cfg: ImpalaConfig):
        self.agent = agent
        self.cfg = cfg
        self.device = next(agent.parameters()).device
        self.precision = cfg.precision
        self.steps_per_update = cfg.batch_size * cfg.unroll_length
        self.counters = {"step": 0, "updates": 0}
        self.optimizer = make_optimizer(agent, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_decay_of_steps(cfg.total_steps, self._steps_trained))
        self.loss_cfg = loss_config(cfg)
        self.guard = NonFiniteGuard(cfg.max_nonfinite)
        self.lock = threading.Lock()
        self.followers: list[Any] = []  # objects with follow(learner), told after every change of the model
        self.learned: queue.SimpleQueue = queue.SimpleQueue()  # (step, stats) of updates not logged yet
        self.loss_stats: dict[str, float] = {}  # of this learner's last batch, logged with the step that used it
        self.adoptions = 0  # times the model was replaced by a group leader's
        self.last_batch: Any = None  # the batch of the last learn(), for the trust region of apply()
        self.stepped_batch: Any = None  # the batch of the last step (the same one again: a later epoch)
        self.return_scale = ReturnScale(self.loss_cfg.normalize_returns)

    def _steps_trained(self) -> int:
        return self.counters["step"]

    @property
    def step(self) -> int:
        return self.counters["step"]

    @property
    def updates(self) -> int:
        return self.counters["updates"]

    def parameters(self) -> list[nn.Parameter]:
        return list(self.agent.parameters())

    def buffers(self) -> list[torch.Tensor]:
        return list(self.agent.buffers())

    def learn(self, batch: Any) -> Gradients:
        """Add the gradients of the V-trace loss of ``batch`` (a
        :class:`rfwp_rl.impala.actors.Rollout` of ``[T+1, B, ...]`` tensors) to ``.grad``."""
        self.agent.train()
        batch = batch.to(self.device)  # actors on another device (e.g. the CPU for a small model)
        with autocast(self.device, self.precision):  # bf16: the torso's convolutions; the loss stays fp32
            loss, stats = compute_loss(self.agent, batch.data, batch.state, self.loss_cfg, self.return_scale.value)
        loss.backward()
        self.loss_stats = stats
        self.last_batch = batch
        finite = self.guard.ok(loss, self.agent.parameters())
        if finite:
            self.return_scale.update(stats["learner/return_ms"])
        return Gradients(finite, self.steps_per_update, stats)

    def apply(self, step: GroupStep) -> None:
        """One optimizer step on the gradients in ``.grad`` (grad-norm clip, RMSProp or Adam, LR schedule;
        ``step.gradients == 0``: only the schedule advances). The caller holds ``lock`` and zeroes
        the gradients afterwards."""
        self.counters["step"] += step.env_steps
        self.counters["updates"] += 1
        # the trust region needs the batch the step came from: one learner's own (groups refuse max_kl)
        trust_region = self.loss_cfg.max_kl > 0 and step.gradients > 0 and self.last_batch is not None
        before = [p.detach().clone() for p in self.agent.parameters()] if trust_region else []
        start_kl = 0.0
        if trust_region and self.last_batch is self.stepped_batch:  # a later epoch: measure where it starts
            with torch.no_grad(), autocast(self.device, self.precision):
                start_kl = float(behaviour_kl(self.agent, self.last_batch.data, self.last_batch.state))
        stats = apply_gradients(self.agent, self.optimizer, self.scheduler, self.cfg.grad_norm_clip,
                                step=step.gradients > 0)
        if trust_region:
            with autocast(self.device, self.precision):
                stats.update(limit_policy_change(self.agent, before, self.last_batch.data, self.last_batch.state,
                                                 self.loss_cfg.max_kl, start_kl))
        self.stepped_batch, self.last_batch = self.last_batch, None
        if step.own_steps:
            stats.update(self.loss_stats)
        self.learned.put((self.counters["step"], stats))
        self.publish()

    def publish(self) -> None:
        """Tell the followers (the actors' copy of the model, remote actors) that the parameters changed."""
        for follower in self.followers:
            follower.follow(self)

    def state_dict(self) -> dict:
        """Agent, optimizer, LR schedule and counters (``step``, ``updates``, ``skipped_updates``)."""
        counters = {**self.counters, "skipped_updates": self.guard.skipped}
        return {"agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "counters": counters,
                "return_scale": self.return_scale.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.counters.update({k: state["counters"][k] for k in self.counters})
        self.guard.skipped = state["counters"]["skipped_updates"]
        self.return_scale.load_state_dict(state["return_scale"])

    def shared_state(self) -> dict:
        """What a group's leader hands a joining learner besides the parameters and buffers."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "counters": dict(self.counters), "return_scale": self.return_scale.state_dict()}

    def load_shared_state(self, state: dict) -> None:
        """Take a leader's :meth:`shared_state` (moolib has copied its parameters already)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.counters.update(state["counters"])
        self.return_scale.load_state_dict(state.get("return_scale", {}))
        self.adoptions += 1
        self.publish()


class Learning:
    """Turns full batches into gradients for the learner group: in the calling thread, or with
    ``thread=True`` in a :class:`LearnerThread` while the actors go on with ``acting_agent``, a
    copy of the model refreshed after each update (under ``acting_lock``)."""

    def __init__(self, learner: Learner, group: Any, thread: bool = False, acting_device: torch.device | None = None):
        self.learner, self.group = learner, group
        self.thread = LearnerThread(self._learn) if thread else None
        acting_device = learner.device if acting_device is None else torch.device(acting_device)
        own_copy = thread or acting_device != learner.device
        self.acting_agent = copy.deepcopy(learner.agent).to(acting_device) if own_copy else learner.agent
        self.acting_lock = threading.Lock()
        if own_copy:
            learner.followers.append(self)

    def follow(self, learner: Learner) -> None:
        with self.acting_lock:
            self.acting_agent.load_state_dict(learner.agent.state_dict())

    def submit(self, batch: Any) -> None:
        """Learn on ``batch`` and hand the gradients in (with a thread: waits while the previous batch is learned)."""
        if self.thread is not None:
            self.thread.submit(batch)
        else:
            self._learn(batch)

    def _learn(self, batch: Any) -> None:
        for epoch in range(self.learner.cfg.epochs):
            with self.learner.lock:
                gradients = self.learner.learn(batch)
                # the batch's env steps count once, with its first optimizer step
                self.group.hand_in(gradients if epoch == 0 else gradients._replace(env_steps=0))

    @property
    def pending_steps(self) -> int:
        """Env steps submitted to the learner thread and not yet handed in."""
        return self.thread.pending * self.learner.steps_per_update if self.thread is not None else 0

    def wait_idle(self) -> None:
        if self.thread is not None:
            self.thread.wait_idle()

    def close(self) -> None:
        """Finish the submitted batches (re-raises the learner thread's error, if any)."""
        if self.thread is not None:
            self.thread.close()
