"""The ``mamba`` core against the Mamba paper's equations (Gu & Dao 2023: Eq. 2a-2b with Eq. 4's
Ā and B̄ = ΔB, Algorithm 2, the Sec. 3.4 block), written out step by step with explicit scalars
per step, batch entry, layer, channel and state index, sharing no code with rfwp_rl.cores or
rfwp_rl.ops (only the weights are taken from the module under test); its initialisation,
options, parameter counts, errors and presets, and the trainers' models built on it.
"""

from __future__ import annotations

import math

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.errors import UserError
from test_cores_equations import rand, sigmoid

D = torch.float64
IN = 5


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return math.log1p(math.exp(x))


def rms_norm(x, weight):  # the blocks' pre-norm and the final norm, eps 1e-5
    return x / torch.sqrt((x * x).mean() + 1e-5) * weight


def manual_mamba(core, x, reset, state0):
    """Per step, entry and layer: x + Mamba(RMSNorm(x)) (Sec. 3.4), the conv from an explicit
    window of the last K inputs, the selective SSM one channel and state index at a time."""
    T, B, _ = x.shape
    mixers = core.mixers
    L, n_state = len(mixers), 2 if mixers[0].conv is not None else 1
    Di, N, R, K = mixers[0].d_inner, mixers[0].N, mixers[0].R, mixers[0].K

    def layer_state(b, layer):
        h = state0[layer * n_state][b].clone()
        hist = [state0[layer * n_state + 1][b, j].clone() for j in range(K - 1)] if K else []
        return {"h": h, "hist": hist}

    def zero_state():
        return {"h": torch.zeros(Di, N, dtype=D), "hist": [torch.zeros(Di, dtype=D) for _ in range(K - 1)]}

    states = [[layer_state(b, layer) for layer in range(L)] for b in range(B)]
    out = torch.zeros(T, B, core.output_size, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:  # zero h and the convolution's past inputs
                states[b] = [zero_state() for _ in range(L)]
            h = core.input_proj.weight @ x[t, b] + core.input_proj.bias
            for layer in range(L):
                m, st = mixers[layer], states[b][layer]
                xz = m.in_proj.weight @ rms_norm(h, core.norms[layer].weight)
                u, z = xz[:Di], xz[Di:]
                if K:  # causal depthwise conv: window[k] is the input of step t - (K - 1) + k
                    window = [*st["hist"], u]
                    conv = torch.stack(
                        [
                            sum(m.conv.weight[c, 0, k] * window[k][c] for k in range(K)) + m.conv.bias[c]
                            for c in range(Di)
                        ]
                    )
                    st["hist"] = window[1:]
                    u = conv
                u = silu(u)
                p = m.x_proj.weight @ u
                dt, Bt, Ct = p[:R], p[R : R + N], p[R + N :]  # Algorithm 2: s_Δ (rank R), s_B, s_C
                y = torch.zeros(Di, dtype=D)
                for d in range(Di):
                    delta = softplus(float(m.dt_proj.weight[d] @ dt + m.dt_proj.bias[d]))  # τ_Δ = softplus
                    for n in range(N):
                        A = -math.exp(float(m.A_log[d, n]))
                        # Eq. 2a with Ā = exp(ΔA) (Eq. 4) and B̄ = ΔB
                        st["h"][d, n] = math.exp(delta * A) * st["h"][d, n] + delta * Bt[n] * u[d]
                        y[d] = y[d] + Ct[n] * st["h"][d, n]  # Eq. 2b
                    y[d] = y[d] + m.D[d] * u[d]  # D skip
                h = h + m.out_proj.weight @ (y * silu(z))  # gate, out_proj, residual
            out[t, b] = rms_norm(h, core.norm_f.weight)
    return out, states


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"backend": "reference"},
        {"conv_size": 0},
        {"conv_size": 3, "dt_rank": 2, "expand": 1, "chunk_size": 2, "scan": "parallel", "backend": "reference"},
    ],
)
def test_mamba_core_matches_the_papers_equations(options):
    torch.manual_seed(0)
    core = cores.make("mamba", IN, hidden_size=8, num_layers=2, state_size=3, **options).to(D)
    with torch.no_grad():  # norm gains and D away from 1, Δ larger, so that each is checked
        for i, p in enumerate((*core.norms, core.norm_f)):
            p.weight.add_(0.2 * rand(*p.weight.shape, seed=10 + i))
        for i, m in enumerate(core.mixers):
            m.D.add_(0.3 * rand(*m.D.shape, seed=20 + i))
            m.dt_proj.bias.add_(3.0)
    T, B = 5, 2
    x = rand(T, B, IN)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 1] = True
    state0 = tuple(0.5 * rand(*s.shape, seed=30 + i) for i, s in enumerate(core.initial_state(B)))
    with torch.no_grad():
        y, state = core(x, state0, reset)
        y_manual, st = manual_mamba(core, x, reset, state0)
    torch.testing.assert_close(y, y_manual)
    n_state = 2 if core.mixers[0].conv is not None else 1
    for b in range(B):
        for layer in range(2):
            torch.testing.assert_close(state[layer * n_state][b], st[b][layer]["h"])
            if n_state == 2:
                torch.testing.assert_close(state[layer * n_state + 1][b], torch.stack(st[b][layer]["hist"]))


def test_initialisation_follows_the_authors_code():
    torch.manual_seed(0)
    core = cores.make("mamba", IN, hidden_size=40, num_layers=4, state_size=5)
    m = core.mixers[0]
    assert m.d_inner == 80 and m.R == 3  # expand 2; dt_rank auto = ceil(40 / 16)
    # S4D-real (Sec. 3.6): A[d, n] = -(n + 1) for every channel
    torch.testing.assert_close(-torch.exp(m.A_log), -torch.arange(1.0, 6.0).repeat(80, 1))
    torch.testing.assert_close(m.D, torch.ones(80))
    dt = torch.nn.functional.softplus(m.dt_proj.bias)  # Δ at a zero input: log-uniform in [1e-3, 0.1]
    assert 1e-3 - 1e-9 <= dt.min() and dt.max() <= 0.1 + 1e-9 and dt.max() / dt.min() > 10
    assert m.dt_proj.weight.abs().max() <= 3**-0.5
    # out_proj divided by sqrt(num_layers): within torch's default bound 1/sqrt(fan_in), over 2
    assert m.out_proj.weight.abs().max() <= 80**-0.5 / 2
    assert m.in_proj.bias is None and m.x_proj.bias is None and m.out_proj.bias is None
    assert m.conv.bias is not None
    assert cores.make("mamba", IN, hidden_size=40, dt_rank=7).mixers[0].R == 7
    wide = cores.make("mamba", IN, hidden_size=40, dt_min=0.01, dt_max=1.0).mixers[0]
    dt = torch.nn.functional.softplus(wide.dt_proj.bias)  # Δ at a zero input: log-uniform in [0.01, 1]
    assert 0.01 - 1e-7 <= dt.min() and dt.max() <= 1.0 + 1e-6 and dt.max() > 0.1


def test_parameter_counts():
    # input 257 (the Atari core input), hidden d = 128, d_inner 256, N 16, R 8, K 4, 2 layers:
    # input projection 257·128 + 128; per layer RMS gain 128, in_proj 128·512, conv 256·4 + 256,
    # x_proj 256·(8 + 32), dt_proj 8·256 + 256, A_log 256·16, D 256, out_proj 256·128; final gain 128
    layer = 128 + 128 * 512 + 256 * 5 + 256 * 40 + 8 * 256 + 256 + 256 * 16 + 256 + 256 * 128
    count = 257 * 128 + 128 + 2 * layer + 128
    assert sum(p.numel() for p in cores.make("mamba", 257).parameters()) == count
    no_conv = cores.make("mamba", 257, conv_size=0)
    assert sum(p.numel() for p in no_conv.parameters()) == count - 2 * 256 * 5


def test_state_shapes_and_defaults():
    assert cores.available()["mamba"].defaults == {
        "hidden_size": 128,
        "num_layers": 2,
        "state_size": 16,
        "expand": 2,
        "conv_size": 4,
        "dt_rank": 0,
        "dt_min": 1e-3,
        "dt_max": 1e-1,
        "chunk_size": 0,
        "scan": "loop",
        "backend": "auto",
        "detach_state_every_step": False,
    }
    core = cores.make("mamba", 3, hidden_size=16, num_layers=2, state_size=4, expand=3, conv_size=3)
    assert core.state_shapes(5) == [(5, 48, 4), (5, 2, 48)] * 2
    assert cores.make("mamba", 3, conv_size=0, num_layers=1).state_shapes(2) == [(2, 256, 16)]
    assert core.config["expand"] == 3 and set(core.config) == set(cores.available()["mamba"].defaults)


def test_chunks_scans_and_the_fused_kernel_give_the_same_numbers():
    # the op's forms inside the core: values and gradients, with a reset and a non-zero state
    out = []
    forms = ({}, {"chunk_size": 3}, {"scan": "parallel"}, {"chunk_size": 4, "scan": "parallel"})
    for options in ({"backend": "auto"}, *({**f, "backend": "reference"} for f in forms)):
        torch.manual_seed(0)
        core = cores.make("mamba", IN, hidden_size=8, state_size=3, **options).to(D)
        x = rand(7, 2, IN).requires_grad_()
        reset = torch.zeros(7, 2, dtype=torch.bool)
        reset[4, 0] = True
        state0 = tuple((0.1 * rand(*s.shape, seed=3 + i)).requires_grad_() for i, s in enumerate(core.initial_state(2)))
        y, state = core(x, state0, reset)
        (y.sum() + sum((s * s).sum() for s in state)).backward()
        out.append([y, *state, x.grad, *(s.grad for s in state0), *(p.grad for p in core.parameters())])
    for other in out[1:]:
        for a, b in zip(other, out[0]):
            torch.testing.assert_close(a, b)


def _err(match, fn, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)


def test_option_errors_are_one_line():
    make = cores.make
    _err(
        r"conv_size 1 is invalid; allowed: 0 \(no short convolution\) or an integer >= 2", make, "mamba", 4, conv_size=1
    )
    _err(r"state_size 0 is invalid; allowed: an integer >= 1", make, "mamba", 4, state_size=0)
    _err(r"expand 0 is invalid; allowed: an integer >= 1", make, "mamba", 4, expand=0)
    _err(r"expand=1.5 has type float; allowed: int", make, "mamba", 4, expand=1.5)
    _err(
        r"dt_rank -1 is invalid; allowed: 0 \(ceil\(hidden_size / 16\)\) or an integer >= 1",
        make,
        "mamba",
        4,
        dt_rank=-1,
    )
    _err(r"dt_rank='auto' has type str; allowed: int \(default 0\)", make, "mamba", 4, dt_rank="auto")
    _err(r"chunk_size -4 is invalid; allowed: 0 \(the whole unroll", make, "mamba", 4, chunk_size=-4)
    _err(r"unknown scan 'paralel'; did you mean 'parallel'", make, "mamba", 4, scan="paralel")
    _err(r"unknown backend 'cuda'", make, "mamba", 4, backend="cuda")
    bad_range = r"dt_min 0.1, dt_max 0.01 are invalid; allowed: 0 < dt_min <= dt_max"
    _err(bad_range, make, "mamba", 4, dt_min=0.1, dt_max=0.01)
    _err(r"dt_min 0, dt_max 0.1 are invalid", make, "mamba", 4, dt_min=0)
    _err(r"num_layers 0 is invalid", make, "mamba", 4, num_layers=0)
    _err(r"hidden_size 0 is invalid", make, "mamba", 4, hidden_size=0)
    _err(r"unknown config key 'num_heads' for core 'mamba'", make, "mamba", 4, num_heads=4)


# ------------------------------------------------------------------------- in every trainer

PRESET_COUNTS = {"vector": (247_749 - 4 * 257, 257), "atari": (1_588_945, 129)}
"""Parameters of the agents of agents/{vector,atari}_mamba.toml: base + per action (the counts the
presets state; the comparable presets have 204,165 (vector_gru) to 248,485 (vector_delta_product),
and 1,543,761 (atari_rdn) to 1,616,849 (atari_lstm) + their per-action counts)."""


@pytest.mark.parametrize("kind, obs_shape, num_actions", [("vector", (9,), 4), ("atari", (4, 84, 84), 6)])
def test_presets_in_the_impala_agent(kind, obs_shape, num_actions):
    from rfwp_rl.agent import Agent, count_parameters
    from rfwp_rl.presets import resolve_preset

    preset = resolve_preset("mamba", None, kind=kind)
    torch.manual_seed(0)
    agent = Agent(obs_shape, num_actions, "mamba", core_config=preset.core_config, agent_config=preset.agent)
    base, per_action = PRESET_COUNTS[kind]
    assert count_parameters(agent) == base + per_action * num_actions


def test_sequence_model_adds_no_final_norm():
    from rfwp_rl.seq.model import SeqModel

    model = SeqModel("mamba", [11], 7, emb_size=8, core_config={"hidden_size": 8, "num_layers": 1, "state_size": 4})
    assert isinstance(model.norm, torch.nn.Identity)  # the core ends with its own RMSNorm
