"""Advantage actor-critic (A2C) loss for whole episodes (FWM paper Sec. 4.2, App. I).

For one batch of episodes of T steps (no bootstrap after the last step: the episode ends)::

    R_t = r_t + discount * R_{t+1},  R_T = 0         (discounted return)

Where an episode ends inside the sequence (``terminated[t]``: after action t) the return does
not look past it; where it is cut by a time limit instead (``truncated[t]``), it bootstraps from
the value of the last observation, ``R_t = r_t + discount * V(x_{t+1})`` (``final_values[t]``):
a time limit is not a terminal state.

    A_t = R_t - V(h_t)                                (advantage)
    loss = mean_{t,b} [ -log pi(a_t | h_t) * stop_grad(A_t)
                        + baseline_cost * A_t^2
                        - entropy_cost * H(pi(. | h_t)) ]

The mean over steps and batch is App. I's "average step loss". The weights and the discount
are the trainer's settings (:class:`rfwp_rl.meta_rl.config.MetaRLConfig`, App. I's values). As
in the paper's published code the value term is the plain squared error (no factor 1/2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def discounted_returns(
    rewards: torch.Tensor,
    discount: float,
    bootstrap: torch.Tensor | None = None,
    terminated: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    final_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """``R_t = r_t + discount R_{t+1}`` backwards in time, cut at episode ends.

    Args:
        rewards: ``[T, B]``.
        bootstrap: ``[B]`` value of the state after the last step (None: 0, episode over).
        terminated: ``[T, B]`` bool, the episode ended after action t: ``R_t = r_t``.
        truncated: ``[T, B]`` bool, a time limit cut the episode after action t:
            ``R_t = r_t + discount * final_values[t]`` (needs ``final_values [T, B]``, the value of
            the episode's last observation; read only where ``truncated``).
    Returns:
        ``[T, B]`` returns, same dtype as ``rewards``.
    """
    if truncated is not None and final_values is None:
        raise ValueError("truncated steps need final_values (the value of the last observation)")
    running = torch.zeros_like(rewards[0]) if bootstrap is None else bootstrap.to(rewards.dtype)
    out = torch.empty_like(rewards)
    for t in range(rewards.shape[0] - 1, -1, -1):
        if terminated is not None:
            running = torch.where(terminated[t], torch.zeros_like(running), running)
        if truncated is not None:
            running = torch.where(truncated[t], final_values[t].to(rewards.dtype), running)
        running = rewards[t] + discount * running
        out[t] = running
    return out


def a2c_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    *,
    discount: float,
    baseline_cost: float,
    entropy_cost: float,
    bootstrap: torch.Tensor | None = None,
    terminated: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    final_values: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The A2C loss of a batch of episodes (formula in the module docstring).

    Args:
        logits: ``[T, B, A]`` policy logits (with grad).
        values: ``[T, B]`` value estimates (with grad).
        actions: ``[T, B]`` int64 actions taken.
        rewards: ``[T, B]`` rewards received after each action.
        bootstrap: ``[B]`` value after the last step, or None (episode over).
        terminated, truncated, final_values: episode ends inside the sequence, see
            :func:`discounted_returns` (``final_values`` is detached here).
    Returns:
        dict of scalars: ``loss`` (to backpropagate), ``policy_loss``, ``value_loss`` (mean
        squared advantage), ``entropy`` (mean policy entropy), ``advantage`` (mean).
    """
    if (
        logits.dim() != 3
        or values.shape != logits.shape[:2]
        or actions.shape != logits.shape[:2]
        or rewards.shape != logits.shape[:2]
    ):
        raise ValueError(
            f"shape mismatch: logits {tuple(logits.shape)} (want [T,B,A]), values "
            f"{tuple(values.shape)}, actions {tuple(actions.shape)}, rewards "
            f"{tuple(rewards.shape)} (want [T,B])"
        )
    if final_values is not None:
        final_values = final_values.detach()
    returns = discounted_returns(rewards.to(values.dtype), discount, bootstrap, terminated, truncated, final_values)
    advantage = returns - values
    log_probs = F.log_softmax(logits, dim=-1)
    log_prob_taken = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    policy_loss = -(log_prob_taken * advantage.detach()).mean()
    value_loss = advantage.pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + baseline_cost * value_loss - entropy_cost * entropy_mean
    return {
        "loss": loss,
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy_mean.detach(),
        "advantage": advantage.detach().mean(),
    }
