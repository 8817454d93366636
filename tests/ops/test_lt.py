"""``lt`` (RFWP Eq. 6-7): the reference against the attention form, the fused kernel's query
gradient with initial fast weights; and every check of op_contract.py."""

from __future__ import annotations

import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops
from rfwp_rl.ops import cases

OP = "lt"
D = torch.float64


def test_lt_equals_unnormalised_linear_attention_with_initial_state():
    # y_t = W0 q_t + Σ_{s≤t} v_s (k_s · q_t): the attention form of RFWP Eq. 6-7
    (q, k, v, W0), _ = cases.make_inputs("lt", T=5, B=3, H=2, d=4)
    y, W = ops.naive("lt")(q, k, v, W0, None)
    scores = torch.einsum("tbhd,sbhd->bhts", q, k).tril()
    expect = torch.einsum("bhts,sbhe->tbhe", scores, v) + torch.einsum("bhed,tbhd->tbhe", W0, q)
    torch.testing.assert_close(y, expect)
    torch.testing.assert_close(W, W0 + torch.einsum("tbhe,tbhd->bhed", v, k))


def test_lt_query_gradient_includes_initial_fast_weights(ext):
    # The reference CUDA code's LT backward dropped W0 from dL/dq. With v = 0 the fast weights
    # stay W0, so y_t = W0 q_t and dL/dq_t = W0^T dL/dy_t exactly; after entry 0's reset at
    # t = 3 they are zero and so is that gradient.
    T, B, H, d = 5, 2, 2, 4
    (q, k, v, W0), _ = cases.make_inputs("lt", T=T, B=B, H=H, d=d, seed=3)
    v = torch.zeros_like(v)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 0] = True
    q.requires_grad_()
    y, _ = ops.get("lt", "kernel")(q, k, v, W0, reset)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(0), dtype=D)
    y.backward(gy)
    expect = torch.einsum("bhij,tbhi->tbhj", W0, gy)
    expect[3:, 0] = 0
    assert expect.abs().max() > 0.1
    torch.testing.assert_close(q.grad, expect, rtol=1e-12, atol=1e-12)
