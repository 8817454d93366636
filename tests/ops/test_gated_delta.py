"""``gated_delta`` (Gated DeltaNet paper Eq. 10): the recurrence written out with matrices,
α = 1 is the delta rule, α = 0 forgets everything before the step; and every check of
op_contract.py."""

from __future__ import annotations

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops
from rfwp_rl.ops import cases

OP = "gated_delta"
D = torch.float64


def _eq10(q, k, v, alpha, beta, S0):
    """Gated DeltaNet Eq. 10 with explicit matrices, one (batch, head): q, k [T, dk], v [T, dv],
    alpha, beta [T], S0 [dv, dk] -> o [T, dv], S_T."""
    S, out = S0, []
    eye = torch.eye(k.shape[1], dtype=D)
    for t in range(q.shape[0]):
        S = S @ (alpha[t] * (eye - beta[t] * torch.outer(k[t], k[t]))) + beta[t] * torch.outer(v[t], k[t])
        out.append(S @ q[t])
    return torch.stack(out), S


def test_small_case_by_hand():
    # S0 = [[1, 2], [3, 4]], α = 0.5, β = 1, k = q = e0, v = (1, 1):
    # S = 0.5 S0 (I - e0 e0ᵀ) + v e0ᵀ = [[1, 1], [1, 2]], o = S e0 = (1, 1)
    e0 = torch.tensor([1.0, 0.0], dtype=D).view(1, 1, 1, 2)
    o, S = ops.naive(OP)(
        e0,
        e0,
        torch.ones(1, 1, 1, 2, dtype=D),
        torch.full((1, 1, 1), 0.5, dtype=D),
        torch.ones(1, 1, 1, dtype=D),
        torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=D).view(1, 1, 2, 2),
        None,
    )
    torch.testing.assert_close(S[0, 0], torch.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=D))
    torch.testing.assert_close(o[0, 0, 0], torch.tensor([1.0, 1.0], dtype=D))


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_equals_equation_10_written_out(backend):
    (q, k, v, alpha, beta, S0), _ = cases.make_inputs(OP, T=6, B=2, H=2, d=3, dk=4, seed=4)
    o, S = ops.get(OP, backend)(q, k, v, alpha, beta, S0, None)
    for b in range(2):
        for h in range(2):
            o_ref, S_ref = _eq10(q[:, b, h], k[:, b, h], v[:, b, h], alpha[:, b, h], beta[:, b, h], S0[b, h])
            torch.testing.assert_close(o[:, b, h], o_ref)
            torch.testing.assert_close(S[b, h], S_ref)


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_decay_one_is_the_delta_rule(backend):
    # α = 1: DeltaNet with the same (unit-length) keys, values, β and initial state
    (q, k, v, alpha, beta, S0), reset = cases.make_inputs(OP, T=7, B=3, H=2, d=5, reset_at=((3, 1),), seed=2)
    out = ops.get(OP, backend)(q, k, v, torch.ones_like(alpha), beta, S0, reset)
    torch.testing.assert_close(out, ops.naive("delta")(q, k, v, beta, S0, reset))
    assert not torch.allclose(ops.naive(OP)(q, k, v, alpha, beta, S0, reset)[0], out[0])


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_decay_zero_forgets_everything_before_the_step(backend):
    T, t0 = 7, 3
    args, _ = cases.make_inputs(OP, T=T, B=2, H=2, d=4, seed=3)
    q, k, v, alpha, beta, S0 = [a.requires_grad_() for a in args]
    a = alpha.detach().clone()
    a[t0] = 0.0
    o, S = ops.get(OP, backend)(q, k, v, a, beta, S0, None)
    # from step t0 on: the same as a run that starts at t0 from the zero state
    o_late, S_late = ops.naive(OP)(q[t0:], k[t0:], v[t0:], a[t0:], beta[t0:], torch.zeros_like(S0), None)
    torch.testing.assert_close(o[t0:], o_late)
    torch.testing.assert_close(S, S_late)
    # ... so no gradient from those outputs reaches the earlier inputs or S0
    o[t0:].sum().backward()
    for x in (q, k, v, beta):
        assert x.grad[:t0].abs().max() == 0 and x.grad[t0:].abs().max() > 0
    assert S0.grad.abs().max() == 0
