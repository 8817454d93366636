"""``ffm`` (Fast and Forgetful Memory, Morad et al., NeurIPS 2023): the aggregator against numbers
worked out by hand and against the plain loop of its recurrence; the whole core against the
paper's cell written out per step and per batch entry (sharing no code with rfwp_rl.cores.ffm,
only its weights); initialisation, options, errors, parameter counts, presets in every trainer.
"""

from __future__ import annotations

import math

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.cores.ffm import FASTEST_DECAY, aggregate
from rfwp_rl.errors import UserError

D = torch.float64
C = torch.complex128
IN = 5


def rand(*shape, seed=1, dtype=D):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------- the aggregator


def test_aggregator_by_hand():
    # one trace (m = 1) decaying by 0.5 per step, two oscillations (c = 2): ω = 0 and ω = π/2,
    # so γ = (0.5, 0.5 i): the second column turns by a quarter turn per step
    core = cores.make("ffm", 2, hidden_size=2, memory_size=1, context_size=2).to(D)
    with torch.no_grad():
        core.cells[0].alpha.fill_(-math.log(2.0))  # -|α| = -ln 2 whatever α's sign
        core.cells[0].omega.copy_(torch.tensor([0.0, math.pi / 2]))
    gamma = core.cells[0].gamma(C)
    torch.testing.assert_close(gamma, torch.tensor([[0.5, 0.5j]], dtype=C))

    x = torch.tensor([[1.0, 1.0], [2.0, 2.0], [0.0, 4.0]], dtype=D).view(3, 2, 1)  # [T, B, m]
    S0 = torch.tensor([[[0.0, 0.0]], [[2.0, 2.0j]]], dtype=C)  # [B, m, c]
    reset = torch.tensor([[False, False], [False, False], [False, True]])
    S, last = aggregate(x, gamma, S0, reset)
    # entry 0 from zero: S1 = (1, 1); S2 = (0.5·1 + 2, 0.5i·1 + 2) = (2.5, 2 + 0.5i);
    #   S3 = (0.5·2.5, 0.5i·(2 + 0.5i)) = (1.25, -0.25 + i)
    # entry 1 from (2, 2i): S1 = (0.5·2 + 1, 0.5i·2i + 1) = (2, 0); S2 = (0.5·2 + 2, 0 + 2) = (3, 2);
    #   reset before step 2: S3 = (4, 4)
    expect = torch.tensor([[[1, 1], [2, 0]], [[2.5, 2 + 0.5j], [3, 2]], [[1.25, -0.25 + 1j], [4, 4]]], dtype=C).view(
        3, 2, 1, 2
    )
    torch.testing.assert_close(S, expect)
    torch.testing.assert_close(last, expect[-1])


def loop_aggregator(x, gamma, S0, reset):
    """S_t = γ ⊙ S_{t-1} + x_t 1_cᵀ one step at a time (the FFM paper's aggregator), zero before
    a reset: x [T, B, m], gamma [m, c], S0 [B, m, c] -> S [T, B, m, c]."""
    T, B, _ = x.shape
    out = []
    for t in range(T):
        rows = []
        for b in range(B):
            s = torch.zeros_like(S0[b]) if reset[t, b] else (S0[b] if t == 0 else out[-1][b])
            rows.append(gamma * s + x[t, b][:, None])
        out.append(torch.stack(rows))
    return torch.stack(out)


@pytest.mark.parametrize("T", [1, 2, 7, 13])
def test_aggregator_matches_the_loop_values_and_gradients(T):
    m, c, B = 3, 4, 3
    alpha = (0.3 * rand(m, seed=2)).requires_grad_()
    omega = rand(c, seed=3).requires_grad_()
    x = rand(T, B, m, seed=4).requires_grad_()
    S0r, S0i = rand(B, m, c, seed=5).requires_grad_(), rand(B, m, c, seed=6).requires_grad_()
    reset = torch.zeros(T, B, dtype=torch.bool)
    if T > 2:
        reset[2, 0] = reset[T - 1, 1] = True
    w = rand(T, B, m, c, 2, seed=7)
    leaves = [alpha, omega, x, S0r, S0i]
    results = []
    for fn in (aggregate, loop_aggregator):
        gamma = torch.exp(torch.complex(-alpha.abs()[:, None].expand(m, c), omega[None, :].expand(m, c)))
        S = fn(x, gamma, torch.complex(S0r, S0i), reset)
        S = S[0] if isinstance(S, tuple) else S
        grads = torch.autograd.grad((torch.view_as_real(S) * w).sum(), leaves)
        results.append((S.detach(), grads))
    (S_scan, g_scan), (S_loop, g_loop) = results
    torch.testing.assert_close(S_scan, S_loop)
    for a, b in zip(g_scan, g_loop):
        torch.testing.assert_close(a, b)
    assert all(g.abs().max() > 0 for g in g_loop)  # every leaf reaches the loss


# ------------------------------------------------------------------------- the cell, by hand


def sigmoid(v):
    return 1 / (1 + torch.exp(-v))


def layer_norm(v, eps=1e-5):  # no gain or bias
    mu = v.mean()
    return (v - mu) / torch.sqrt(((v - mu) ** 2).mean() + eps)


def manual_ffm(core, x, reset, state):
    """The FFM cell (the FFM paper) per step, batch entry and cell, with explicit complex numbers:
    x̃ = ℓ1(x) ⊙ σ(ℓ2(x)); S_jk ← exp(-|α_j| + iω_k) S_jk + x̃_j; z = ℓ3([Re S_jk, Im S_jk] for every
    j, k); y = LN(z) ⊙ σ(ℓ4(x)) + ℓ5(x) ⊙ (1 - σ(ℓ4(x))). ℓ1, ℓ2, ℓ4, ℓ5 are the row blocks of
    ``pre`` in that order."""
    T, B, _ = x.shape
    S = [[torch.complex(s[b, ..., 0], s[b, ..., 1]) for s in state] for b in range(B)]
    ys = []
    for t in range(T):
        row = []
        for b in range(B):
            h = x[t, b]
            for i, cell in enumerate(core.cells):
                m, c, H = cell.m, cell.c, cell.h
                W, bias = cell.pre.weight, cell.pre.bias
                l1 = W[:m] @ h + bias[:m]
                l2 = W[m : 2 * m] @ h + bias[m : 2 * m]
                l4 = W[2 * m : 2 * m + H] @ h + bias[2 * m : 2 * m + H]
                l5 = W[2 * m + H :] @ h + bias[2 * m + H :]
                x_tilde = l1 * sigmoid(l2)
                prev = torch.zeros_like(S[b][i]) if reset[t, b] else S[b][i]
                new = []
                for j in range(m):
                    for k in range(c):
                        g = torch.exp(torch.complex(-cell.alpha[j].abs(), cell.omega[k]))
                        new.append(g * prev[j, k] + x_tilde[j])
                S[b][i] = torch.stack(new).view(m, c)
                flat = torch.stack([v for s in S[b][i].flatten() for v in (s.real, s.imag)])
                z = cell.mix.weight @ flat + cell.mix.bias
                gate = sigmoid(l4)
                h = layer_norm(z) * gate + l5 * (1 - gate)
            row.append(h)
        ys.append(torch.stack(row))
    final = tuple(torch.stack([torch.view_as_real(S[b][i]) for b in range(B)]) for i in range(len(core.cells)))
    return torch.stack(ys), final


def test_core_matches_the_papers_cell_values_and_gradients():
    torch.manual_seed(0)
    core = cores.make("ffm", IN, hidden_size=4, memory_size=3, context_size=2, num_layers=2).to(D)
    T, B = 5, 2
    x = rand(T, B, IN, seed=11).requires_grad_()
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 1] = True
    state = tuple((0.5 * rand(*s.shape, seed=12 + i)).requires_grad_() for i, s in enumerate(core.initial_state(B)))
    w = rand(T, B, 4, seed=20)
    leaves = [x, *state, *core.parameters()]
    results = []
    for fn in (core, lambda x_, r, s: manual_ffm(core, x_, r, s)):
        y, final = fn(x, reset, state) if fn is not core else core(x, state, reset)
        loss = (y * w).sum() + sum((s * rand(*s.shape, seed=30 + i)).sum() for i, s in enumerate(final))
        results.append((y.detach(), [s.detach() for s in final], torch.autograd.grad(loss, leaves)))
    (y_core, s_core, g_core), (y_hand, s_hand, g_hand) = results
    torch.testing.assert_close(y_core, y_hand)
    for a, b in zip(s_core, s_hand):
        torch.testing.assert_close(a, b)
    for a, b in zip(g_core, g_hand):
        torch.testing.assert_close(a, b)


def test_one_step_is_the_plain_recurrence():
    # T = 1 (acting): S = γ S0 + x̃ 1ᵀ, read out by the cell
    torch.manual_seed(0)
    core = cores.make("ffm", IN, hidden_size=4, memory_size=3, context_size=2).to(D)
    cell = core.cells[0]
    x, S0 = rand(1, 2, IN, seed=3), 0.5 * rand(2, 3, 2, 2, seed=4)
    y, (S,) = core(x, (S0,))
    pre, gin, _, _ = cell.pre(x[0]).split([3, 3, 4, 4], dim=-1)
    expect = cell.gamma(C) * torch.view_as_complex(S0) + (pre * torch.sigmoid(gin))[..., None]
    torch.testing.assert_close(S, torch.view_as_real(expect))


# ------------------------------------------------------------------------- initialisation, options, errors


def test_initial_decays_and_periods_span_the_horizons():
    core = cores.make("ffm", IN, memory_size=8, context_size=5)  # min_period 1, max_period 1024
    cell = core.cells[0]
    decay = torch.exp(-cell.alpha.detach().abs().double())
    # evenly spaced rates: the fastest trace halves in about a step, the slowest keeps 1% after 1024 steps
    torch.testing.assert_close(decay[0].item(), math.exp(-(math.log(2) - 0.02)))
    torch.testing.assert_close(decay[-1].item() ** 1024, 0.01, rtol=1e-4, atol=0)
    rates = cell.alpha.detach().double()
    assert torch.allclose(rates[1:] - rates[:-1], (rates[1] - rates[0]).expand(7), atol=1e-6)
    periods = 2 * math.pi / cell.omega.detach().double()
    torch.testing.assert_close(periods, torch.linspace(1, 1024, 5, dtype=D))
    # shorter horizons: the slowest trace keeps 1% after 100 steps, periods from 2 to 100
    cell = cores.make("ffm", IN, memory_size=4, context_size=3, min_period=2, max_period=100).cells[0]
    torch.testing.assert_close(torch.exp(-cell.alpha[-1].double()).item() ** 100, 0.01, rtol=1e-4, atol=0)
    torch.testing.assert_close(2 * math.pi / cell.omega.double(), torch.tensor([2.0, 51.0, 100.0], dtype=D))
    # a horizon shorter than the fastest trace: every trace starts at the fastest rate
    cell = cores.make("ffm", IN, memory_size=3, max_period=2).cells[0]
    torch.testing.assert_close(cell.alpha.double(), torch.full((3,), FASTEST_DECAY, dtype=D))


def test_defaults_state_layout_and_parameter_count():
    spec = cores.available()["ffm"]
    assert spec.defaults == {
        "hidden_size": 256,
        "memory_size": 32,
        "context_size": 4,
        "num_layers": 1,
        "min_period": 1,
        "max_period": 1024,
        "detach_state_every_step": False,
    }
    core = cores.make("ffm", 257)
    assert core.output_size == 256 and core.state_shapes(3) == [(3, 32, 4, 2)]
    # pre 257 -> 2·32 + 2·256 with bias; mix 2·32·4 -> 256 with bias; α 32; ω 4
    assert sum(p.numel() for p in core.parameters()) == 257 * 576 + 576 + 256 * 256 + 256 + 32 + 4
    two = cores.make("ffm", 7, hidden_size=6, memory_size=3, context_size=2, num_layers=2)
    assert two.state_shapes(1) == [(1, 3, 2, 2)] * 2
    per_cell = lambda n_in: n_in * 18 + 18 + 12 * 6 + 6 + 3 + 2  # noqa: E731
    assert sum(p.numel() for p in two.parameters()) == per_cell(7) + per_cell(6)
    assert two.config == {**spec.defaults, "hidden_size": 6, "memory_size": 3, "context_size": 2, "num_layers": 2}


def _err(match, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        cores.make("ffm", *args, **kw)
    assert "\n" not in str(info.value)


def test_config_errors_are_one_line():
    _err(r"memory_size 0 is invalid; allowed: an integer >= 1", IN, memory_size=0)
    _err(r"context_size -1 is invalid; allowed: an integer >= 1", IN, context_size=-1)
    _err(r"hidden_size 0 is invalid", IN, hidden_size=0)
    _err(r"num_layers 0 is invalid", IN, num_layers=0)
    _err(r"min_period 0 is invalid; allowed: an integer >= 1", IN, min_period=0)
    _err(r"max_period 4 is invalid; allowed: an integer >= min_period \(8\)", IN, min_period=8, max_period=4)
    _err(r"max_period=1.5 has type float; allowed: int", IN, max_period=1.5)
    _err(r"detach_state_every_step='yes' has type str; allowed: bool", IN, detach_state_every_step="yes")
    _err(r"unknown config key 'num_heads' for core 'ffm'", IN, num_heads=4)


def test_bf16_autocast_keeps_the_aggregator_in_float32():
    torch.manual_seed(0)
    core = cores.make("ffm", IN, hidden_size=8, memory_size=4, context_size=2)
    x = torch.randn(6, 2, IN)
    y_ref, (s_ref,) = core(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, (s,) = core(x)
    assert s.dtype == torch.float32 and torch.isfinite(y).all()
    torch.testing.assert_close(s, s_ref, atol=0.05, rtol=0.05)
    torch.testing.assert_close(y.float(), y_ref, atol=0.1, rtol=0.1)


# ------------------------------------------------------------------------- presets, in every trainer

VECTOR_PRESET = 215_145
"""agents/vector_ffm.toml with a 9-float observation and 4 actions (+1,601 per further action:
its one-hot in the core's input, 2·32 + 2·512 weights, and a policy row of 512 + 1)."""
ATARI_PRESET = (1_601_141, 641)
"""agents/atari_ffm.toml: base + per-action parameters (LSTM baseline: 1,616,849 + 257 A)."""


def test_vector_preset_in_the_impala_agent():
    from rfwp_rl.agent import Agent, count_parameters
    from rfwp_rl.presets import resolve_preset

    preset = resolve_preset("ffm", None, kind="vector")
    torch.manual_seed(0)
    agent = Agent((9,), 4, "ffm", core_config=preset.core_config, agent_config=preset.agent)
    assert count_parameters(agent) == VECTOR_PRESET
    five = Agent((9,), 5, "ffm", core_config=preset.core_config, agent_config=preset.agent)
    assert count_parameters(five) == VECTOR_PRESET + 1_601


@pytest.mark.parametrize("num_actions", [6, 18])
def test_atari_preset_parameter_count(num_actions):
    from rfwp_rl.agent import ATARI_OBS_SHAPE, build_agent, count_parameters
    from rfwp_rl.presets import load_preset

    with torch.device("meta"):
        agent = build_agent(load_preset("atari_ffm"), ATARI_OBS_SHAPE, num_actions)
    base, per_action = ATARI_PRESET
    assert count_parameters(agent) == base + per_action * num_actions
