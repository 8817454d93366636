"""V-trace off-policy targets (Espeholt et al. 2018, "IMPALA", Sec. 4.1, Eq. 1).

Time-major tensors, T steps of B trajectories. Step t of trajectory b is
``(x_t, a_t, r_t, gamma_t)``: the agent in state x_t took action a_t (drawn from the
behaviour policy mu), got reward r_t and discount gamma_t (0 where the episode ended after
a_t), and arrived in x_{t+1}. ``values[t] = V(x_t)`` from the learner and
``bootstrap_value = V(x_T)``.

The targets are (IMPALA Eq. 1, written recursively as in its Remark 1)::

    rho_t   = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))
    c_t     = lambda * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t))   (lambda: IMPALA Sec. 4.1, Remark 2)
    delta_t = rho_t * (r_t + gamma_t V(x_{t+1}) - V(x_t))
    v_t - V(x_t) = delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})),   v_T = V(x_T)

``lambda = 1`` is the paper's V-trace; ``lambda < 1`` shortens the traces like TD(lambda), to
which V-trace reduces on-policy: the targets then carry less of the noise of far-away rewards.

The policy-gradient advantage (IMPALA Sec. 4.2) is
``rho^pg_t * (r_t + gamma_t v_{t+1} - V(x_t))`` with ``rho^pg_t = min(rho_pg_bar, ratio)``.
Everything here is computed without gradient (the targets are constants for the loss). The
ratios come in as log pi(a_t|x_t) - log mu(a_t|x_t), whatever the action distribution
(:mod:`rfwp_rl.distributions`): V-trace never sees the policies' parameters.

Time-limit truncation is not termination: the step that shows the last observation of a
truncated episode has ``mask_t = 0`` (the environment never executed its action; the next
entry starts a new episode, so ``gamma_t = 0``). There ``delta_t = 0``, hence ``v_t = V(x_t)``
and a zero advantage, so the step before it bootstraps from the value of the last observation:
``v_{t-1} - V(x_{t-1}) = delta_{t-1} = rho_{t-1} (r_{t-1} + gamma V(x_t) - V(x_{t-1}))``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # [T, B] value targets v_t
    pg_advantages: torch.Tensor  # [T, B] policy-gradient advantages
    log_rhos: torch.Tensor  # [T, B] log pi(a_t|x_t) - log mu(a_t|x_t)


@torch.no_grad()
def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    mask: torch.Tensor | None = None,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance ratios.

    Args:
        log_rhos, discounts, rewards, values: ``[T, B]``.
        bootstrap_value: ``[B]``, V(x_T).
        clip_rho_threshold: rho_bar (None: no clipping); clip_c_threshold: c_bar;
        clip_pg_rho_threshold: clipping of the ratio in the policy-gradient advantage.
        mask: ``[T, B]``, 0 where step t's action was never executed (the last observation of a
            time-limit-truncated episode, see the module docstring); None: all 1.
        lambda_: the trace factor lambda in [0, 1] (1: the paper's V-trace).
    Returns:
        :class:`VTraceReturns` with ``vs`` and ``pg_advantages`` of shape ``[T, B]``.
    """
    rhos = torch.exp(log_rhos)
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = lambda_ * (rhos if clip_c_threshold is None else rhos.clamp(max=clip_c_threshold))

    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_next - values)  # IMPALA Eq. 1, delta_t V
    if mask is not None:
        deltas = deltas * mask

    # v_t - V(x_t) = delta_t + gamma_t c_t (v_{t+1} - V(x_{t+1})), backwards from v_T - V(x_T) = 0.
    acc = torch.zeros_like(bootstrap_value)
    vs_minus_v = torch.empty_like(values)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)  # IMPALA Sec. 4.2
    if mask is not None:
        pg_advantages = pg_advantages * mask
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, log_rhos=log_rhos)
