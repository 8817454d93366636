"""Cores against the papers' equations, written out step by step with explicit tensors.

The manual versions below loop over time, batch entries, layers and heads and apply each
equation to vectors, sharing no code with rfwp_rl.cores; only the weights are taken from the
module under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from rfwp_rl import cores, ops
from rfwp_rl.cores import feature_maps
from rfwp_rl.ops.fwm.naive import read as fwm_read
from rfwp_rl.ops.fwm.naive import write as fwm_write

D = torch.float64


def rand(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D)


# ------------------------------------------------------------------------- vector helpers


def sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def softmax(x):
    e = torch.exp(x - x.max())
    return e / e.sum()


def elu_sum(x):  # Secretly-FWP Eq. 30 then Eq. 29 (with the 1e-5 of the agents)
    e = torch.where(x > 0, x + 1.0, torch.exp(x))
    return e / (e.sum() + 1e-5)


def l2(x):  # unit vector (Gated DeltaNet §3.4), with the ops' 1e-6 under the root
    return x / math.sqrt(float((x * x).sum()) + 1e-6)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    y = (x - mu) / math.sqrt(var + eps)
    return y if weight is None else y * weight + bias


def outer(a, b):
    return a[:, None] * b[None, :]


# ------------------------------------------------------------------------- fast-weight stacks


def manual_fast_weight_core(core, x, reset):
    """RFWP paper Eq. 5-18 per step, per entry, per layer, per head."""
    kind = core.name
    T, B, _ = x.shape
    H, d = core.fast_layers[0].H, core.fast_layers[0].d
    phi = {"elu_sum": elu_sum, "softmax": softmax, "l2": l2}[core.config["feature_map"]]
    L = len(core.fast_layers)

    def zeros_state():
        s = {"W": [torch.zeros(d, d, dtype=D) for _ in range(H)], "y": [torch.zeros(d, dtype=D) for _ in range(H)]}
        s["R"] = [torch.zeros(d, d, dtype=D) for _ in range(H)]
        return s

    state = [[zeros_state() for _ in range(L)] for _ in range(B)]
    out = torch.zeros(T, B, core.output_size, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                state[b] = [zeros_state() for _ in range(L)]
            h = core.input_proj.weight @ x[t, b] + core.input_proj.bias
            for layer in range(L):
                fl, ffl = core.fast_layers[layer], core.ff_layers[layer]
                st = state[b][layer]
                z = layer_norm(h, fl.norm.weight, fl.norm.bias)
                p = (fl.slow.weight @ z).view(H, -1)
                ys = []
                for hd in range(H):
                    ph = p[hd]
                    W, y_prev = st["W"][hd], st["y"][hd]
                    if kind == "lt":
                        q, k, v = ph[:d], ph[d : 2 * d], ph[2 * d : 3 * d]
                        W = W + outer(v, phi(k))  # Eq. 6
                        y = W @ phi(q)  # Eq. 7
                    elif kind == "delta":
                        q, k, v, beta = ph[:d], ph[d : 2 * d], ph[2 * d : 3 * d], sigmoid(ph[3 * d])
                        k = phi(k)
                        v_bar = W @ k  # Eq. 10
                        W = W + beta * outer(v - v_bar, k)  # Eq. 8
                        y = W @ phi(q)  # Eq. 7
                    elif kind == "delta_rnn":
                        q, k, v, kr, vr = (ph[i * d : (i + 1) * d] for i in range(5))
                        beta, beta_r = sigmoid(ph[5 * d]), sigmoid(ph[5 * d + 1])
                        k, kr = phi(k), softmax(kr)
                        W = W + beta * outer(v - W @ k, k)  # Eq. 8 (W)
                        R = st["R"][hd]
                        R = R + beta_r * outer(vr - R @ kr, kr)  # Eq. 8 (R)
                        st["R"][hd] = R
                        y = W @ phi(q) + R @ softmax(y_prev)  # Eq. 12
                    elif kind == "rdn":
                        xq, xk, xv, xb = ph[:d], ph[d : 2 * d], ph[2 * d : 3 * d], ph[3 * d]
                        r = torch.tanh(y_prev)
                        k = phi(xk + fl.Rk[hd] @ r)  # Eq. 15
                        v = xv + fl.Rv[hd] @ r  # Eq. 16
                        q = phi(xq + fl.Rq[hd] @ r)  # Eq. 17
                        beta = sigmoid(xb + fl.rb[hd] @ r)  # Eq. 18
                        W = W + beta * outer(v - W @ k, k)  # Eq. 8, 10
                        y = W @ q  # Eq. 7
                    st["W"][hd], st["y"][hd] = W, y
                    ys.append(y)
                h = h + fl.out.weight @ torch.cat(ys)  # residual
                lin1, lin2 = ffl.net[0], ffl.net[3]
                u = torch.relu(lin1.weight @ layer_norm(h, ffl.norm.weight, ffl.norm.bias) + lin1.bias)
                h = h + lin2.weight @ u + lin2.bias  # residual FF
            out[t, b] = h
    return out, state


@pytest.mark.parametrize(
    "kind,feature_map",
    [
        ("lt", "elu_sum"),
        ("delta", "elu_sum"),
        ("delta_rnn", "softmax"),
        ("rdn", "softmax"),
        ("delta", "softmax"),
        ("rdn", "elu_sum"),
        ("rdn", "l2"),
        ("delta", "l2"),
        ("lt", "l2"),
    ],
)
def test_fast_weight_core_matches_the_papers_equations(kind, feature_map):
    torch.manual_seed(0)
    core = cores.make(
        kind, 5, hidden_size=8, num_heads=2, ff_size=12, num_layers=2, feature_map=feature_map, backend="reference"
    ).to(D)
    with torch.no_grad():  # LayerNorm affine away from (1, 0) so that it is checked too
        for m in core.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.add_(0.1 * rand(*m.weight.shape, seed=5))
                m.bias.add_(0.1 * rand(*m.bias.shape, seed=6))
    T, B = 4, 2
    x = rand(T, B, 5)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 1] = True
    with torch.no_grad():
        y, state = core(x, None, reset)
        y_manual, st = manual_fast_weight_core(core, x, reset)
    torch.testing.assert_close(y, y_manual)
    # final fast weights of layer 0, entry 1, head 1
    torch.testing.assert_close(state[0][1, 1], st[1][0]["W"][1])


# ------------------------------------------------------------------------- FWM


def manual_fwm(core, x, reset):
    """FWM paper Eq. 1-8 (+ the LSTM and the h residual of §3.1) per step and entry."""
    T, B, _ = x.shape
    n_h, m, Nr = core.hidden_size, core.m, core.num_reads
    lstm = core.lstm
    out = torch.zeros(T, B, n_h, dtype=D)
    Fs = [torch.zeros(m, m, m, dtype=D) for _ in range(B)]
    rescaled = 0
    hs = [torch.zeros(n_h, dtype=D) for _ in range(B)]
    cs = [torch.zeros(n_h, dtype=D) for _ in range(B)]
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                Fs[b], hs[b], cs[b] = (torch.zeros_like(Fs[b]), torch.zeros_like(hs[b]), torch.zeros_like(cs[b]))
            # LSTM (torch gate order i, f, g, o)
            g = lstm.weight_ih_l0 @ x[t, b] + lstm.bias_ih_l0 + lstm.weight_hh_l0 @ hs[b] + lstm.bias_hh_l0
            i, f, gg, o = g[:n_h], g[n_h : 2 * n_h], g[2 * n_h : 3 * n_h], g[3 * n_h :]
            cs[b] = sigmoid(f) * cs[b] + sigmoid(i) * torch.tanh(gg)
            h = hs[b] = sigmoid(o) * torch.tanh(cs[b])
            # write, Eq. 1-4
            wv = core.write.weight @ h + core.write.bias
            k1, k2, v = torch.tanh(wv[:m]), torch.tanh(wv[m : 2 * m]), torch.tanh(wv[2 * m : 3 * m])
            beta = sigmoid(wv[3 * m])
            Fm = Fs[b]
            v_old = torch.zeros(m, dtype=D)
            for s in range(m):
                for r in range(m):
                    v_old = v_old + Fm[s, r] * k1[s] * k2[r]
            Fp = Fm.clone()
            for s in range(m):
                for r in range(m):
                    Fp[s, r] = Fm[s, r] + beta * k1[s] * k2[r] * (v - v_old)  # Eq. 3
            norm = Fp.pow(2).sum().sqrt().item()
            rescaled += norm > 1.0
            Fs[b] = Fm = Fp / max(1.0, norm)  # Eq. 4
            # read, Eq. 5-8
            rv = core.read.weight @ h + core.read.bias
            n = torch.tanh(rv[:m])  # Eq. 5
            for k in range(Nr):
                e = torch.tanh(rv[(k + 1) * m : (k + 2) * m])  # Eq. 6
                nn_ = torch.zeros(m, dtype=D)
                for s in range(m):
                    for r in range(m):
                        nn_ = nn_ + Fm[s, r] * n[s] * e[r]
                n = layer_norm(nn_)  # Eq. 7
            out[t, b] = h + core.out.weight @ n + core.out.bias  # Eq. 8 + h
    return out, Fs, rescaled


def test_fwm_core_matches_the_papers_equations():
    torch.manual_seed(0)
    core = cores.make("fwm", 4, hidden_size=6, memory_size=3, num_reads=2).to(D)
    with torch.no_grad():
        core.write.weight.mul_(10.0)  # large writes so that Eq. 4 rescales
    T, B = 5, 2
    x = rand(T, B, 4)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 0] = True
    with torch.no_grad():
        y, (h, c, Fm) = core(x, None, reset)
        y_manual, Fs, rescaled = manual_fwm(core, x, reset)
    torch.testing.assert_close(y, y_manual)
    torch.testing.assert_close(Fm[1], Fs[1])
    assert 0 < rescaled < T * B, "the test should exercise both branches of Eq. 4"


# ------------------------------------------------------------------------- GRU, LSTM init


def manual_gru(core, x, reset, h0):
    """torch.nn.GRU's equations (its documentation; gate order r, z, n) per step, entry, layer."""
    T, B, _ = x.shape
    H, L = core.hidden_size, core.num_layers
    hs = [[h0[b, layer].clone() for layer in range(L)] for b in range(B)]
    out = torch.zeros(T, B, H, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                hs[b] = [torch.zeros(H, dtype=D) for _ in range(L)]
            inp = x[t, b]
            for layer in range(L):
                w_ih, w_hh, b_ih, b_hh = (
                    getattr(core.gru, f"{n}_l{layer}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                )
                gi, gh, h = w_ih @ inp + b_ih, w_hh @ hs[b][layer] + b_hh, hs[b][layer]
                r = sigmoid(gi[:H] + gh[:H])
                z = sigmoid(gi[H : 2 * H] + gh[H : 2 * H])
                n = torch.tanh(gi[2 * H :] + r * gh[2 * H :])
                hs[b][layer] = inp = (1 - z) * n + z * h
            out[t, b] = inp
    return out, torch.stack([torch.stack(h) for h in hs])


def test_gru_core_matches_the_gru_equations():
    torch.manual_seed(0)
    core = cores.make("gru", 4, hidden_size=5, num_layers=2).to(D)
    T, B = 6, 3
    x = rand(T, B, 4)
    h0 = rand(B, 2, 5, seed=2)  # a non-zero initial state
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 1] = reset[4, 0] = True  # entry 2 never resets: h0 reaches its end
    with torch.no_grad():
        y, (h,) = core(x, (h0,), reset)
        y_manual, h_manual = manual_gru(core, x, reset, h0)
    torch.testing.assert_close(y, y_manual)
    torch.testing.assert_close(h, h_manual)
    with torch.no_grad():  # the initial state matters (the test would miss a dropped h0)
        assert (core(x, None, reset)[0][:, 2] - y[:, 2]).abs().max() > 1e-3


def _blocks(w, H):
    return w.detach().split(H, dim=0)


@pytest.mark.parametrize("name, gates", [("lstm", 4), ("gru", 3)])
def test_orthogonal_recurrent_init(name, gates):
    H, L = 6, 2
    torch.manual_seed(0)
    default = cores.make(name, 4, hidden_size=H, num_layers=L).to(D)
    torch.manual_seed(0)
    ortho = cores.make(name, 4, hidden_size=H, num_layers=L, recurrent_init="orthogonal").to(D)
    rnn = getattr(ortho, name)
    for layer in range(L):
        blocks = _blocks(getattr(rnn, f"weight_hh_l{layer}"), H)
        assert len(blocks) == gates
        for w in blocks:
            torch.testing.assert_close(w @ w.T, torch.eye(H, dtype=D), atol=1e-6, rtol=0)
    # the other parameters keep torch's init (the same random draws as the default)
    for (n, a), (_, b) in zip(default.named_parameters(), ortho.named_parameters()):
        if "weight_hh" not in n:
            torch.testing.assert_close(a, b)


def test_lstm_forget_bias_sets_the_sum_of_the_two_bias_vectors():
    H, L = 6, 2
    torch.manual_seed(0)
    default = cores.make("lstm", 4, hidden_size=H, num_layers=L).lstm
    torch.manual_seed(0)
    lstm = cores.make("lstm", 4, hidden_size=H, num_layers=L, forget_bias=1.0).lstm
    f = slice(H, 2 * H)  # torch's gate order i, f, g, o
    for layer in range(L):
        b_ih, b_hh = (getattr(lstm, f"{n}_l{layer}").detach() for n in ("bias_ih", "bias_hh"))
        torch.testing.assert_close(b_ih[f] + b_hh[f], torch.ones(H))
        assert (b_hh[f] == 0).all()
        for n in ("bias_ih", "bias_hh"):  # the input, cell and output gates: torch's init
            a, b = getattr(default, f"{n}_l{layer}"), getattr(lstm, f"{n}_l{layer}")
            torch.testing.assert_close(torch.cat([a[:H], a[2 * H :]]), torch.cat([b[:H], b[2 * H :]]))


def test_fwm_write_then_read_back_overwrite_and_rescale():
    m = 3
    e = torch.eye(m, dtype=D)
    F0 = torch.zeros(1, m, m, m, dtype=D)
    v, v2 = torch.tensor([[0.3, -0.2, 0.1]], dtype=D), torch.tensor([[-0.5, 0.4, 0.0]], dtype=D)
    one = torch.ones(1, dtype=D)
    F1 = fwm_write(F0, e[0:1], e[1:2], v, one)  # associate (e0 ⊗ e1) -> v
    torch.testing.assert_close(torch.einsum("bsrv,s,r->bv", F1, e[0], e[1]), v)
    F2 = fwm_write(F1, e[0:1], e[1:2], v2, one)  # β = 1 replaces the value
    torch.testing.assert_close(torch.einsum("bsrv,s,r->bv", F2, e[0], e[1]), v2)
    F3 = fwm_write(F2, e[2:3], e[2:3], torch.tensor([[3.0, 0.0, 4.0]], dtype=D), one)
    assert abs(F3.pow(2).sum().sqrt().item() - 1.0) < 1e-12  # Eq. 4: rescaled to norm 1
    # one chained read e0 -> (through e1) v2, layer-normalised without affine
    r = fwm_read(F2, e[0:1], e[1:2].unsqueeze(1))
    torch.testing.assert_close(r[0], layer_norm(v2[0]))


# ------------------------------------------------------------------------- feature maps


def test_dpfp_nu1_on_2d_is_the_papers_four_partial_functions():
    # Secretly-FWP Eq. 33-36: r(k1)r(k2), r(-k1)r(k2), r(k1)r(-k2), r(-k1)r(-k2)
    r = torch.relu
    for k in rand(6, 2, seed=3):
        raw = torch.stack([r(k[0]) * r(k[1]), r(-k[0]) * r(k[1]), r(k[0]) * r(-k[1]), r(-k[0]) * r(-k[1])])
        got = feature_maps.dpfp(k, nu=1)
        assert got.shape == (4,)
        expect = raw / (raw.sum() + 1e-5)
        torch.testing.assert_close(torch.sort(got).values, torch.sort(expect).values)
        assert (got > 0).sum() == 1  # one active region per quadrant


def test_dpfp_general_nu_follows_eq37():
    x = rand(5, seed=4)
    xx = torch.cat([torch.relu(x), torch.relu(-x)])
    raw = torch.stack([xx[i] * xx[(i + j) % 10] for j in (1, 2, 3) for i in range(10)])
    torch.testing.assert_close(feature_maps.dpfp(x, nu=3), raw / (raw.sum() + 1e-5))


def test_elu_sum_and_softmax_are_positive_and_sum_to_one():
    x = rand(4, 7, seed=5) * 3
    for fm in (feature_maps.elu_sum, feature_maps.softmax):
        y = fm(x)
        assert (y > 0).all()
        torch.testing.assert_close(y.sum(-1), torch.ones(4, dtype=D), atol=1e-4, rtol=0)
    torch.testing.assert_close(feature_maps.elu_sum(x[0]), elu_sum(x[0]))


def test_l2_feature_map_gives_unit_vectors_and_bounds_the_delta_rule():
    assert feature_maps.get("l2", 3)(torch.tensor([3.0, 0.0, -4.0], dtype=D)).tolist() == pytest.approx(
        [0.6, 0.0, -0.8], abs=1e-6
    )
    # the delta rule (Secretly-FWP Eq. 24, β = 1) with unit keys replaces what k read by v:
    # W' k = v, and |W'|_F² = |W|_F² - |W k|² + |v|²; a sum-normalised key (|k| < 1) does not
    phi = feature_maps.get("l2", 4)
    W = torch.zeros(4, 4, dtype=D)
    for step in range(20):
        k, v = phi(rand(4, seed=100 + step)), rand(4, seed=200 + step)
        W2 = W + outer(v - W @ k, k)
        torch.testing.assert_close(W2 @ k, v, atol=1e-5, rtol=0)  # |k|² = 1 - 1e-6 / |x|²
        torch.testing.assert_close(
            W2.square().sum(), W.square().sum() - (W @ k).square().sum() + v.square().sum(), atol=1e-4, rtol=0
        )
        W = W2
    k = feature_maps.softmax(rand(4, seed=300))
    W2 = W + outer(rand(4, seed=301) - W @ k, k)
    assert not torch.allclose(W2 @ k, rand(4, seed=301), atol=1e-3)


# ------------------------------------------------------------------------- hand-checkable ops


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_delta_rule_and_sum_rule_by_hand(backend):
    # β = 1, one-hot keys: write (k, v), read k -> v; overwrite (k, v2) -> v2 (delta);
    # the sum rule gives v + v2 (lt). Through ops.get, so it also checks a built kernel.
    e = torch.eye(4, dtype=torch.float32)
    v = torch.tensor([1.0, -2.0, 0.5, 3.0])
    v2 = torch.tensor([0.0, 4.0, -1.0, 2.0])
    k = torch.stack([e[2], e[2]]).view(2, 1, 1, 4)
    vals = torch.stack([v, v2]).view(2, 1, 1, 4)
    W0 = torch.zeros(1, 1, 4, 4)
    y, _ = ops.get("delta", backend)(k, k, vals, torch.ones(2, 1, 1), W0, None)
    torch.testing.assert_close(y[0, 0, 0], v)
    torch.testing.assert_close(y[1, 0, 0], v2)
    y, _ = ops.get("lt", backend)(k, k, vals, W0, None)
    torch.testing.assert_close(y[1, 0, 0], v + v2)
