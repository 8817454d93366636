"""The Householder delta-rule cores (``gated_delta``, ``delta_product``) and ``srwm`` against the papers'
equations, written out step by step with explicit vectors and matrices: per step, per batch
entry, per layer and per head, sharing no code with rfwp_rl.cores or rfwp_rl.ops (only the
weights are taken from the module under test); their options, parameter counts and errors.
"""

from __future__ import annotations

import math

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.errors import UserError
from test_cores_equations import layer_norm, rand, sigmoid, softmax

D = torch.float64
IN = 5


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return torch.log1p(torch.exp(x))


def unit(x):  # L2 normalisation of q and k (Gated DeltaNet §3.4), eps 1e-6
    return x / torch.sqrt((x * x).sum() + 1e-6)


def rms_norm(x, weight):  # the per-head output normalisation, eps 1e-5
    return x / torch.sqrt((x * x).mean() + 1e-5) * weight


def feed_forward(ffl, h):
    lin1, lin2 = ffl.net[0], ffl.net[3]
    u = torch.relu(lin1.weight @ layer_norm(h, ffl.norm.weight, ffl.norm.bias) + lin1.bias)
    return h + lin2.weight @ u + lin2.bias


def _perturb_norms(core):
    """LayerNorm / RMS gains away from (1, 0) so that they are checked too."""
    with torch.no_grad():
        for i, (name, p) in enumerate(core.named_parameters()):
            if "norm" in name:
                p.add_(0.1 * rand(*p.shape, seed=20 + i))


# ------------------------------------------------------------------------- gated_delta / delta_product


def manual_householder_core(core, x, reset):
    """Gated DeltaNet (§3.4 block, Eq. 10) or DeltaProduct (Sec. 3) per step, entry, layer, head.

    Short convolution: per channel, the last K inputs (oldest first) times the K taps; inputs
    before a reset are zero. Then SiLU, unit q and k, β (×2 with negative eigenvalues), the
    decay α = exp(-exp(A_log) softplus(a + dt_bias)) (gated), the state update as matrices,
    o = S q, RMS-normalised, gated by SiLU(g), the output projection and the FF sublayer.
    """
    gated = core.name == "gated_delta"
    T, B, _ = x.shape
    L = len(core.fast_layers)
    fl0 = core.fast_layers[0]
    H, d, n, K = fl0.H, fl0.d, fl0.n, fl0.K
    hid = H * d
    C = (1 + 2 * n) * hid
    scale = 2.0 if core.config.get("allow_negative_eigenvalues") else 1.0
    gate = core.config["output_gate"]
    eye = torch.eye(d, dtype=D)

    def fresh():
        return {
            "S": [torch.zeros(d, d, dtype=D) for _ in range(H)],
            "hist": [torch.zeros(C, dtype=D) for _ in range(max(K - 1, 0))],
        }

    state = [[fresh() for _ in range(L)] for _ in range(B)]
    out = torch.zeros(T, B, hid, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                state[b] = [fresh() for _ in range(L)]
            h = core.input_proj.weight @ x[t, b] + core.input_proj.bias
            for layer in range(L):
                fl, st = core.fast_layers[layer], state[b][layer]
                p = fl.proj.weight @ layer_norm(h, fl.norm.weight, fl.norm.bias)
                qkv, p = p[:C], p[C:]
                bb, p = p[: n * H], p[n * H :]
                a, g = (p[:H], p[H:]) if gated else (None, p)
                if K:
                    window = st["hist"] + [qkv]  # inputs t-K+1 .. t
                    qkv = sum(fl.conv.weight[:, 0, i] * window[i] for i in range(K))
                    st["hist"] = window[1:]
                qkv = silu(qkv)
                q, k, v = qkv[:hid], qkv[hid : hid + n * hid], qkv[hid + n * hid :]
                heads = []
                for hd in range(H):
                    S = st["S"][hd]
                    keys = [unit(k[(hd * n + j) * d : (hd * n + j + 1) * d]) for j in range(n)]
                    vals = [v[(hd * n + j) * d : (hd * n + j + 1) * d] for j in range(n)]
                    betas = [scale * sigmoid(bb[hd * n + j]) for j in range(n)]
                    if gated:  # Eq. 10
                        alpha = torch.exp(-torch.exp(fl.A_log[hd]) * softplus(a[hd] + fl.dt_bias[hd]))
                        S = S @ (alpha * (eye - betas[0] * torch.outer(keys[0], keys[0]))) + betas[0] * torch.outer(
                            vals[0], keys[0]
                        )
                    else:  # n Householder steps
                        for j in range(n):
                            S = S @ (eye - betas[j] * torch.outer(keys[j], keys[j])) + betas[j] * torch.outer(
                                vals[j], keys[j]
                            )
                    st["S"][hd] = S
                    o = rms_norm(S @ unit(q[hd * d : (hd + 1) * d]), fl.out_norm.weight)
                    if gate:
                        o = o * silu(g[hd * d : (hd + 1) * d])
                    heads.append(o)
                h = h + fl.out.weight @ torch.cat(heads)
                h = feed_forward(core.ff_layers[layer], h)
            out[t, b] = h
    return out, state


HOUSEHOLDER_CASES = [
    ("gated_delta", {"conv_size": 3}),
    ("gated_delta", {"conv_size": 0, "output_gate": False}),
    ("delta_product", {"num_householder": 2, "allow_negative_eigenvalues": True, "conv_size": 2}),
    ("delta_product", {"num_householder": 3, "output_gate": False}),
]


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize(
    "name,options",
    HOUSEHOLDER_CASES,
    ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in HOUSEHOLDER_CASES],
)
def test_householder_cores_match_the_papers_equations(name, options, backend):
    torch.manual_seed(0)
    core = cores.make(name, IN, hidden_size=8, num_heads=2, ff_size=12, num_layers=2, backend=backend, **options).to(D)
    _perturb_norms(core)
    T, B = 6, 2
    x = rand(T, B, IN)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[4, 1] = True  # with conv_size 3 the window at step 4 would still see steps 2, 3
    with torch.no_grad():
        y, state = core(x, None, reset)
        y_manual, st = manual_householder_core(core, x, reset)
    torch.testing.assert_close(y, y_manual)
    torch.testing.assert_close(state[0][1, 1], st[1][0]["S"][1])  # layer 0, entry 1, head 1
    if core.fast_layers[0].K > 1:  # the conv window, oldest first
        torch.testing.assert_close(state[1][0], torch.stack(st[0][0]["hist"]))


# ------------------------------------------------------------------------- srwm


def manual_srwm_core(core, x, reset):
    """SRWM paper Eq. 5-8 per step, entry, layer, head: φ = softmax of LN(h) per head,
    W = W_init + ΔW (ΔW zero at the start and after a reset) outputs [y, q, k, β] (d, d, d, 4);
    the four blocks of rows are written with their own rates σ(β)."""
    T, B, _ = x.shape
    L = len(core.fast_layers)
    H, d = core.fast_layers[0].H, core.fast_layers[0].d
    R = 3 * d + 4
    rate_of_row = [r // d if r < 3 * d else 3 for r in range(R)]

    def fresh():
        return [torch.zeros(R, d, dtype=D) for _ in range(H)]

    state = [[fresh() for _ in range(L)] for _ in range(B)]
    out = torch.zeros(T, B, H * d, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                state[b] = [fresh() for _ in range(L)]
            h = core.input_proj.weight @ x[t, b] + core.input_proj.bias
            for layer in range(L):
                fl = core.fast_layers[layer]
                z = layer_norm(h, fl.norm.weight, fl.norm.bias)
                heads = []
                for hd in range(H):
                    W = fl.W_init[hd] + state[b][layer][hd]
                    p = W @ softmax(z[hd * d : (hd + 1) * d])  # Eq. 5
                    y, q, k, beta = p[:d], softmax(p[d : 2 * d]), softmax(p[2 * d : 3 * d]), p[3 * d :]
                    v, v_bar = W @ q, W @ k  # Eq. 6, 7
                    sig = torch.stack([sigmoid(beta[rate_of_row[r]]) for r in range(R)])
                    state[b][layer][hd] = state[b][layer][hd] + torch.outer(sig * (v - v_bar), k)  # Eq. 8
                    heads.append(y)
                h = h + fl.out.weight @ torch.cat(heads)
                h = feed_forward(core.ff_layers[layer], h)
            out[t, b] = h
    return out, state


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_srwm_core_matches_the_papers_equations(backend):
    torch.manual_seed(0)
    core = cores.make("srwm", IN, hidden_size=8, num_heads=2, ff_size=12, num_layers=2, backend=backend).to(D)
    _perturb_norms(core)
    T, B = 5, 2
    x = rand(T, B, IN)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 1] = True
    with torch.no_grad():
        y, state = core(x, None, reset)
        y_manual, st = manual_srwm_core(core, x, reset)
    torch.testing.assert_close(y, y_manual)
    torch.testing.assert_close(state[1][0, 1], st[0][1][1])  # layer 1, entry 0, head 1


def test_srwm_initial_weights_are_the_slow_parameter():
    # the zero state means W = W_init: N(0, 1/d) per entry (the authors' initialisation),
    # and its gradient flows through every step
    torch.manual_seed(1)
    core = cores.make("srwm", IN, hidden_size=64, num_heads=2, ff_size=8, num_layers=1)
    W = core.fast_layers[0].W_init
    assert W.shape == (2, 3 * 32 + 4, 32)
    assert abs(W.std().item() - 1 / math.sqrt(32)) < 0.01 and abs(W.mean().item()) < 0.01
    y, _ = core(rand(4, 2, IN).float())
    y[-1].sum().backward()
    assert W.grad.abs().max() > 0


# ------------------------------------------------------------------------- sizes, options, errors


def test_parameter_counts():
    # hidden 128, 4 heads of 32, FF 512, input 257 (the Atari core input), 2 layers:
    # input projection 33,024; per layer LN 256 + FF 131,712 + LN 256 (the block) plus
    #   gated_delta: proj 128·(384 + 4 + 4 + 128) = 66,560, conv 384·4, RMS gain 32, out 16,384,
    #                A_log and dt_bias 4 + 4
    #   delta_product (n_h = 2): proj 128·(640 + 8 + 128) = 99,328, conv 640·4, 32, 16,384
    #   srwm: W_init 4·100·32 = 12,800, out 16,384 (no slow projection)
    block = 256 + 131_712 + 256
    expect = {
        "gated_delta": 33_024 + 2 * (block + 66_560 + 1_536 + 32 + 16_384 + 8),
        "delta_product": 33_024 + 2 * (block + 99_328 + 2_560 + 32 + 16_384),
        "srwm": 33_024 + 2 * (block + 12_800 + 16_384),
    }
    for name, count in expect.items():
        assert sum(p.numel() for p in cores.make(name, 257).parameters()) == count, name
    # options that change the count: no conv, no gate; more Householder steps
    small = cores.make("gated_delta", 257, conv_size=0, output_gate=False)
    assert sum(p.numel() for p in small.parameters()) == expect["gated_delta"] - 2 * (1_536 + 128 * 128)
    three = cores.make("delta_product", 257, num_householder=3)
    assert sum(p.numel() for p in three.parameters()) == expect["delta_product"] + 2 * (128 * (256 + 4) + 256 * 4)


def test_state_shapes_and_defaults():
    specs = cores.available()
    base = {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "ff_size": 512,
        "dropout": 0.0,
        "backend": "auto",
        "detach_state_every_step": False,
    }
    assert specs["gated_delta"].defaults == {**base, "conv_size": 4, "output_gate": True}
    assert specs["delta_product"].defaults == {
        **base,
        "num_householder": 2,
        "allow_negative_eigenvalues": False,
        "conv_size": 4,
        "output_gate": True,
    }
    assert specs["srwm"].defaults == {
        **base,
        "feature_map": "softmax",
        "dpfp_nu": 1,
        "qk_init_scale": 1.0,
        "input_layer_norm": True,
    }
    g = cores.make("gated_delta", 3, hidden_size=16, num_heads=2, num_layers=1, conv_size=3)
    assert g.state_shapes(5) == [(5, 2, 8, 8), (5, 2, 48)]
    assert cores.make("gated_delta", 3, conv_size=0, num_layers=1).state_shapes(2) == [(2, 4, 32, 32)]
    p = cores.make("delta_product", 3, hidden_size=16, num_heads=2, num_layers=1, num_householder=3)
    assert p.state_shapes(5) == [(5, 2, 8, 8), (5, 3, 16 * 7)]  # S is d x d whatever n_h
    s = cores.make("srwm", 3, hidden_size=16, num_heads=2, num_layers=1, feature_map="dpfp", dpfp_nu=2)
    assert s.state_shapes(5) == [(5, 2, 3 * 8 + 4, 2 * 2 * 8)]
    assert set(s.config) == set(specs["srwm"].defaults)
    assert set(p.config) == set(specs["delta_product"].defaults) and p.config["num_householder"] == 3


def test_negative_eigenvalues_double_beta():
    # allow_negative_eigenvalues: β = 2σ(·), the same weights otherwise give other outputs
    torch.manual_seed(3)
    a = cores.make("delta_product", IN, hidden_size=8, num_heads=2, num_layers=1, ff_size=4).to(D)
    b = cores.make(
        "delta_product", IN, hidden_size=8, num_heads=2, num_layers=1, ff_size=4, allow_negative_eigenvalues=True
    ).to(D)
    b.load_state_dict(a.state_dict())
    x = rand(5, 2, IN)
    assert not torch.allclose(a(x)[0], b(x)[0])
    assert a.fast_layers[0].beta_scale == 1.0 and b.fast_layers[0].beta_scale == 2.0


def _err(match, fn, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)


def test_option_errors_are_one_line():
    _err(
        r"conv_size 1 is invalid; allowed: 0 \(no short convolution\) or an integer >= 2",
        cores.make,
        "gated_delta",
        4,
        conv_size=1,
    )
    _err(r"conv_size -2 is invalid", cores.make, "delta_product", 4, conv_size=-2)
    _err(r"num_householder 0 is invalid; allowed: an integer >= 1", cores.make, "delta_product", 4, num_householder=0)
    _err(
        r"allow_negative_eigenvalues='yes' has type str; allowed: bool",
        cores.make,
        "delta_product",
        4,
        allow_negative_eigenvalues="yes",
    )
    _err(r"output_gate=1 has type int; allowed: bool", cores.make, "gated_delta", 4, output_gate=1)
    _err(
        r"unknown config key 'feature_map' for core 'gated_delta'", cores.make, "gated_delta", 4, feature_map="softmax"
    )
    _err(r"unknown feature_map 'relu'", cores.make, "srwm", 4, feature_map="relu")
    _err(r"hidden_size 10 is not divisible by num_heads 4", cores.make, "srwm", 4, hidden_size=10)
    _err(
        r"backend 'kernel' cannot run op 'srwm' at key size 32, value size 32: srwm with feature "
        r"map 'elu_sum' \(the fused kernel implements softmax only\)",
        cores.make,
        "srwm",
        4,
        feature_map="elu_sum",
        backend="kernel",
    )


# ------------------------------------------------------------------------- in every trainer

VECTOR_PRESETS = {"gated_delta": 231_149, "delta_product": 248_485}
"""Parameters of the agents of agents/vector_<core>.toml for a 9-float observation and 4
actions (+257 per further action); the other vector presets have 207,749 (lstm) to 245,957
(delta_rnn)."""


@pytest.mark.parametrize("name", sorted(VECTOR_PRESETS))
def test_vector_presets_in_the_impala_agent(name):
    from rfwp_rl.agent import Agent, count_parameters
    from rfwp_rl.presets import resolve_preset

    preset = resolve_preset(name, None, kind="vector")
    torch.manual_seed(0)
    agent = Agent((9,), 4, name, core_config=preset.core_config, agent_config=preset.agent)
    assert count_parameters(agent) == VECTOR_PRESETS[name]
    assert (
        count_parameters(Agent((9,), 5, name, core_config=preset.core_config, agent_config=preset.agent))
        == VECTOR_PRESETS[name] + 257
    )


@pytest.mark.parametrize("name", sorted(VECTOR_PRESETS))
def test_meta_rl_and_sequence_models_build_and_step(name):
    from rfwp_rl.meta_rl.model import MetaRLAgent
    from rfwp_rl.seq.model import SeqModel

    config = {"hidden_size": 8, "num_heads": 2, "num_layers": 1, "ff_size": 8}
    agent = MetaRLAgent(name, config, obs_size=17, num_actions=3)
    stepper = agent.stepper(2)
    logits, value = stepper.step(torch.randn(2, 17))
    assert logits.shape == (2, 3) and value.shape == (2,)
    model = SeqModel(name, [11], 7, emb_size=8, core_config=config)
    assert isinstance(model.norm, torch.nn.LayerNorm)  # a pre-LN block stack: final norm
    logits, state = model(torch.randint(0, 11, (5, 2)))
    assert logits.shape == (5, 2, 7)
    model.loss(logits, torch.randint(0, 7, (5, 2))).backward()
    assert model.describe()["core_config"] == model.core.config


def test_srwm_qk_init_scale_scales_only_the_query_and_key_rows_of_w0():
    d = 8
    torch.manual_seed(0)
    base = cores.make("srwm", 6, hidden_size=16, num_layers=1, num_heads=2, ff_size=8)
    torch.manual_seed(0)
    scaled = cores.make("srwm", 6, hidden_size=16, num_layers=1, num_heads=2, ff_size=8, qk_init_scale=4.0)
    w0, w4 = base.fast_layers[0].W_init, scaled.fast_layers[0].W_init  # [H, 3d + 4, d]: rows y, q, k, beta
    torch.testing.assert_close(w4[:, :d], w0[:, :d])
    torch.testing.assert_close(w4[:, d : 3 * d], 4.0 * w0[:, d : 3 * d])
    torch.testing.assert_close(w4[:, 3 * d :], w0[:, 3 * d :])
    assert scaled.config["qk_init_scale"] == 4.0
    with pytest.raises(UserError, match="qk_init_scale 0 is invalid; allowed: a finite number > 0"):
        cores.make("srwm", 6, hidden_size=16, num_layers=1, num_heads=2, ff_size=8, qk_init_scale=0)


def test_srwm_input_layer_norm_off_softmaxes_the_raw_input_as_the_official_rl_code():
    torch.manual_seed(0)
    core = cores.make("srwm", 6, hidden_size=16, num_layers=1, num_heads=2, ff_size=8, input_layer_norm=False)
    sub = core.fast_layers[0]
    assert not any("fast_layers.0.norm" in k for k in core.state_dict())
    x = torch.randn(3, 2, 16)
    torch.testing.assert_close(sub.phi(sub.norm(x).view(3, 2, 2, 8)), torch.softmax(x.view(3, 2, 2, 8), dim=-1))
    with pytest.raises(UserError, match="input_layer_norm"):
        cores.make("srwm", 6, hidden_size=16, num_layers=1, num_heads=2, ff_size=8, input_layer_norm="no")
