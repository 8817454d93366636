"""The ``lru`` core (Linear Recurrent Unit, Orvieto et al., ICML 2023): one layer against a case
worked out by hand, the parallel scan against the loop, the whole block stack against the paper's
equations written out per step, entry and layer (sharing no code with rfwp_rl.cores; only the
weights are taken from the module under test), the ring initialisation (Lemma 3.2, App. A), the
presets in every trainer's model, config errors.
"""

from __future__ import annotations

import math

import pytest
import torch

import rfwp_rl.cores.lru as lru_module
from rfwp_rl import cores
from rfwp_rl.cores.lru import LRULayer
from rfwp_rl.errors import UserError
from rfwp_rl.ops.diagonal_scan import naive
from test_cores_equations import layer_norm, rand, sigmoid

D = torch.float64
IN = 5


def gelu(x):  # exact GELU: x Φ(x)
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _perturb_norms(core):
    """LayerNorm gains and biases away from (1, 0) so that they are checked too."""
    with torch.no_grad():
        for i, (name, p) in enumerate(core.named_parameters()):
            if "norm" in name:
                p.add_(0.1 * rand(*p.shape, seed=40 + i))


# ------------------------------------------------------------------------- one layer by hand


def _hand_layer() -> LRULayer:
    """N = H = 1: λ = 0.5 e^{iπ/2} = 0.5i, γ = 2, B = 1 + i, C = 2 - i, D = 3."""
    layer = LRULayer(1, 1, 0.0, 1.0, 6.28).to(D)
    with torch.no_grad():
        layer.nu_log.fill_(math.log(math.log(2.0)))  # exp(-ν) = 1/2
        layer.theta_log.fill_(math.log(math.pi / 2))  # θ = π/2
        layer.gamma_log.fill_(math.log(2.0))
        layer.B_re.fill_(1.0)
        layer.B_im.fill_(1.0)
        layer.C_re.fill_(2.0)
        layer.C_im.fill_(-1.0)
        layer.D.fill_(3.0)
    return layer


def test_one_layer_matches_a_case_worked_out_by_hand():
    # x_k = 0.5i x_{k-1} + 2 (1 + i) u_k; y_k = Re((2 - i) x_k) + 3 u_k; u = (1, 2, 0) for both entries.
    # entry 0, x_{-1} = 0:  x = 2+2i,  0.5i(2+2i) + 4+4i = 3+5i,  0.5i(3+5i) = -2.5+1.5i
    #   y = Re(4+4i-2i+2) + 3 = 9,  Re(6+10i-3i+5) + 6 = 17,  Re(-5+3i+2.5i-1.5i²) = -3.5
    # entry 1, x_{-1} = 2, reset before step 1:  x = 0.5i·2 + 2+2i = 2+3i,  then 0 + 4+4i,  0.5i(4+4i) = -2+2i
    #   y = Re(4+6i-2i+3) + 3 = 10,  Re(8+8i-4i+4) + 6 = 18,  Re(-4+4i+2i+2) = -2
    layer = _hand_layer()
    u = torch.tensor([1.0, 2.0, 0.0], dtype=D).view(3, 1, 1).expand(3, 2, 1)
    x0 = torch.tensor([[[0.0, 0.0]], [[2.0, 0.0]]], dtype=D)
    reset = torch.tensor([[False, False], [False, True], [False, False]])
    expect_y = torch.tensor([[9.0, 10.0], [17.0, 18.0], [-3.5, -2.0]], dtype=D).unsqueeze(-1)
    expect_x = torch.tensor([[[-2.5, 1.5]], [[-2.0, 2.0]]], dtype=D)
    with torch.no_grad():
        y, x = layer(u, x0, reset)  # one call: the parallel scan
        torch.testing.assert_close(y, expect_y, rtol=0, atol=1e-12)
        torch.testing.assert_close(x, expect_x, rtol=0, atol=1e-12)
        ys, s = [], x0
        for t in range(3):  # one step at a time: the plain update
            yt, s = layer(u[t : t + 1], s, reset[t : t + 1])
            ys.append(yt)
        torch.testing.assert_close(torch.cat(ys), expect_y, rtol=0, atol=1e-12)
        torch.testing.assert_close(s, expect_x, rtol=0, atol=1e-12)
        # the normalisation γ multiplies B u: with γ = 1 every state and output halves (D u aside)
        layer.gamma_log.zero_()
        y1, _ = layer(u[:1, :1], x0[:1], None)
        assert y1.item() == pytest.approx((9.0 - 3.0) / 2 + 3.0, abs=1e-12)


# ------------------------------------------------------------------------- scan against the loop


def _state0(core, B):
    return tuple((0.5 * rand(*s.shape, seed=10 + i)).requires_grad_() for i, s in enumerate(core.initial_state(B)))


def _run(core, x, state0, reset, w):
    y, state = core(x, state0, reset)
    loss = (y * w).sum() + sum((s * (i + 2.0)).sum() for i, s in enumerate(state))
    grads = torch.autograd.grad(loss, [*core.parameters(), x, *state0])
    return y.detach(), [s.detach() for s in state], grads


@pytest.mark.parametrize("T", [1, 2, 7, 16])
def test_parallel_scan_equals_the_loop_values_and_gradients(T, monkeypatch):
    torch.manual_seed(0)
    core = cores.make("lru", IN, hidden_size=6, state_size=5, num_layers=2, r_min=0.5, r_max=0.99).to(D)
    B = 3
    x = rand(T, B, IN).requires_grad_()
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[T // 2, 0] = True  # mid-sequence (before step 0 for T = 1)
    reset[T - 1, 2] = True
    state0 = _state0(core, B)  # non-zero
    w = rand(T, B, 6, seed=5)
    fast = _run(core, x, state0, reset, w)
    monkeypatch.setattr(lru_module, "diagonal_scan", naive)
    loop = _run(core, x, state0, reset, w)
    torch.testing.assert_close(fast[0], loop[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(fast[1], loop[1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert len(fast[2]) == len(loop[2])
    for a, b in zip(fast[2], loop[2]):  # parameters, input, initial state
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert fast[2][-1].abs().max() > 0  # the initial state reaches the loss


def test_acting_steps_without_the_scan(monkeypatch):
    torch.manual_seed(0)
    core = cores.make("lru", IN, hidden_size=6, state_size=4)

    def refuse(*args, **kwargs):
        raise AssertionError("one step ran the parallel scan")

    monkeypatch.setattr(lru_module, "diagonal_scan", refuse)
    stepper = core.stepper(2)
    with torch.no_grad():
        for _ in range(3):
            assert stepper.step(torch.randn(2, IN)).shape == (2, 6)
    with pytest.raises(AssertionError, match="parallel scan"):
        core(torch.randn(2, 2, IN))


# ------------------------------------------------------------------------- the paper's equations


def manual_lru_core(core, x, reset, state0):
    """LRU paper Eq. 1 without σ, §3.2-3.4 and the deep model of Fig. 1 per step, entry, layer:
    h = W_enc x + b;  per layer: z = LN(h);  s = Λ s + γ ⊙ (B z);  y = Re(C s) + D ⊙ z;
    g = GELU(y);  h = h + (W₁ g + b₁) ⊙ σ(W₂ g + b₂)."""
    T, B, _ = x.shape
    layers = list(core.layers)
    H = core.output_size
    params = []
    for block in layers:
        p = block.lru
        lam = torch.exp(-torch.exp(p.nu_log) + 1j * torch.exp(p.theta_log))
        params.append((lam, torch.exp(p.gamma_log), torch.complex(p.B_re, p.B_im), torch.complex(p.C_re, p.C_im), p.D))
    s = [[torch.complex(state0[i][b, :, 0], state0[i][b, :, 1]) for i in range(len(layers))] for b in range(B)]
    out = torch.zeros(T, B, H, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                s[b] = [torch.zeros_like(v) for v in s[b]]
            h = core.input_proj.weight @ x[t, b] + core.input_proj.bias
            for i, block in enumerate(layers):
                lam, gamma, Bc, Cc, Dr = params[i]
                z = layer_norm(h, block.norm.weight, block.norm.bias)
                s[b][i] = lam * s[b][i] + gamma * (Bc @ z.to(Bc.dtype))
                y = (Cc @ s[b][i]).real + Dr * z
                g = gelu(y)
                w1, w2 = block.glu.weight[:H], block.glu.weight[H:]
                b1, b2 = block.glu.bias[:H], block.glu.bias[H:]
                h = h + (w1 @ g + b1) * sigmoid(w2 @ g + b2)
            out[t, b] = h
    final = tuple(torch.stack([torch.view_as_real(s[b][i]) for b in range(B)]) for i in range(len(layers)))
    return out, final


def test_core_matches_the_papers_equations():
    torch.manual_seed(0)
    core = cores.make("lru", IN, hidden_size=6, state_size=4, num_layers=2, max_phase=3.0).to(D)
    _perturb_norms(core)
    T, B = 6, 3
    x = rand(T, B, IN)
    state0 = tuple(0.5 * rand(*s.shape, seed=3 + i) for i, s in enumerate(core.initial_state(B)))
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 1] = reset[4, 0] = True  # entry 2 never resets: the initial state reaches its end
    with torch.no_grad():
        y, state = core(x, state0, reset)
        y_manual, state_manual = manual_lru_core(core, x, reset, state0)
        torch.testing.assert_close(y, y_manual)
        for a, b in zip(state, state_manual):
            torch.testing.assert_close(a, b)
        # the initial state matters (the test would miss a dropped x_{-1})
        assert (core(x, None, reset)[0][:, 2] - y[:, 2]).abs().max() > 1e-3


# ------------------------------------------------------------------------- initialisation


def test_ring_initialisation_and_normalisation():
    # Lemma 3.2: λ uniform on the ring r_min <= |λ| <= r_max (uniform in area, not in radius),
    # phase uniform in [0, max_phase]; γ = sqrt(1 - |λ|²) (§3.4); App. A's Glorot B, C and N(0, 1) D
    torch.manual_seed(0)
    H, N = 64, 20_000
    layer = LRULayer(H, N, 0.4, 0.9, 1.5).to(D)
    lam = layer.eigenvalues().detach()
    r, phase = lam.abs(), torch.exp(layer.theta_log.detach())
    assert 0.4 - 1e-6 <= r.min() and r.max() <= 0.9 + 1e-6
    assert 0.0 <= phase.min() and phase.max() <= 1.5
    # P(|λ| < 0.7) = (0.49 - 0.16) / (0.81 - 0.16) = 0.508 (uniform radius would give 0.6)
    assert (r < 0.7).double().mean().item() == pytest.approx(0.33 / 0.65, abs=0.015)
    assert phase.mean().item() == pytest.approx(0.75, abs=0.015)
    torch.testing.assert_close(torch.exp(2 * layer.gamma_log.detach()), 1 - r**2, rtol=1e-5, atol=1e-7)
    for p, std in ((layer.B_re, 1 / math.sqrt(2 * H)), (layer.B_im, 1 / math.sqrt(2 * H))):
        assert p.std().item() == pytest.approx(std, rel=0.02)
    for p, std in ((layer.C_re, 1 / math.sqrt(N)), (layer.C_im, 1 / math.sqrt(N))):
        assert p.std().item() == pytest.approx(std, rel=0.02)
    # the defaults (App. A: r_min 0, r_max 1, phase up to 6.28): every parameter finite, |λ| < 1
    default = LRULayer(8, 4096, 0.0, 1.0, 6.28)
    assert all(torch.isfinite(p).all() for p in default.parameters())
    assert default.eigenvalues().abs().max() <= 1.0


def test_long_unroll_stays_bounded_at_the_default_ring():
    # |λ| < 1 and γ = sqrt(1 - |λ|²): a state driven by unit-variance inputs keeps a bounded variance
    torch.manual_seed(0)
    core = cores.make("lru", IN, hidden_size=8, state_size=16, num_layers=2)
    with torch.no_grad():
        y, state = core(torch.randn(4096, 2, IN), None)
    assert torch.isfinite(y).all() and all(torch.isfinite(s).all() for s in state)
    assert max(s.abs().max().item() for s in state) < 100.0


# ------------------------------------------------------------------------- sizes, config


def _count(core):
    return sum(p.numel() for p in core.parameters())


def test_parameter_count():
    # per layer: B, C complex (4HN), ν, θ, γ (3N), D (H), LayerNorm (2H), GLU H -> 2H with bias (2H² + 2H)
    inputs, H, N, L = 257, 128, 256, 3
    per_layer = 4 * H * N + 3 * N + H + 2 * H + 2 * H * H + 2 * H
    core = cores.make("lru", inputs, hidden_size=H, state_size=N, num_layers=L)
    assert _count(core) == (inputs + 1) * H + L * per_layer
    assert core.state_shapes(2) == [(2, N, 2)] * L


def test_spec_defaults_and_config():
    spec = cores.available()["lru"]
    assert spec.defaults == {
        "hidden_size": 128,
        "state_size": 128,
        "num_layers": 2,
        "r_min": 0.0,
        "r_max": 1.0,
        "max_phase": 6.28,
        "dropout": 0.0,
        "detach_state_every_step": False,
    }
    core = cores.make("lru", 3, r_min=0.9, r_max=0.999, max_phase=0.31)
    assert core.config == {**spec.defaults, "r_min": 0.9, "r_max": 0.999, "max_phase": 0.31}
    r = core.layers[0].lru.eigenvalues().abs()
    assert r.min() >= 0.9 - 1e-6 and r.max() <= 0.999 + 1e-6


def _err(match, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        cores.make("lru", *args, **kw)
    assert "\n" not in str(info.value)


def test_config_errors_are_one_line():
    _err(r"r_min 0.5, r_max 0.5 are invalid; allowed: 0 <= r_min < r_max <= 1", 4, r_min=0.5, r_max=0.5)
    _err(r"r_min 0.0, r_max 1.5 are invalid", 4, r_max=1.5)
    _err(r"r_min -0.1, r_max 1.0 are invalid", 4, r_min=-0.1)
    _err(r"max_phase 0 is invalid; allowed: a finite number > 0", 4, max_phase=0)
    _err(r"max_phase inf is invalid", 4, max_phase=float("inf"))
    _err(r"state_size 0 is invalid; allowed: an integer >= 1", 4, state_size=0)
    _err(r"hidden_size 0 is invalid", 4, hidden_size=0)
    _err(r"num_layers 0 is invalid", 4, num_layers=0)
    _err(r"dropout 1.0 is invalid", 4, dropout=1.0)
    _err(r"r_min='0' has type str; allowed: float", 4, r_min="0")
    _err(r"unknown config key 'num_heads' for core 'lru'", 4, num_heads=2)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    core = cores.make("lru", IN, hidden_size=8, state_size=4, dropout=0.5)
    x = torch.randn(5, 2, IN)
    core.eval()
    torch.testing.assert_close(core(x)[0], core(x)[0])
    core.train()
    assert (core(x)[0] - core(x)[0]).abs().max() > 0


# ------------------------------------------------------------------------- in every trainer

VECTOR_COUNT = 213_061
"""Parameters of the agent of agents/vector_lru.toml for a 9-float observation and 4 actions (+257
per further action)."""
ATARI_COUNT = 1_618_129
"""Parameters of the agent of agents/atari_lru.toml plus 129 per action."""


def test_presets_in_the_impala_agent():
    from rfwp_rl.agent import ATARI_OBS_SHAPE, Agent, build_agent, count_parameters
    from rfwp_rl.presets import resolve_preset

    preset = resolve_preset("lru", None, kind="vector")
    torch.manual_seed(0)
    agent = Agent((9,), 4, "lru", core_config=preset.core_config, agent_config=preset.agent)
    assert count_parameters(agent) == VECTOR_COUNT
    assert count_parameters(build_agent(preset, (9,), 5)) == VECTOR_COUNT + 257
    atari = resolve_preset("lru", None, kind="atari")
    assert atari.source.endswith("atari_lru.toml")
    with torch.device("meta"):
        for a in (4, 6):
            assert count_parameters(build_agent(atari, ATARI_OBS_SHAPE, a)) == ATARI_COUNT + 129 * a
