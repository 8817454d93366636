"""``srwm`` (SRWM paper Eq. 5-8): the recurrence written out element by element for d = 2,
a reset restores W_init, equal query and key rows leave W unchanged, the feature-map option
and the one rule of the fused kernel (softmax only, key size = head size); and every check of
op_contract.py."""

from __future__ import annotations

import math

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import ops
from rfwp_rl.errors import UserError
from rfwp_rl.ops import cases

OP = "srwm"
D = torch.float64


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [x / sum(e) for x in e]


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _srwm_by_hand(x, W_init, dW0, reset):
    """SRWM Eq. 5-8 with Python floats for one head, d = 2 (W has 3·2 + 4 = 10 rows):
    x [T][2] (through softmax), W_init, dW0 [10][2], reset [T] -> y [T][2], dW_T."""
    dW = [row[:] for row in dW0]
    ys = []
    for t, xt in enumerate(x):
        if reset[t]:
            dW = [[0.0, 0.0] for _ in range(10)]
        W = [[W_init[r][c] + dW[r][c] for c in range(2)] for r in range(10)]
        p = [W[r][0] * xt[0] + W[r][1] * xt[1] for r in range(10)]  # Eq. 5
        y, q, k, b = p[0:2], _softmax(p[2:4]), _softmax(p[4:6]), p[6:10]
        v = [W[r][0] * q[0] + W[r][1] * q[1] for r in range(10)]  # Eq. 6
        v_bar = [W[r][0] * k[0] + W[r][1] * k[1] for r in range(10)]  # Eq. 7
        block = [0, 0, 1, 1, 2, 2, 3, 3, 3, 3]  # rows of y, q, k, then the four rates
        for r in range(10):  # Eq. 8
            rate = _sigmoid(b[block[r]])
            for c in range(2):
                dW[r][c] += rate * (v[r] - v_bar[r]) * k[c]
        ys.append(y)
    return ys, dW


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_two_by_two_case_written_out(backend):
    (x, W_init, dW0), _ = cases.make_inputs(OP, T=5, B=2, H=1, d=2, seed=8)
    reset = torch.zeros(5, 2, dtype=torch.bool)
    reset[3, 1] = True
    y, dW = ops.get(OP, backend)(x, W_init, dW0, reset)
    for b in range(2):
        ys, dW_b = _srwm_by_hand(x[:, b, 0].tolist(), W_init[0].tolist(), dW0[b, 0].tolist(), reset[:, b].tolist())
        torch.testing.assert_close(y[:, b, 0], torch.tensor(ys, dtype=D))
        torch.testing.assert_close(dW[b, 0], torch.tensor(dW_b, dtype=D))


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_reset_restores_the_slow_initial_weights(backend):
    # after a reset W = W_init: the output is the y-rows of W_init times x
    (x, W_init, dW0), _ = cases.make_inputs(OP, T=4, B=2, H=2, d=3, seed=1)
    reset = torch.zeros(4, 2, dtype=torch.bool)
    reset[2, 0] = True
    y, _ = ops.get(OP, backend)(x, W_init, dW0, reset)
    torch.testing.assert_close(y[2, 0], torch.einsum("hrd,hd->hr", W_init[:, :3], x[2, 0]))
    assert not torch.allclose(y[2, 1], torch.einsum("hrd,hd->hr", W_init[:, :3], x[2, 1]))


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_equal_query_and_key_rows_never_write(backend):
    # q = k for every input: φ(q) = φ(k), so v - v̄ = 0 (Eq. 6-8) and W stays W_init
    (x, W_init, _), _ = cases.make_inputs(OP, T=5, B=2, H=1, d=3, seed=2)
    W_init = W_init.clone()
    W_init[:, 3:6] = W_init[:, 6:9]  # the q rows equal the k rows
    dW0 = torch.zeros(2, 1, 13, 3, dtype=D)
    y, dW = ops.get(OP, backend)(x, W_init, dW0, None)
    assert dW.abs().max() == 0
    torch.testing.assert_close(y, torch.einsum("hrd,tbhd->tbhr", W_init[:, :3], x))


def test_feature_map_keyword():
    from rfwp_rl.cores import feature_maps

    args, reset = cases.make_inputs(OP, T=4, B=2, H=1, d=3, reset_at=((2, 1),))
    srwm = ops.naive(OP)
    torch.testing.assert_close(srwm(*args, reset, feature_map=lambda z: torch.softmax(z, -1)), srwm(*args, reset))
    y_elu, _ = srwm(*args, reset, feature_map=feature_maps.elu_sum)
    assert y_elu.shape == (4, 2, 1, 3) and not torch.allclose(y_elu, srwm(*args, reset)[0])


def test_fused_srwm_runs_softmax_only(ext):
    from rfwp_rl.cores import feature_maps

    supported = ops.spec(OP).supported
    assert supported(ops.Dims(8, 8, "softmax"), torch.float32, "cpu") is None
    assert (
        supported(ops.Dims(8, 8, "elu_sum"), torch.float32, "cpu")
        == "srwm with feature map 'elu_sum' (the fused kernel implements softmax only)"
    )
    assert "key size equal to the head size" in supported(ops.Dims(16, 8, "softmax"), torch.float32, "cpu")
    args, reset = cases.make_inputs(OP, T=3, B=2, H=1, d=4, reset_at=((1, 0),))
    expect = ops.naive(OP)(*args, reset, feature_map=feature_maps.elu_sum)
    torch.testing.assert_close(ops.get(OP, "auto")(*args, reset, feature_map=feature_maps.elu_sum), expect)
    with pytest.raises(UserError, match="softmax only"):
        ops.get(OP, "kernel")(*args, reset, feature_map=feature_maps.elu_sum)
