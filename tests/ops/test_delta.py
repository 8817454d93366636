"""``delta`` (RFWP Eq. 8-10): hand-checkable delta-rule writes; and every check of
op_contract.py."""

from __future__ import annotations

import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops

OP = "delta"
D = torch.float64


def test_delta_rule_one_hot_keys_write_overwrite_read():
    # B=H=1, d=3, β=1: write (e0, v) then read e0 -> v; overwrite (e0, v2) -> v2;
    # a second key e1 is untouched by the overwrite.
    e = torch.eye(3, dtype=D)
    v, v2, u = (torch.tensor(x, dtype=D) for x in ([1.0, 2.0, 3.0], [-4.0, 0.5, 7.0], [9.0, 8.0, 7.0]))
    k = torch.stack([e[0], e[1], e[0]]).view(3, 1, 1, 3)
    vals = torch.stack([v, u, v2]).view(3, 1, 1, 3)
    q = torch.stack([e[0], e[0], e[0]]).view(3, 1, 1, 3)
    beta = torch.ones(3, 1, 1, dtype=D)
    W0 = torch.zeros(1, 1, 3, 3, dtype=D)
    y, W = ops.naive("delta")(q, k, vals, beta, W0, None)
    torch.testing.assert_close(y[0, 0, 0], v)
    torch.testing.assert_close(y[1, 0, 0], v)  # writing e1 did not disturb e0
    torch.testing.assert_close(y[2, 0, 0], v2)  # overwritten, not added
    torch.testing.assert_close(W[0, 0] @ e[1], u)
    # the same writes through the Linear Transformer add up: v + v2
    y_lt, _ = ops.naive("lt")(q, k, vals, W0, None)
    torch.testing.assert_close(y_lt[2, 0, 0], v + v2)


def test_delta_half_beta_interpolates():
    # β = 0.5 on an existing association: new value = 0.5 v_new + 0.5 v_old (FWM paper §3.1.1)
    e = torch.eye(2, dtype=D)
    k = torch.stack([e[1], e[1]]).view(2, 1, 1, 2)
    vals = torch.tensor([[2.0, 4.0], [6.0, 0.0]], dtype=D).view(2, 1, 1, 2)
    beta = torch.tensor([1.0, 0.5], dtype=D).view(2, 1, 1)
    y, _ = ops.naive("delta")(k, k, vals, beta, torch.zeros(1, 1, 2, 2, dtype=D), None)
    torch.testing.assert_close(y[1, 0, 0], torch.tensor([4.0, 2.0], dtype=D))
