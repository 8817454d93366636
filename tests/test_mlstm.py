"""The ``mlstm`` op and core (xLSTM paper, Beck et al., NeurIPS 2024, Sec. 2.3 Eq. 19-27 with the
stabiliser of Eq. 15-17): the step-by-step recurrence against a case worked out by hand, the chunked
parallel form against it (values and gradients, resets, initial states, chunk sizes), the stabilised
form against the unstabilised equations, the core against the equations written out per step,
entry, layer and head, its initialisation, acting path, errors, sizes and trainers' models.
(The contract tests of tests/test_cores.py run on it as on every registered core.)
"""

from __future__ import annotations

import math

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.errors import UserError
from rfwp_rl.ops.mlstm import chunked, mlstm_chunked, mlstm_naive
from test_cores_equations import layer_norm, sigmoid

D = torch.float64
IN = 5


def rand(*shape, seed=1, dtype=D):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def inputs(T=11, B=3, H=2, dk=4, dv=3, seed=0, scale_i=2.0, dtype=D):
    """Random (q, k, v, i~, f~, C0, n0, m0): gate pre-activations spread so that the stabiliser
    moves both ways; a non-zero stabilised initial state."""
    return [
        rand(T, B, H, dk, seed=seed, dtype=dtype),
        rand(T, B, H, dk, seed=seed + 1, dtype=dtype),
        rand(T, B, H, dv, seed=seed + 2, dtype=dtype),
        scale_i * rand(T, B, H, seed=seed + 3, dtype=dtype),
        2.0 * rand(T, B, H, seed=seed + 4, dtype=dtype) + 1.0,
        rand(B, H, dv, dk, seed=seed + 5, dtype=dtype),
        rand(B, H, dk, seed=seed + 6, dtype=dtype),
        rand(B, H, seed=seed + 7, dtype=dtype),
    ]


def resets(T=11, B=3):
    """Entry 0 resets mid-chunk, entry 1 at step 0 and twice in a row, entry 2 never."""
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[5, 0] = True
    reset[0, 1] = reset[4, 1] = reset[5, 1] = True
    return reset


def _scalars(*values):
    return [torch.tensor(x, dtype=D).view(1, 1, 1, 1) for x in values]


# ------------------------------------------------------------------------- (a) by hand


def test_naive_two_steps_worked_out_by_hand():
    # one entry, one head, d_k = d_v = 1, zero initial state.
    # step 1: q = 1, k = 2, v = 3, i~ = 0, f~ = 0 (f = 1/2):
    #   m_1 = max(log 1/2 + 0, 0) = 0, i' = 1, f' = 1/2: C~ = 0/2 + 3*2 = 6, n~ = 2,
    #   normaliser max(|2*1|, e^0) = 2 (the |nᵀq| branch), h~ = 6/2 = 3.
    # step 2: q = 0.1, k = 1, v = -1, i~ = 2, f~ = log 3 (f = 3/4):
    #   m_2 = max(log 3/4 + 0, 2) = 2, i' = e^0 = 1, f' = 3/4 e^-2:
    #   C~ = 3/4 e^-2 * 6 - 1 = 4.5 e^-2 - 1, n~ = 1.5 e^-2 + 1,
    #   |n~ q| = 0.1 (1.5 e^-2 + 1) = 0.12 < e^-2 = 0.135: normaliser e^-m (the bound 1 of
    #   Eq. 21, scaled), h~ = 0.1 (4.5 e^-2 - 1) e^2 = 0.45 - 0.1 e^2.
    e2 = math.exp(-2.0)
    q = torch.tensor([1.0, 0.1], dtype=D).view(2, 1, 1, 1)
    k = torch.tensor([2.0, 1.0], dtype=D).view(2, 1, 1, 1)
    v = torch.tensor([3.0, -1.0], dtype=D).view(2, 1, 1, 1)
    i_pre = torch.tensor([0.0, 2.0], dtype=D).view(2, 1, 1)
    f_pre = torch.tensor([0.0, math.log(3.0)], dtype=D).view(2, 1, 1)
    zeros = (torch.zeros(1, 1, 1, 1, dtype=D), torch.zeros(1, 1, 1, dtype=D), torch.zeros(1, 1, dtype=D))
    expect_h = torch.tensor([3.0, 0.45 - 0.1 / e2], dtype=D)
    for op in (mlstm_naive, lambda *a: mlstm_chunked(*a, chunk_size=2)):
        h, C, n, m = op(q, k, v, i_pre, f_pre, *zeros, None)
        torch.testing.assert_close(h.flatten(), expect_h)
        torch.testing.assert_close(C.flatten(), torch.tensor([4.5 * e2 - 1.0], dtype=D))
        torch.testing.assert_close(n.flatten(), torch.tensor([1.5 * e2 + 1.0], dtype=D))
        torch.testing.assert_close(m.flatten(), torch.tensor([2.0], dtype=D))
        # a reset before step 2 forgets step 1: m_2 = max(log 3/4, 2) = 2, C~ = -1, n~ = 1,
        # normaliser max(0.1, e^-2) = e^-2, h~ = -0.1 e^2
        reset = torch.tensor([[False], [True]])
        h, C, n, m = op(q, k, v, i_pre, f_pre, *zeros, reset)
        torch.testing.assert_close(h.flatten(), torch.tensor([3.0, -0.1 / e2], dtype=D))
        torch.testing.assert_close(C.flatten(), torch.tensor([-1.0], dtype=D))
        torch.testing.assert_close(n.flatten(), torch.tensor([1.0], dtype=D))
        torch.testing.assert_close(m.flatten(), torch.tensor([2.0], dtype=D))


def test_naive_starts_from_a_stabilised_initial_state():
    # C~0 = 1, n~0 = 1, m0 = 1 (true C0 = n0 = e); q = k = v = 1, i~ = 0, f~ = 0:
    # m_1 = max(log 1/2 + 1, 0) = 1 - log 2, f' = e^(log 1/2 + 1 - m_1) = 1, i' = e^(log 2 - 1) = 2/e:
    # C~ = n~ = 1 + 2/e; h~ = C~ / max(n~, e^-m_1) = 1
    one = _scalars(1.0)[0]
    h, C, n, m = mlstm_naive(
        one, one, one, torch.zeros(1, 1, 1, dtype=D), torch.zeros(1, 1, 1, dtype=D),
        one[0], one[0, 0], torch.ones(1, 1, dtype=D), None,
    )  # fmt: skip
    torch.testing.assert_close(m.flatten(), torch.tensor([1.0 - math.log(2.0)], dtype=D))
    torch.testing.assert_close(C.flatten(), torch.tensor([1.0 + 2.0 / math.e], dtype=D))
    torch.testing.assert_close(h.flatten(), torch.tensor([1.0], dtype=D))


# ------------------------------------------------------------------------- (b) chunked = naive


def _loss(out, seed=40):
    return sum((t * rand(*t.shape, seed=seed + i)).sum() for i, t in enumerate(out))


@pytest.mark.parametrize("with_reset", [False, True], ids=["no-reset", "resets"])
@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 5, 11, 16])
def test_chunked_equals_naive_values_and_gradients(chunk_size, with_reset):
    # 11 steps: chunk sizes dividing it or not, one chunk, one longer than the unroll
    reset = resets() if with_reset else None
    results = []
    for op in (mlstm_naive, lambda *a: mlstm_chunked(*a, chunk_size=chunk_size)):
        args = [x.clone().requires_grad_() for x in inputs()]
        out = op(*args, reset)
        _loss(out).backward()
        results.append((out, [a.grad for a in args]))
    (out_n, grads_n), (out_c, grads_c) = results
    for a, b in zip(out_c, out_n):  # h, C, n, m
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads_c, grads_n):  # q, k, v, i~, f~, C0, n0, m0
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if with_reset:  # entry 1 resets at step 0: its initial state gets no gradient, entry 0's does
        assert all(float(g[1].abs().max()) == 0.0 for g in grads_c[5:])
        assert all(float(g[0].abs().max()) > 0.0 for g in grads_c[5:])


def test_chunked_gradcheck():
    args = [x.requires_grad_() for x in inputs(T=5, B=2, H=1, dk=2, dv=2, seed=3)]
    reset = torch.zeros(5, 2, dtype=torch.bool)
    reset[2, 0] = True
    assert torch.autograd.gradcheck(lambda *a: mlstm_chunked(*a, reset, chunk_size=3), args)


def test_chunked_rejects_a_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size 0 is invalid; allowed: an integer >= 1"):
        mlstm_chunked(*inputs(), None, chunk_size=0)


def test_chunked_matches_naive_where_the_unstabilised_gates_overflow():
    # i~ up to several hundred: exp(i~) is inf in float32, the stabilised forms stay finite and agree
    args = inputs(T=9, scale_i=300.0, dtype=torch.float32)
    args[4] = 30.0 * rand(9, 3, 2, seed=9, dtype=torch.float32)  # forget gates near 0 and near 1
    assert torch.isinf(torch.exp(args[3])).any()
    out_n = mlstm_naive(*args, resets(9))
    out_c = mlstm_chunked(*args, resets(9), chunk_size=4)
    for a, b in zip(out_c, out_n):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_reset_cuts_the_decay_matrix():
    # after a reset the outputs do not depend on anything before it, in one chunk
    args = inputs(T=8, B=1)
    reset = torch.zeros(8, 1, dtype=torch.bool)
    reset[3, 0] = True
    h, *_ = mlstm_chunked(*args, reset, chunk_size=8)
    changed = [a.clone() for a in args]
    for a in changed[:5]:
        a[:3] += 1.0
    for a in changed[5:]:
        a += 1.0
    h2, *_ = mlstm_chunked(*changed, reset, chunk_size=8)
    torch.testing.assert_close(h2[3:], h[3:], rtol=1e-12, atol=1e-12)
    assert (h2[:3] - h[:3]).abs().max() > 1e-3


# ------------------------------------------------------------------------- (c) stabilised = plain


def unstabilised(q, k, v, i_pre, f_pre, C0, n0, reset):
    """xLSTM Eq. 19-21, 25-26 as written, no stabiliser, per entry and head with explicit
    vectors: C = f C + i v kᵀ, n = f n + i k, h = C q / max(|nᵀq|, 1), i = exp(i~), f = σ(f~).
    Returns h and how often each branch of the normaliser was taken."""
    T, B, H, _ = q.shape
    h = torch.zeros(*v.shape, dtype=D)
    Cs, ns = C0.clone(), n0.clone()
    branches = {"n": 0, "one": 0}
    for b in range(B):
        for hd in range(H):
            C, n = C0[b, hd], n0[b, hd]
            for t in range(T):
                if reset is not None and reset[t, b]:
                    C, n = torch.zeros_like(C), torch.zeros_like(n)
                i, f = math.exp(i_pre[t, b, hd]), 1.0 / (1.0 + math.exp(-f_pre[t, b, hd]))
                C = f * C + i * torch.outer(v[t, b, hd], k[t, b, hd])
                n = f * n + i * k[t, b, hd]
                nq = float(n @ q[t, b, hd])
                branches["n" if abs(nq) > 1.0 else "one"] += 1
                h[t, b, hd] = C @ q[t, b, hd] / max(abs(nq), 1.0)
            Cs[b, hd], ns[b, hd] = C, n
    return h, Cs, ns, branches


@pytest.mark.parametrize("op", ["naive", "chunked"])
def test_stabilised_form_equals_the_unstabilised_equations(op):
    q, k, v, i_pre, f_pre, C0, n0, m0 = inputs(T=12, scale_i=3.0)
    q = 0.3 * q  # small queries: the normaliser takes its bound 1 at some steps
    reset = resets(12)
    fn = mlstm_naive if op == "naive" else (lambda *a: mlstm_chunked(*a, chunk_size=5))
    h, C, n, m = fn(q, k, v, i_pre, f_pre, C0, n0, m0, reset)
    # the stabilised state (C~, n~, m) stands for the true state (e^m C~, e^m n~)
    scale = torch.exp(m0)
    h_ref, C_ref, n_ref, branches = unstabilised(
        q, k, v, i_pre, f_pre, scale[..., None, None] * C0, scale[..., None] * n0, reset
    )
    assert branches["n"] > 0 and branches["one"] > 0  # both cases of max(|nᵀq|, 1) are covered
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.exp(m)[..., None, None] * C, C_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.exp(m)[..., None] * n, n_ref, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------- (d) the core


def manual_mlstm_core(core, x, reset):
    """The mlstm block stack per step, entry, layer and head with the unstabilised equations."""
    T, B, _ = x.shape
    layers = list(zip(core.fast_layers, core.ff_layers))
    H, d, hid = core.fast_layers[0].H, core.fast_layers[0].d, core.output_size

    def zero():
        return [[(torch.zeros(d, d, dtype=D), torch.zeros(d, dtype=D)) for _ in range(H)] for _ in layers]

    state = [zero() for _ in range(B)]
    out = torch.zeros(T, B, hid, dtype=D)
    for t in range(T):
        for b in range(B):
            if reset[t, b]:
                state[b] = zero()
            h = core.input_proj.weight @ x[t, b] + core.input_proj.bias
            for li, (mix, ffl) in enumerate(layers):
                p = mix.proj.weight @ layer_norm(h, mix.norm.weight, mix.norm.bias) + mix.proj.bias
                q, k, v, o = (p[j * hid : (j + 1) * hid] for j in range(4))
                i_pre, f_pre = p[4 * hid : 4 * hid + H], p[4 * hid + H :]
                y = torch.zeros(hid, dtype=D)
                for hd in range(H):
                    part = slice(hd * d, (hd + 1) * d)
                    kh = k[part] / math.sqrt(d)  # Eq. 23
                    i, f = torch.exp(i_pre[hd]), sigmoid(f_pre[hd])  # Eq. 25-26
                    C, n = state[b][li][hd]
                    C = f * C + i * torch.outer(v[part], kh)  # Eq. 19
                    n = f * n + i * kh  # Eq. 20
                    state[b][li][hd] = (C, n)
                    h_tilde = C @ q[part] / torch.clamp((n @ q[part]).abs(), min=1.0)  # Eq. 21
                    y[part] = sigmoid(o[part]) * h_tilde  # Eq. 21, 27
                h = h + mix.out.weight @ y
                lin1, lin2 = ffl.net[0], ffl.net[3]
                u = torch.relu(lin1.weight @ layer_norm(h, ffl.norm.weight, ffl.norm.bias) + lin1.bias)
                h = h + lin2.weight @ u + lin2.bias
            out[t, b] = h
    return out


@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_core_equals_the_equations_written_out(chunk_size):
    torch.manual_seed(0)
    core = cores.make("mlstm", IN, hidden_size=8, num_heads=2, num_layers=2, ff_size=12, chunk_size=chunk_size)
    core = core.to(D)
    with torch.no_grad():  # gate weights and norms away from their initial values, so that they count
        for i, p in enumerate(core.parameters()):
            p.add_(0.3 * rand(*p.shape, seed=20 + i))
    T, B = 7, 2
    x = rand(T, B, IN, seed=5)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[4, 1] = True
    y, _ = core(x, None, reset)
    with torch.no_grad():
        expect = manual_mlstm_core(core, x, reset)
    torch.testing.assert_close(y, expect, rtol=1e-10, atol=1e-12)


def test_initialisation_keeps_memory_at_first():
    core = cores.make("mlstm", IN, hidden_size=16, num_heads=4, num_layers=2)
    for layer in core.fast_layers:
        gates = slice(4 * 16, None)
        assert float(layer.proj.weight[gates].detach().abs().max()) == 0.0  # input-independent gates at first
        i_bias, f_bias = layer.proj.bias[gates].detach().view(2, 4)
        torch.testing.assert_close(f_bias, torch.tensor([3.0, 4.0, 5.0, 6.0]))
        assert float(i_bias.abs().max()) < 0.5 and float(i_bias.abs().min()) > 0.0
    # one head: the lower end of the range
    one = cores.make("mlstm", IN, hidden_size=8, num_heads=1, num_layers=1)
    assert float(one.fast_layers[0].proj.bias[-1].detach()) == 3.0


def test_acting_steps_with_the_recurrence_and_unrolls_with_the_chunked_form(monkeypatch):
    from rfwp_rl.cores import mlstm as core_module

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return chunked.mlstm_chunked(*args, **kwargs)

    monkeypatch.setattr(core_module, "mlstm_chunked", counting)
    core = cores.make("mlstm", IN, hidden_size=8, num_heads=2, num_layers=2, ff_size=8, chunk_size=4).to(D)
    x = rand(6, 3, IN)
    stepper = core.stepper(3)
    y_steps = torch.stack([stepper.step(x[t]) for t in range(6)])
    assert calls == []  # T == 1: the recurrent step only
    y, _ = core(x, None)
    assert calls == [6, 6]  # one chunked call per layer on the whole unroll
    torch.testing.assert_close(y_steps, y, rtol=1e-10, atol=1e-12)
    # a reset on the one-step path (no host sync: torch.where on the state)
    _, s = core(x[:2], None)
    y1, _ = core(x[2:3], s, torch.tensor([[True, False, False]]))
    torch.testing.assert_close(y1[:, :1], core(x[2:3, :1], None)[0])
    assert calls == [6, 6, 2, 2]


def test_spec_state_and_parameter_count():
    spec = cores.available()["mlstm"]
    assert spec.defaults == {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "ff_size": 512,
        "dropout": 0.0,
        "chunk_size": 32,
        "detach_state_every_step": False,
    }
    assert spec.description and "Eq. 19-27" in spec.equations
    core = cores.make("mlstm", 257)
    assert core.config == spec.defaults
    assert core.state_shapes(2) == [(2, 4, 32, 32), (2, 4, 32), (2, 4)] * 2
    # input projection; per block: LayerNorm, q/k/v/o/gates with bias, output projection, feed-forward
    block = 2 * 128 + (128 * (4 * 128 + 8) + 4 * 128 + 8) + 128 * 128 + (2 * 128 + 128 * 512 + 512 + 512 * 128 + 128)
    assert sum(p.numel() for p in core.parameters()) == 257 * 128 + 128 + 2 * block


def _err(match, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        cores.make("mlstm", *args, **kw)
    assert "\n" not in str(info.value)


def test_config_errors_are_one_line():
    _err(r"chunk_size 0 is invalid; allowed: an integer >= 1", IN, chunk_size=0)
    _err(r"chunk_size=2.5 has type float; allowed: int", IN, chunk_size=2.5)
    _err(r"hidden_size 10 is not divisible by num_heads 4", IN, hidden_size=10)
    _err(r"unknown config key 'feature_map' for core 'mlstm'", IN, feature_map="softmax")
    _err(r"unknown config key 'backend' for core 'mlstm'", IN, backend="auto")
    _err(r"dropout 1.0 is invalid", IN, dropout=1.0)


# ------------------------------------------------------------------------- in every trainer


def test_vector_preset_in_the_impala_agent():
    from rfwp_rl.agent import build_agent, count_parameters
    from rfwp_rl.presets import resolve_preset

    counts = {
        c: count_parameters(build_agent(resolve_preset(c, None, kind="vector"), (9,), 4))
        for c in ("mlstm", "gated_delta", "rdn")
    }
    # comparable with the other block-stack presets (within a few per cent)
    assert abs(counts["mlstm"] - counts["gated_delta"]) < 0.05 * counts["gated_delta"]
    assert abs(counts["mlstm"] - counts["rdn"]) < 0.05 * counts["rdn"]


def test_atari_preset_is_comparable_with_the_fast_weight_agents():
    from rfwp_rl.agent import atari_param_counts

    counts = atari_param_counts(6)
    assert counts["rdn"] < counts["mlstm"] < counts["lstm"]


def test_forget_gates_near_zero_keep_values_and_gradients_finite():
    # log f = logsigmoid(f~): finite where log(sigmoid(f~)) is -inf and its gradient NaN
    args = [x.requires_grad_() for x in inputs(T=3, B=1, H=1, dk=2, dv=2)]
    with torch.no_grad():
        args[4].fill_(-800.0)  # forget everything at every step
    for op in (mlstm_naive, lambda *a: mlstm_chunked(*a, chunk_size=2)):
        out = op(*args, None)
        h, C, n, m = out
        assert all(torch.isfinite(t).all() for t in out)
        # f = 0: the last state is the last write alone
        torch.testing.assert_close(torch.exp(m[0, 0]) * n[0, 0], torch.exp(args[3][-1, 0, 0]) * args[1][-1, 0, 0])
        grads = torch.autograd.grad(_loss(out), args)
        assert all(torch.isfinite(g).all() for g in grads)


def test_meta_rl_stepping_and_the_sequence_models_final_norm():
    from rfwp_rl.meta_rl.model import MetaRLAgent
    from rfwp_rl.seq.model import SeqModel

    config = {"hidden_size": 8, "num_heads": 2, "num_layers": 1, "ff_size": 8, "chunk_size": 2}
    stepper = MetaRLAgent("mlstm", config, obs_size=17, num_actions=3).stepper(2)
    for _ in range(3):  # steps across a chunk boundary of the unroll form
        logits, value = stepper.step(torch.randn(2, 17))
    assert logits.shape == (2, 3) and value.shape == (2,)
    model = SeqModel("mlstm", [11], 7, emb_size=8, core_config=config)
    assert isinstance(model.norm, torch.nn.LayerNorm)  # a pre-LN block stack: final norm
