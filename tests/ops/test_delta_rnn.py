"""``delta_rnn`` (RFWP Eq. 12): the recurrent query after a reset, gradients when only some
outputs are used; and every check of op_contract.py."""

from __future__ import annotations

import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops
from rfwp_rl.ops import cases

OP = "delta_rnn"
D = torch.float64


def test_delta_rnn_recurrent_query_is_uniform_after_reset():
    # with W = 0 and R0 set by one write (β_r = 1), y_0 = R softmax(0) = R·1/d
    T, B, H, d = 1, 1, 1, 3
    z = torch.zeros(T, B, H, d, dtype=D)
    zb = torch.zeros(T, B, H, dtype=D)
    kr = torch.tensor([0.2, 0.3, 0.5], dtype=D).view(1, 1, 1, 3)
    vr = torch.tensor([1.0, -2.0, 3.0], dtype=D).view(1, 1, 1, 3)
    y, W, R = ops.naive("delta_rnn")(
        z,
        z,
        z,
        zb,
        kr,
        vr,
        torch.ones_like(zb),
        torch.full((B, H, d, d), 5.0, dtype=D),
        torch.full((B, H, d, d), 5.0, dtype=D),
        torch.full((B, H, d), 3.0, dtype=D),
        torch.ones(T, B, dtype=torch.bool),
    )
    torch.testing.assert_close(R[0, 0], torch.outer(vr.flatten(), kr.flatten()))
    torch.testing.assert_close(y[0, 0, 0], vr.flatten() * kr.sum() / 3)
    torch.testing.assert_close(W, torch.zeros_like(W))


def test_only_some_outputs_used(ext):
    # the cores keep y[-1] as state and may drop W: unused outputs get zero gradient
    args, reset = cases.make_inputs("delta_rnn", T=6, B=2, H=2, d=5, reset_at=((2, 0),))

    def loss(fn):
        leaves = [a.clone().requires_grad_() for a in args]
        y, W, R = fn(*leaves, reset)
        (y[-1].sum() + (R**2).sum()).backward()
        return [x.grad for x in leaves]

    for g1, g2 in zip(loss(ops.naive("delta_rnn")), loss(ops.get("delta_rnn", "kernel"))):
        torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)
