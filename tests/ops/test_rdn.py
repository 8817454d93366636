"""``rdn`` (RFWP Eq. 15-18): the reference's feature-map option, and the one rule of its
fused kernel (softmax only, key size = head size); and every check of op_contract.py."""

from __future__ import annotations

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops
from rfwp_rl.errors import UserError
from rfwp_rl.ops import cases
from rfwp_rl.ops.common import softmax

OP = "rdn"
D = torch.float64


def test_rdn_feature_map_keyword():
    args, reset = cases.make_inputs("rdn", T=5, B=3, H=2, d=4, reset_at=((2, 1),))
    rdn = ops.naive("rdn")
    y_soft = rdn(*args, reset)[0]
    torch.testing.assert_close(rdn(*args, reset, feature_map=lambda x: torch.softmax(x, -1))[0], y_soft)
    # a map that doubles the key size: W becomes [B, H, d, 2d]
    W0 = torch.zeros(*args[8].shape[:-1], 2 * args[8].shape[-1], dtype=D)
    dbl = lambda x: torch.softmax(torch.cat([x, -x], -1), -1)
    y, W = rdn(*args[:8], W0, args[9], reset, feature_map=dbl)
    assert y.shape == y_soft.shape and W.shape == W0.shape
    assert not torch.allclose(y, y_soft)


def test_fused_rdn_runs_softmax_only():
    supported = ops.spec("rdn").supported
    assert supported(ops.Dims(32, 32, "softmax"), torch.float32, "cpu") is None
    assert (
        supported(ops.Dims(32, 32, "elu_sum"), torch.float32, "cpu")
        == "rdn with feature map 'elu_sum' (the fused kernel implements softmax only)"
    )
    assert "key size equal to the head size" in supported(ops.Dims(64, 32, "softmax"), torch.float32, "cpu")


def test_other_feature_maps_fall_back_or_raise(ext):
    from rfwp_rl.cores import feature_maps

    args, reset = cases.make_inputs("rdn", T=4, B=2, H=1, d=4, reset_at=((1, 0),))
    auto, required = ops.get("rdn", "auto"), ops.get("rdn", "kernel")
    expect = ops.naive("rdn")(*args, reset, feature_map=feature_maps.elu_sum)
    torch.testing.assert_close(auto(*args, reset, feature_map=feature_maps.elu_sum), expect)
    with pytest.raises(UserError, match="softmax only"):
        required(*args, reset, feature_map=feature_maps.elu_sum)
    # softmax given explicitly (the cores pass theirs, which is the ops' own) is the kernel's
    assert feature_maps.softmax is softmax
    torch.testing.assert_close(required(*args, reset, feature_map=feature_maps.softmax), ops.naive("rdn")(*args, reset))
    # resolved once for a sublayer's sizes: decided at resolution, not per call
    assert ops.resolve("rdn", "auto", ops.Dims(4, 4, "elu_sum"), feature_map=feature_maps.elu_sum)(*args, reset)[
        0
    ].equal(expect[0])
    with pytest.raises(
        UserError,
        match=r"cannot run op 'rdn' at key size 4, value size 4: rdn "
        r"with feature map 'elu_sum'",
    ):
        ops.resolve("rdn", "kernel", ops.Dims(4, 4, "elu_sum"))
