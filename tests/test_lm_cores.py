"""The language-modelling cores (delta_lstm, delta_mlp, delta_delta): what is specific to them.

They compute the equations of RFWP App. A.2 (Delta LSTM version D), Eq. 13-14 (Delta MLP)
and App. A.3 (Delta-Delta Net), checked on tiny cases against loops written out here from
the equations; their registration, state layout, parameter counts and checkpoint keys.
The generic cores contract (chunking, resets, gradients through time, backends) runs on
every registered core, these included, in tests/test_cores.py.
"""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.cores import fast_weight, lm_cores
from rfwp_rl.errors import UserError

D = torch.float64
IN = 5
LM = ("delta_lstm", "delta_mlp", "delta_delta")
SMALL = {"hidden_size": 8, "num_layers": 2, "num_heads": 2, "ff_size": 12}


def small(name, seed=0, **extra):
    torch.manual_seed(seed)
    return cores.make(name, IN, **{**SMALL, **extra}).to(D)


def rand(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D)


# ------------------------------------------------------------------------- registry


def test_registered_with_defaults_and_equations():
    specs = cores.available()
    for name in LM:
        assert specs[name].equations.startswith("RFWP paper")
        assert specs[name].defaults["hidden_size"] == 128
    assert specs["delta_mlp"].defaults["fast_layers"] == 2
    with pytest.raises(UserError, match="unknown config key 'fast_layers' for core 'delta_lstm'"):
        cores.make("delta_lstm", 4, fast_layers=2)
    with pytest.raises(UserError, match="fast_layers"):
        cores.make("delta_mlp", 4, fast_layers=0)


def test_state_layout():
    B, H, d = 3, 2, 4
    expect = {
        "delta_lstm": [(B, 3 * H, d, d), (B, 3 * H, d, d), (B, H, d), (B, H, d)],
        "delta_mlp": [(B, H, d, d)] * 2,
        "delta_delta": [(B, H, 3 * d + 1, d), (B, H, d, d)],
    }
    for name in LM:
        core = small(name)
        assert core.state_shapes(B) == expect[name] * 2  # two layers
        y, state = core(rand(4, B, IN), None)
        assert y.shape == (4, B, 8) and [tuple(s.shape) for s in state] == expect[name] * 2


def test_parameter_differences_match_the_paper_lm_setting():
    # RFWP Table 1: 16 layers, hidden 128, 8 heads (d = 16), FF 2048. Delta Net 44.0M,
    # Delta-Delta 44.6M, Delta LSTM 47.3M: the differences come from the slow projections.
    cfg = {"hidden_size": 128, "num_layers": 16, "num_heads": 8, "ff_size": 2048}
    n = {
        name: sum(p.numel() for p in cores.make(name, 128, **cfg).parameters())
        for name in ("delta", "delta_delta", "delta_lstm")
    }
    assert n["delta_delta"] - n["delta"] == 16 * 128 * 8 * (5 * 16 + 2 - (3 * 16 + 1))  # 540,672
    assert n["delta_lstm"] - n["delta"] == 16 * 128 * 8 * (15 * 16 + 6 - (3 * 16 + 1))  # 3,227,648
    assert round((n["delta_lstm"] - n["delta"]) / 1e6, 1) == pytest.approx(47.3 - 44.0, abs=0.1)


# ------------------------------------------------------------------------- construction


def _keys(layer_params):
    """state_dict keys of a 2-layer block stack whose fast-weight sublayers own ``layer_params``."""
    keys = ["input_proj.weight", "input_proj.bias"]
    for i in range(2):
        keys += [f"fast_layers.{i}.{k}" for k in layer_params]
    for i in range(2):
        keys += [
            f"ff_layers.{i}.{k}"
            for k in ("norm.weight", "norm.bias", "net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias")
        ]
    return keys


def test_state_dict_keys_and_parameter_order():
    # the layout a checkpoint of every LM core and of lt/delta/delta_rnn/rdn records, and the
    # parameter order the optimizer's state follows
    plain = ("norm.weight", "norm.bias", "slow.weight", "out.weight")
    expect = {
        "lt": (22, 384),
        "delta": (22, 388),
        "delta_rnn": (22, 648),
        "rdn": (30, 388),
        "delta_lstm": (22, 1944),
        "delta_mlp": (22, 648),
        "delta_delta": (22, 648),
    }
    for name, (count, slow_rows) in expect.items():
        core = cores.make(name, 7)  # defaults: hidden 128, 4 heads, 2 layers
        sd = core.state_dict()
        layer = (("Rq", "Rk", "Rv", "rb") if name == "rdn" else ()) + plain
        assert list(sd) == _keys(layer) and len(sd) == count, name
        assert [n for n, _ in core.named_parameters()] == list(sd), name  # optimizer order
        assert sd["fast_layers.1.slow.weight"].shape == (slow_rows, 128), name
        assert sd["input_proj.weight"].shape == (128, 7) and sd["ff_layers.0.net.0.weight"].shape == (512, 128)
    sd = cores.make("delta_mlp", 7, fast_layers=3).state_dict()
    assert list(sd) == _keys(plain) and sd["fast_layers.0.slow.weight"].shape == (4 * (32 + 3 * 65), 128)
    # the sequence trainer's softmax Transformer is built the same way (LMFastWeightCore)
    from rfwp_rl.seq.attention import TransformerCore

    sd = TransformerCore(7).state_dict()
    assert list(sd) == _keys(plain) and sd["fast_layers.0.slow.weight"].shape == (384, 128)


def test_the_sublayer_class_is_chosen_at_construction():
    for name, cls in lm_cores.SUBLAYERS.items():
        core = small(name)
        assert all(type(layer) is cls for layer in core.fast_layers), name
        assert core.name == name and len(core.fast_layers) == 2
    assert small("delta_mlp", fast_layers=3).config["fast_layers"] == 3
    assert all(layer.K == 3 for layer in small("delta_mlp", fast_layers=3).fast_layers)

    class Core(fast_weight.FastWeightCore):
        kind = "delta"
        sublayer_cls = lm_cores.DeltaDeltaSublayer

    core = Core(IN, hidden_size=8, num_heads=2)
    assert [type(layer) for layer in core.fast_layers] == [lm_cores.DeltaDeltaSublayer] * 2
    core = Core(
        IN, hidden_size=8, num_heads=2, sublayer_cls=lm_cores.DeltaMLPSublayer, sublayer_config={"fast_layers": 4}
    )  # argument wins
    assert all(type(layer) is lm_cores.DeltaMLPSublayer and layer.K == 4 for layer in core.fast_layers)
    assert core.config["fast_layers"] == 4 and len(core.state_shapes(1)) == 8
    with pytest.raises(TypeError, match="no fast-weight sublayer class"):
        fast_weight.FastWeightCore(IN)


# ------------------------------------------------------------------------- equations by hand
# One head (H = 1), d = 2, T = 3, feature map softmax; the sublayer's recurrence on given
# slow projections p is compared with loops over python floats written from the equations.


def softmax(v):
    e = [pow(2.718281828459045, a) for a in v]
    s = sum(e)
    return [a / s for a in e]


def sigmoid(a):
    return 1.0 / (1.0 + pow(2.718281828459045, -a))


def matvec(W, x):
    return [sum(W[i][j] * x[j] for j in range(len(x))) for i in range(len(W))]


def delta_write(W, k, v, beta):
    """RFWP Eq. 8, 10 on lists: W += beta (v - W k) k^T."""
    vbar = matvec(W, k)
    return [[W[i][j] + beta * (v[i] - vbar[i]) * k[j] for j in range(len(k))] for i in range(len(W))]


def zeros(r, c):
    return [[0.0] * c for _ in range(r)]


def sublayer(name, **extra):
    torch.manual_seed(0)
    layer = lm_cores.SUBLAYERS[name](2, 1, 0.0, "softmax", 1, "reference", **extra).to(D)
    return layer


def test_delta_lstm_version_d_by_hand():
    layer = sublayer("delta_lstm")
    T, d = 3, 2
    p = rand(T, 1, 1, layer.slow_per_head(), seed=11)
    y, _ = layer.recurrence(p, tuple(torch.zeros(s, dtype=D) for s in layer.state_shapes(1)), None)
    P = p[:, 0, 0].tolist()
    Wm = [zeros(d, d) for _ in range(3)]  # W, W_f, W_o
    Rm = [zeros(d, d) for _ in range(3)]  # R, R_f, R_o
    c, yp = [0.0] * d, [0.0] * d
    for t in range(T):
        row = P[t]
        q = [row[g * d : (g + 1) * d] for g in range(3)]
        k = [row[3 * d + g * d : 3 * d + (g + 1) * d] for g in range(3)]
        v = [row[6 * d + g * d : 6 * d + (g + 1) * d] for g in range(3)]
        kr = [row[9 * d + g * d : 9 * d + (g + 1) * d] for g in range(3)]
        vr = [row[12 * d + g * d : 12 * d + (g + 1) * d] for g in range(3)]
        bw, br = row[15 * d : 15 * d + 3], row[15 * d + 3 : 15 * d + 6]
        z, r = [], []
        fy = softmax(yp)
        for g in range(3):
            Wm[g] = delta_write(Wm[g], softmax(k[g]), v[g], sigmoid(bw[g]))
            Rm[g] = delta_write(Rm[g], softmax(kr[g]), vr[g], sigmoid(br[g]))
            z.append(matvec(Wm[g], softmax(q[g])))
            r.append(matvec(Rm[g], fy))
        u = [z[0][i] + r[0][i] for i in range(d)]  # Eq. 36
        f = [sigmoid(z[1][i] + r[1][i]) for i in range(d)]  # Eq. 37
        o = [sigmoid(z[2][i] + r[2][i]) for i in range(d)]  # Eq. 38
        c = [f[i] * c[i] + (1 - f[i]) * u[i] for i in range(d)]  # Eq. 39
        yp = [c[i] * o[i] for i in range(d)]  # Eq. 40
        assert y[t, 0, 0].tolist() == pytest.approx(yp, abs=1e-12)


def test_delta_mlp_by_hand():
    layer = sublayer("delta_mlp", fast_layers=2)
    T, d = 3, 2
    p = rand(T, 1, 1, layer.slow_per_head(), seed=12)
    y, _ = layer.recurrence(p, tuple(torch.zeros(s, dtype=D) for s in layer.state_shapes(1)), None)
    Ws = [zeros(d, d), zeros(d, d)]
    for t in range(T):
        row = p[t, 0, 0].tolist()
        h = row[:d]  # h_0 = q
        for k in range(2):
            key = row[d + k * (2 * d + 1) : d + k * (2 * d + 1) + d]
            val = row[2 * d + k * (2 * d + 1) : 3 * d + k * (2 * d + 1)]
            beta = row[3 * d + k * (2 * d + 1)]
            Ws[k] = delta_write(Ws[k], softmax(key), val, sigmoid(beta))
            h = matvec(Ws[k], softmax(h))  # Eq. 13
        assert y[t, 0, 0].tolist() == pytest.approx(h, abs=1e-12)  # Eq. 14


def test_delta_delta_by_hand():
    layer = sublayer("delta_delta")
    T, d = 3, 2
    p = rand(T, 1, 1, layer.slow_per_head(), seed=13)
    assert layer.slow_per_head() == 5 * d + 2  # App. A.3
    y, (M, W) = layer.recurrence(p, tuple(torch.zeros(s, dtype=D) for s in layer.state_shapes(1)), None)
    Mh, Wh = zeros(3 * d + 1, d), zeros(d, d)
    for t in range(T):
        row = p[t, 0, 0].tolist()
        qs, ks, vs, bs = row[:d], row[d : 2 * d], row[2 * d : 5 * d + 1], row[5 * d + 1]
        Mh = delta_write(Mh, softmax(ks), vs, sigmoid(bs))  # the fast slow-weights
        proj = matvec(Mh, softmax(qs))  # [q, k, v, beta]
        q, k, v, b = proj[:d], proj[d : 2 * d], proj[2 * d : 3 * d], proj[3 * d]
        Wh = delta_write(Wh, softmax(k), v, sigmoid(b))  # RFWP Eq. 8-10
        assert y[t, 0, 0].tolist() == pytest.approx(matvec(Wh, softmax(q)), abs=1e-12)
    assert M[0, 0].flatten().tolist() == pytest.approx(sum(Mh, []), abs=1e-12)
