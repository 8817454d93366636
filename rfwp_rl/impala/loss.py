"""The V-trace actor-critic loss of the IMPALA learner, and the return scale its rewards are divided by.

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
    recall   = recall_cost * sum_t ||head(h_t, k_t) - f_{t-k_t}||^2 / sum_i Var(f_i)   (agents with a recall head)

The recall term (:mod:`rfwp_rl.recall`; only for an agent with ``recall_lags``) asks the core's
output h_t to reconstruct the torso features f of a step k_t back in the same episode and unroll,
k_t uniform over the episode's steps in the unroll, at most recall_lags back: a dense supervised signal for
the memory's writes, which the policy gradient reaches only at the steps that need the memory. Where the
agent embeds a uint8 grid, the term also holds the weighted cross-entropy of that grid's symbols k_t back
(``agent.recall_symbols``).

With ``normalize_advantages`` the policy-gradient advantages are divided by their root mean
square over the batch's unmasked steps, so that the policy step does not scale with the reward
magnitude: a memory task's single +-1 at the end of an episode otherwise meets an entropy bonus
tuned for Atari's dense clipped rewards. They are not centred: on a memory task most steps'
actions do not matter and their advantages are near 0, and subtracting the batch mean would give
them all one sign. The divisor is at least ``advantage_floor`` times the RMS of the V-trace
targets: once a task is solved every advantage is value-function noise, and dividing noise by its
own RMS turns it into unit-sized policy steps that walk the policy off the solution; with the
floor such noise stays small next to the returns it is noise on. It is also at least
``advantage_min``, in the values' units: where the returns are still near 0 (a sparse reward not
yet found) the targets' RMS bounds nothing, and value noise divided by its own RMS walks the
policy to a deterministic one before the reward is ever seen. The measurements behind all three:
``docs/profiles/vector.md``.

``bound_cost`` (Box actions) adds c x relu(|mu| - 1)^2 per step and bounded action dimension, mu
being the Gaussian's mean in the normalised units where the bounds are -1 and 1 (rl_games' "bounds
loss" of the same form). Where the largest action is best, the samples nearer the bound get the
higher advantages and the mean moves past it until every sample acts like the bound: a
deterministic policy whose gradient no longer says where the bound stops being best. The
measurements behind it (Pendulum-v1 with and without it): ``docs/profiles/control.md``.

With ``normalize_returns`` the rewards (after clipping) are divided by :class:`ReturnScale`, the
RMS of the discounted returns, so that values and the value loss keep one size whatever the
reward's units.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn as nn

from rfwp_rl.envs.spaces import pick_obs
from rfwp_rl.impala import vtrace
from rfwp_rl.impala.config import DEFAULTS
from rfwp_rl.recall import draw_lags, recall_loss


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
    advantage_min: float
    normalize_value_loss: bool
    max_kl: float
    normalize_returns: bool
    recall_cost: float
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


def advantage_scale(
    advantages: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, floor: float, minimum: float = 0.0
) -> torch.Tensor:
    """The divisor of normalised advantages ``[T, B]``: their RMS over unmasked steps, at least
    ``floor`` times the RMS of the value targets ``[T, B]`` and at least ``minimum`` (and 1e-8)."""
    rms = masked_mean(advantages**2, mask).sqrt()
    target_rms = masked_mean(targets**2, mask).sqrt()
    return torch.maximum(rms, floor * target_rms).clamp(min=max(minimum, 1e-8))


def unroll(agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple, with_features: bool = False) -> dict:
    """The agent's outputs over a batch's whole unroll (``[T+1, B, ...]``, see :func:`compute_loss`)."""
    # greedy: the learner needs no sampled actions (the mode uses no RNG and tolerates NaN logits)
    out, _ = agent(
        pick_obs(batch),
        batch["reward"],
        batch["done"],
        initial_state,
        prev_action=batch["prev_action"],
        greedy=True,
        with_features=with_features,
    )
    return out


def compute_loss(
    agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple, cfg: LossConfig, return_scale: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
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
    recall_head = getattr(agent, "recall", None) if cfg.recall_cost > 0 else None  # at cost 0 it trains nothing
    out = unroll(agent, batch, initial_state, with_features=recall_head is not None)
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
    vt = vtrace.from_importance_weights(
        log_rhos,
        discounts,
        rewards,
        values.detach(),
        bootstrap_value,
        cfg.clip_rho,
        cfg.clip_c,
        cfg.clip_pg_rho,
        mask,
        cfg.vtrace_lambda,
    )
    advantages = vt.pg_advantages
    scale = torch.ones(())
    if cfg.normalize_advantages:  # not centred, and never blowing noise up (see the module docstring)
        scale = advantage_scale(advantages, vt.vs, mask, cfg.advantage_floor, cfg.advantage_min)
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
    named = {
        "loss/total": total,
        "loss/policy": pg_loss,
        "loss/baseline": baseline_loss,
        "loss/entropy": entropy_loss,
        "loss/bound": bound_loss,
        "learner/entropy": entropy.mean(),
        "learner/mean_rho": vt.log_rhos.exp().mean(),
        "learner/mean_value": values.mean(),
        "learner/advantage_scale": scale,
        "learner/return_scale": return_scale,
        "learner/return_ms": masked_mean((vt.vs * return_scale) ** 2, mask),
    }
    if recall_head is not None:
        # every entry, the last one included: its features are known, only its action is not
        lags = draw_lags(batch["done"], recall_head.lags)
        recall_sum, recall_mask = recall_loss(
            recall_head, out["core_output"], out["features"], batch["done"], lags, out.get("symbols")
        )
        total = total + cfg.recall_cost * recall_sum
        named["loss/total"] = total
        named["loss/recall"] = recall_sum / recall_mask.sum().float().clamp(min=1.0)
    return total, host_floats(named)


def host_floats(named: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """``named`` as Python floats, the values on a device copied to the host together (each ``float()`` of a
    GPU tensor would wait for the device once)."""
    on_device = [k for k, v in named.items() if isinstance(v, torch.Tensor) and v.device.type != "cpu"]
    copied = {}
    if on_device:
        copied = dict(zip(on_device, torch.stack([named[k].detach().float().reshape(()) for k in on_device]).tolist()))
    return {
        k: copied[k] if k in copied else float(v.detach() if isinstance(v, torch.Tensor) else v)
        for k, v in named.items()
    }


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
