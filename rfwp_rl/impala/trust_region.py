"""The trust region of a learner update: how far one batch may move the policy.

With ``max_kl`` an update is a trust-region step: after the optimizer step the new policy is
compared with the behaviour policy mu on the batch's own actions, and a step whose mean
KL(mu || pi_new) exceeds ``max_kl`` is shrunk towards the old parameters by sqrt(max_kl / KL)
(KL is quadratic in a small step; TRPO, Schulman et al. 2015, Sec. 6, bounds the same mean KL by a
line search). The bound is on how far one batch can move the policy, whatever the advantages'
scale: an optimizer normalises its steps, so noise around a solved task otherwise moves the
policy as far as a real signal does (measurements: ``docs/profiles/vector.md``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from rfwp_rl.impala.loss import masked_mean, step_mask, unroll


def kl_terms(log_r: torch.Tensor) -> torch.Tensor:
    """Per-sample terms of the non-negative KL(mu || pi) estimator E[(r - 1) - log r] for
    ``log_r = log pi(a) - log mu(a)``, a drawn from mu (Schulman, "Approximating KL divergence",
    2020); same shape as ``log_r``."""
    return log_r.exp() - 1 - log_r


def behaviour_kl(agent: nn.Module, batch: dict[str, torch.Tensor], initial_state: tuple) -> torch.Tensor:
    """Mean KL(mu || pi) over the unmasked steps of ``batch`` (as in :func:`rfwp_rl.impala.loss.compute_loss`),
    estimated on the batch's actions (drawn from mu) with the non-negative estimator E[(r - 1) - log r],
    r = pi(a) / mu(a) (Schulman, "Approximating KL divergence", 2020), so that it needs only
    log-probs and serves every action distribution."""
    with torch.no_grad():
        out = unroll(agent, batch, initial_state)
        log_r = (
            agent.action_dist.log_prob(out["policy_params"][:-1], batch["action"][:-1]).float()
            - batch["behaviour_log_prob"][:-1].float()
        )
        return masked_mean(kl_terms(log_r), step_mask(batch, log_r))


def limit_policy_change(
    agent: nn.Module,
    before: list[torch.Tensor],
    batch: dict[str, torch.Tensor],
    initial_state: tuple,
    max_kl: float,
    start_kl: float = 0.0,
) -> dict[str, float]:
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
