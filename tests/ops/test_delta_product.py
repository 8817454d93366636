"""``delta_product`` (DeltaProduct paper Sec. 3): n_h = 1 is the delta rule, the state
transition is the product of the n_h generalised Householder matrices (a reflection at β = 2),
the recurrence written out in its linear-RNN form; and every check of op_contract.py."""

from __future__ import annotations

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops
from rfwp_rl.ops import cases

OP = "delta_product"
D = torch.float64


def _inputs(n_h: int, T: int = 5, B: int = 2, H: int = 2, d: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=D)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # exactly unit length
    return (
        unit(r(T, B, H, d)),
        unit(r(T, B, H, n_h, d)),
        r(T, B, H, n_h, d),
        2 * torch.sigmoid(r(T, B, H, n_h)),
        0.5 * r(B, H, d, d),
    )


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_one_householder_step_is_the_delta_rule(backend):
    q, k, v, beta, S0 = _inputs(1)
    reset = torch.zeros(5, 2, dtype=torch.bool)
    reset[2, 1] = True
    out = ops.get(OP, backend)(q, k, v, beta, S0, reset)
    torch.testing.assert_close(out, ops.naive("delta")(q, k[:, :, :, 0], v[:, :, :, 0], beta[..., 0], S0, reset))


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_transition_is_the_product_of_householder_matrices(backend):
    # v = 0, S0 = I: after one input S = (I - β1 k1 k1ᵀ)(I - β2 k2 k2ᵀ)(I - β3 k3 k3ᵀ)
    q, k, v, beta, _ = _inputs(3, T=1, B=1, H=1, d=4)
    S0 = torch.eye(4, dtype=D).view(1, 1, 4, 4)
    _, S = ops.get(OP, backend)(q, k, torch.zeros_like(v), beta, S0, None)
    eye = torch.eye(4, dtype=D)
    A = eye
    for j in range(3):
        A = A @ (eye - beta[0, 0, 0, j] * torch.outer(k[0, 0, 0, j], k[0, 0, 0, j]))
    torch.testing.assert_close(S[0, 0], A)
    # β = 2 on a unit key: a reflection (eigenvalue -1 along k, an involution)
    _, R = ops.get(OP, backend)(
        q, k[:, :, :, :1], torch.zeros_like(v[:, :, :, :1]), torch.full_like(beta[..., :1], 2.0), S0, None
    )
    kk = k[0, 0, 0, 0]
    torch.testing.assert_close(R[0, 0] @ kk, -kk)
    torch.testing.assert_close(R[0, 0] @ R[0, 0], eye)


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_equals_the_linear_rnn_form_written_out(backend):
    # S_t = S_{t-1} A_t + B_t with A_t = Π_j (I - β_j k_j k_jᵀ) and
    # B_t = Σ_j β_j v_j k_jᵀ Π_{i>j} (I - β_i k_i k_iᵀ); o_t = S_t q_t
    n_h = 3
    q, k, v, beta, S0 = _inputs(n_h, T=4, d=3, seed=5)
    o, S = ops.get(OP, backend)(q, k, v, beta, S0, None)
    eye = torch.eye(3, dtype=D)
    for b in range(2):
        for h in range(2):
            St = S0[b, h]
            for t in range(4):
                Hs = [eye - beta[t, b, h, j] * torch.outer(k[t, b, h, j], k[t, b, h, j]) for j in range(n_h)]
                A = Hs[0] @ Hs[1] @ Hs[2]
                Bt = sum(
                    beta[t, b, h, j]
                    * torch.outer(v[t, b, h, j], k[t, b, h, j])
                    @ (torch.linalg.multi_dot([eye, *Hs[j + 1 :]]) if j + 1 < n_h else eye)
                    for j in range(n_h)
                )
                St = St @ A + Bt
                torch.testing.assert_close(o[t, b, h], St @ q[t, b, h])
            torch.testing.assert_close(S[b, h], St)


def test_fused_number_of_householder_steps(ext):
    # n_h = 1, 3, 4 through the kernel (the shared checks use n_h = 2)
    for n_h in (1, 3, 4):
        args = list(_inputs(n_h, T=6, B=2, H=2, d=5, seed=n_h))
        reset = torch.zeros(6, 2, dtype=torch.bool)
        reset[3, 0] = True
        err, gerr = cases.max_errors(OP, lambda *a: ops.spec(OP).fused(ext, 2, *a), args, reset)
        assert err < 1e-12 and gerr < 1e-12, (n_h, err, gerr)
