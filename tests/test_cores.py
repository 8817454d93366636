"""The rfwp_rl.cores contract: chunking, resets, gradients, state layout, sizes, errors.

The generic contract tests run on every registered core (``rfwp_rl.cores.available()``,
including the language-modelling cores of ``rfwp_rl.cores.lm_cores``) with its small config
in ``SMALL``; a core without one fails ``test_every_registered_core_has_a_small_config``.
"""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.cores.base import Core, CoreSpec
from rfwp_rl.errors import UserError

D = torch.float64
IN = 5
BUILTIN = (
    "ff",
    "lstm",
    "gru",
    "lt",
    "delta",
    "delta_rnn",
    "rdn",
    "fwm",
    "gated_delta",
    "delta_product",
    "srwm",
    "ffm",
    "lru",
    "mlstm",
    "mamba",
)
RECURRENT = BUILTIN[1:]  # all but ff (test_the_builtin_recurrent_cores_have_state checks which have state)
FAST = ("lt", "delta", "delta_rnn", "rdn")
ALL = tuple(cores.available())  # every registered core, built-in or added by a module

# small configs so the suite stays fast: one per registered core (a new core must add one)
FW_SMALL = {"hidden_size": 8, "num_layers": 2, "num_heads": 2, "ff_size": 12}
SMALL = {
    "ff": {},
    "lstm": {"hidden_size": 6, "num_layers": 2},
    "gru": {"hidden_size": 6, "num_layers": 2},
    "fwm": {"hidden_size": 6, "memory_size": 3, "num_reads": 2},
    **{k: FW_SMALL for k in FAST},
    "delta_lstm": FW_SMALL,
    "delta_mlp": {**FW_SMALL, "fast_layers": 2},
    "delta_delta": FW_SMALL,
    "gated_delta": FW_SMALL,  # short conv of 4, output gate
    "delta_product": {**FW_SMALL, "num_householder": 2},
    "srwm": FW_SMALL,
    "ffm": {"hidden_size": 6, "memory_size": 3, "context_size": 2, "num_layers": 2},
    "lru": {"hidden_size": 6, "state_size": 4, "num_layers": 2},
    "mlstm": {**FW_SMALL, "chunk_size": 4},  # unrolls of 6 and 7 steps cross a chunk boundary
    "mamba": {"hidden_size": 8, "num_layers": 2, "state_size": 3},  # d_inner 16, conv of 4
}
# state tensors per core for its SMALL config (checked when listed)
N_STATE = {
    "ff": 0,
    "lstm": 2,
    "gru": 1,
    "fwm": 3,
    "lt": 2,
    "delta": 2,
    "delta_rnn": 6,
    "rdn": 4,
    "delta_lstm": 8,
    "delta_mlp": 4,
    "delta_delta": 4,
    "gated_delta": 4,
    "delta_product": 4,
    "srwm": 2,
    "ffm": 2,
    "lru": 2,  # x [B, N, 2] per layer
    "mlstm": 6,
    "mamba": 4,
}  # (S, conv) or (ΔW,) or (C, n, m) or (h, conv) per layer
# (core, extra config) combinations: every core as configured in SMALL, plus every feature map
VARIANTS = [(n, {}) for n in ALL] + [
    ("lt", {"feature_map": "dpfp", "dpfp_nu": 2}),
    ("delta", {"feature_map": "softmax"}),
    ("delta", {"feature_map": "dpfp"}),
    ("delta_rnn", {"feature_map": "elu_sum"}),
    ("rdn", {"feature_map": "elu_sum"}),
    ("rdn", {"feature_map": "dpfp"}),
    ("rdn", {"feature_map": "l2"}),
    ("delta_lstm", {"feature_map": "dpfp"}),
    ("delta_mlp", {"feature_map": "elu_sum", "fast_layers": 3}),
    ("delta_delta", {"feature_map": "softmax"}),
    ("delta_delta", {"feature_map": "dpfp", "dpfp_nu": 2}),
    ("gated_delta", {"conv_size": 0, "output_gate": False}),
    ("gated_delta", {"conv_size": 2}),
    ("delta_product", {"num_householder": 3, "allow_negative_eigenvalues": True}),
    ("delta_product", {"num_householder": 1, "conv_size": 0}),
    ("srwm", {"feature_map": "elu_sum"}),
    ("srwm", {"feature_map": "dpfp", "dpfp_nu": 2}),
    ("lstm", {"forget_bias": 1.0, "recurrent_init": "orthogonal"}),
    ("gru", {"recurrent_init": "orthogonal"}),
    ("gru", {"update_bias": 1.0}),
    ("ffm", {"num_layers": 1, "context_size": 1, "max_period": 4}),
    ("lru", {"r_min": 0.9, "r_max": 0.999, "max_phase": 0.31, "num_layers": 1}),
    ("mlstm", {"chunk_size": 1}),
    ("mlstm", {"chunk_size": 64, "num_heads": 1}),
    ("mamba", {"conv_size": 0, "dt_rank": 3}),
    ("mamba", {"chunk_size": 4, "conv_size": 2}),  # chunks of 4, 4 and the rest: recomputed
    ("mamba", {"chunk_size": 3, "scan": "parallel", "expand": 1}),
]


def _id(v):
    return v[0] + "".join(f"-{k}={x}" for k, x in v[1].items())


def small(name: str, seed: int = 0, dtype: torch.dtype = D, **extra) -> Core:
    if name not in SMALL:
        pytest.fail(f"core {name!r} has no small config in SMALL (tests/test_cores.py)")
    torch.manual_seed(seed)
    return cores.make(name, IN, **{**SMALL[name], **extra}).to(dtype)


def rand(*shape, seed=1, dtype=D):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _stateful(name: str) -> bool:
    return len(small(name).state_shapes(1)) > 0


def _nonzero_state(core: Core, B: int, seed: int = 3) -> tuple:
    """A non-zero initial state: leaf tensors that collect their gradients."""
    return tuple(
        (s + 0.1 * rand(*s.shape, seed=seed + i, dtype=s.dtype)).requires_grad_()
        for i, s in enumerate(core.initial_state(B))
    )


def _loss(y, state, seed=7):
    """A scalar that depends on every output and on the final state."""
    loss = (y * rand(*y.shape, seed=seed, dtype=y.dtype)).sum()
    for i, s in enumerate(state):
        loss = loss + (s * rand(*s.shape, seed=seed + 1 + i, dtype=s.dtype)).sum()
    return loss


def _grads(core, x, state0=()):
    """Gradients w.r.t. the parameters, the input and the initial state; then cleared."""
    assert all(s.grad is not None for s in state0), "no gradient reaches the initial state"
    g = [p.grad.clone() for p in core.parameters()] + [x.grad.clone()] + [s.grad.clone() for s in state0]
    core.zero_grad()
    for t in (x, *state0):
        t.grad = None
    return g


# ------------------------------------------------------------------------- registry table


def test_every_registered_core_has_a_small_config():
    specs = cores.available()
    missing = sorted(set(specs) - set(SMALL))
    assert not missing, f"registered cores without a small test config in SMALL: {missing}"
    assert not sorted(set(SMALL) - set(specs)), "SMALL lists cores that are not registered"
    assert {"delta_lstm", "delta_mlp", "delta_delta"} <= set(ALL)  # lm_cores is covered
    for name, config in SMALL.items():
        assert set(config) <= set(specs[name].defaults), name


# ------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_one_call_equals_step_by_step_values_and_gradients(variant):
    name, extra = variant
    T, B = 6, 3
    core = small(name, **extra)
    x = rand(T, B, IN).requires_grad_()
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 0] = reset[4, 1] = reset[4, 2] = True
    state0 = _nonzero_state(core, B)

    y, state = core(x, state0, reset)
    _loss(y, state).backward()
    g_full = _grads(core, x, state0)

    ys, s = [], state0
    for t in range(T):
        yt, s = core(x[t : t + 1], s, reset[t : t + 1])
        ys.append(yt)
    y_steps = torch.cat(ys)
    torch.testing.assert_close(y_steps, y)
    assert len(s) == len(state)
    for a, b in zip(s, state):
        torch.testing.assert_close(a, b)
    _loss(y_steps, s).backward()
    g_steps = _grads(core, x, state0)
    assert len(g_steps) == len(g_full)
    for a, b in zip(g_steps, g_full):  # parameters, input, initial state
        torch.testing.assert_close(a, b)
    if state0:  # the initial state reaches the loss until each entry's reset
        assert max(g.abs().max() for g in g_full[-len(state0) :]) > 0


@pytest.mark.parametrize("name", ALL)
def test_output_shapes_and_state_layout(name):
    core = small(name)
    T, B = 3, 4
    y, state = core(rand(T, B, IN), core.initial_state(B))
    assert y.shape == (T, B, core.output_size) and y.dtype == D
    assert all(isinstance(s, torch.Tensor) and s.shape[0] == B for s in state)
    assert [tuple(s.shape) for s in state] == core.state_shapes(B)
    if name in N_STATE:
        assert len(state) == N_STATE[name]


@pytest.mark.parametrize("name", ALL)
def test_state_slices_and_concatenates_across_batch(name):
    core = small(name)
    x1, x2 = rand(4, 5, IN, seed=1), rand(3, 5, IN, seed=2)
    y1, s = core(x1, None)
    y2, s2 = core(x2, s)
    # the same entries split in two groups, carried separately then re-joined
    ya, sa = core(x1[:, :2], None)
    yb, sb = core(x1[:, 2:], None)
    torch.testing.assert_close(torch.cat([ya, yb], 1), y1)
    joined = tuple(torch.cat([a, b], 0) for a, b in zip(sa, sb))
    for a, b in zip(joined, s):
        torch.testing.assert_close(a, b)
    y2b, _ = core(x2[:, 3:], tuple(t[3:] for t in joined))
    torch.testing.assert_close(y2b, y2[:, 3:])


# ------------------------------------------------------------------------- resets


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_reset_mid_sequence_equals_separate_sequences(variant):
    name, extra = variant
    core = small(name, **extra)
    T, B, cut = 7, 2, 3
    x = rand(T, B, IN).requires_grad_()
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[cut, 1] = True
    s0 = tuple(s + 0.3 for s in core.initial_state(B))
    y, s = core(x, s0, reset)
    y_first, _ = core(x[:cut, 1:], tuple(t[1:] for t in s0))
    y_second, s_second = core(x[cut:, 1:], None)  # from the initial state
    torch.testing.assert_close(y[:cut, 1:], y_first)
    torch.testing.assert_close(y[cut:, 1:], y_second)
    for a, b in zip(s, s_second):
        torch.testing.assert_close(a[1:], b)
    # entry 0 did not reset: same as a run without any reset
    torch.testing.assert_close(y[:, :1], core(x[:, :1], tuple(t[:1] for t in s0))[0])
    # no gradient crosses the reset
    y[cut:, 1].sum().backward()
    assert x.grad[:cut, 1].abs().max() == 0
    assert x.grad[cut:, 1].abs().max() > 0


def test_reset_accepts_non_bool_and_none():
    core = small("delta")
    x = rand(4, 2, IN)
    r = torch.zeros(4, 2)
    r[2, 0] = 1.0
    torch.testing.assert_close(core(x, None, r)[0], core(x, None, r.bool())[0])
    torch.testing.assert_close(core(x, None, None)[0], core(x, None, torch.zeros(4, 2, dtype=torch.bool))[0])


# ------------------------------------------------------------------------- gradient reach


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("detach", [False, True])
def test_last_output_gradient_reaches_first_input(name, detach):
    stateful = _stateful(name)
    if stateful:  # every recurrent core accepts detach_state_every_step
        assert "detach_state_every_step" in cores.available()[name].defaults
    core = small(name, **({"detach_state_every_step": detach} if stateful else {}))
    x = rand(6, 2, IN).requires_grad_()
    y, _ = core(x, None)
    y[-1].sum().backward()
    reach = x.grad[0].abs().max().item()
    if stateful and not detach:
        assert reach > 1e-8
    else:
        assert reach == 0.0
    assert x.grad[-1].abs().max() > 0
    if stateful and detach:  # 1-step BPTT keeps the forward values of full BPTT
        torch.testing.assert_close(y, small(name)(x.detach(), None)[0])


def test_the_builtin_recurrent_cores_have_state():
    assert [n for n in BUILTIN if _stateful(n)] == list(RECURRENT)


# ------------------------------------------------------------------------- backends


@pytest.mark.parametrize("name", [n for n in ALL if "backend" in cores.available()[n].defaults])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_reference_and_auto_backends_agree(name, dtype):
    # when the fused kernels are built this compares them with the reference inside a core:
    # output and final state with a reset and a non-zero initial state; in float64 also the
    # gradients w.r.t. parameters, input and initial state, at the default tolerance
    tol = {} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-4}
    T, B = 5, 3
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 1] = True
    out = []
    for backend in ("reference", "auto"):
        core = small(name, dtype=dtype, backend=backend)
        x = rand(T, B, IN, dtype=dtype).requires_grad_()
        state0 = _nonzero_state(core, B)
        y, state = core(x, state0, reset)
        _loss(y, state).backward()
        out.append(([y.detach(), *(s.detach() for s in state)], _grads(core, x, state0)))
    (values_ref, grads_ref), (values_auto, grads_auto) = out
    assert len(values_auto) == len(values_ref) > 1
    for a, b in zip(values_auto, values_ref):
        torch.testing.assert_close(a, b, **tol)
    if dtype == torch.float64:
        for a, b in zip(grads_auto, grads_ref):
            torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------- sizes


def test_parameter_counts_of_the_atari_cores():
    # Atari setting: core input 257 (256 torso features + clipped reward). With the
    # torso+heads of the reference agents these give the design's agent totals, e.g.
    # Delta RNN 1,089,361 + 496,128 = 1,585,489 (+129 A).
    expect = {
        "lt": 428_544,
        "delta": 429_568,
        "rdn": 454_400,
        "delta_rnn": 496_128,
        "lstm": 527_360,
        "ff": 0,
        "gru": 3 * 256 * (257 + 256) + 6 * 256,
    }  # nn.GRU: 3 gate blocks, two biases each
    for name, n in expect.items():
        core = cores.make(name, 257)
        assert sum(p.numel() for p in core.parameters()) == n, name
    # the common part: input projection 257 -> 128 with bias
    assert sum(p.numel() for p in cores.make("lt", 257).input_proj.parameters()) == 33_024


def test_parameter_count_of_the_meta_rl_fwm():
    # LSTM 17->32 (6,528) + W_write/W_β 32->49 (1,617) + W_n/W_e 32->64 (2,112) + W_o 16->32 (544)
    core = cores.make("fwm", 17)
    assert sum(p.numel() for p in core.parameters()) == 10_801
    assert core.state_shapes(2) == [(2, 32), (2, 32), (2, 16, 16, 16)]


def test_dpfp_widens_the_fast_weights():
    core = cores.make("delta", 10, hidden_size=16, num_heads=2, feature_map="dpfp", dpfp_nu=3)
    assert core.state_shapes(1)[0] == (1, 2, 8, 2 * 3 * 8)


# ------------------------------------------------------------------------- registry


def test_available_lists_the_builtin_cores_with_defaults():
    specs = cores.available()
    assert set(BUILTIN) <= set(specs)
    for name in BUILTIN:
        assert specs[name].name == name and specs[name].description and specs[name].equations
    fw = {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "ff_size": 512,
        "dropout": 0.0,
        "dpfp_nu": 1,
        "backend": "auto",
        "detach_state_every_step": False,
    }
    for name, fm in (("lt", "elu_sum"), ("delta", "elu_sum"), ("delta_rnn", "softmax"), ("rdn", "softmax")):
        assert specs[name].defaults == {**fw, "feature_map": fm}
    assert specs["lstm"].defaults == {
        "hidden_size": 256,
        "num_layers": 1,
        "detach_state_every_step": False,
        "backend": "auto",
        "forget_bias": None,
        "recurrent_init": "default",
    }
    assert specs["gru"].defaults == {
        "hidden_size": 256,
        "num_layers": 1,
        "detach_state_every_step": False,
        "recurrent_init": "default",
        "update_bias": None,
    }
    assert specs["fwm"].defaults == {
        "hidden_size": 32,
        "memory_size": 16,
        "num_reads": 3,
        "detach_state_every_step": False,
        "backend": "auto",
    }
    assert specs["ff"].defaults == {}


def test_make_records_its_config():
    core = cores.make("rdn", 7, hidden_size=16, num_heads=2)
    assert core.config["hidden_size"] == 16 and core.config["feature_map"] == "softmax"
    assert core.input_size == 7 and core.output_size == 16


def test_register_adds_a_core_and_rejects_a_clash():
    class Doubler(Core):
        name = "test_doubler"

        def __init__(self, input_size, scale=2.0):
            super().__init__()
            self.input_size = self.output_size = input_size
            self.scale = scale

        def state_shapes(self, batch_size):
            return []

        def _forward(self, x, state, reset):
            return x * self.scale, ()

    spec = CoreSpec("test_doubler", "doubles", "-", {"scale": 2.0})
    cores.register(spec, Doubler)
    try:
        assert "test_doubler" in cores.available()
        core = cores.make("test_doubler", 3, scale=3)
        torch.testing.assert_close(core(torch.ones(2, 1, 3))[0], torch.full((2, 1, 3), 3.0))
        with pytest.raises(ValueError, match="already registered"):
            cores.register(CoreSpec("lstm", "x", "-", {}), Doubler)
    finally:
        cores._REGISTRY.pop("test_doubler", None)


# ------------------------------------------------------------------------- errors


def _err(match, fn, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)


def test_errors_are_one_line_and_name_the_value():
    _err(r"unknown core 'dleta'; did you mean 'delta'", cores.make, "dleta", 4)
    _err(
        r"unknown config key 'hiden_size' for core 'lt'; did you mean 'hidden_size'", cores.make, "lt", 4, hiden_size=8
    )
    _err(r"unknown config key 'hidden_size' for core 'ff'; allowed: none", cores.make, "ff", 4, hidden_size=8)
    _err(r"hidden_size 130 is not divisible by num_heads 4", cores.make, "delta", 4, hidden_size=130)
    _err(r"unknown feature_map 'relu'", cores.make, "lt", 4, feature_map="relu")
    _err(r"unknown backend 'cuda'", cores.make, "lt", 4, backend="cuda")
    _err(r"hidden_size='8' has type str; allowed: int", cores.make, "lstm", 4, hidden_size="8")
    _err(r"num_layers 0 is invalid", cores.make, "lstm", 4, num_layers=0)
    _err(r"num_layers 0 is invalid", cores.make, "gru", 4, num_layers=0)
    _err(
        r"unknown recurrent_init 'orthgonal'; did you mean 'orthogonal'",
        cores.make,
        "gru",
        4,
        recurrent_init="orthgonal",
    )
    _err(r"recurrent_init=1 has type int; allowed: str", cores.make, "lstm", 4, recurrent_init=1)
    _err(r"forget_bias 'one' is invalid; allowed: a finite number", cores.make, "lstm", 4, forget_bias="one")
    _err(r"forget_bias inf is invalid", cores.make, "lstm", 4, forget_bias=float("inf"))
    _err(r"unknown config key 'forget_bias' for core 'gru'", cores.make, "gru", 4, forget_bias=1.0)
    _err(r"update_bias nan is invalid", cores.make, "gru", 4, update_bias=float("nan"))
    _err(r"unknown config key 'update_bias' for core 'lstm'", cores.make, "lstm", 4, update_bias=1.0)
    _err(r"dropout 1.5 is invalid", cores.make, "lt", 4, dropout=1.5)
    _err(r"dpfp_nu 64 is invalid for head size 32", cores.make, "lt", 4, feature_map="dpfp", dpfp_nu=64)
    _err(r"input_size 0 is invalid", cores.make, "lt", 0)
    _err(
        r"backend 'kernel' cannot run op 'rdn' at key size 32, value size 32: rdn with feature "
        r"map 'elu_sum' \(the fused kernel implements softmax only\)",
        cores.make,
        "rdn",
        4,
        feature_map="elu_sum",
        backend="kernel",
    )


@pytest.mark.parametrize("name", ALL)
def test_call_errors(name):
    core = small(name)
    _err(r"input x has shape \(3, 2, 4\); allowed: \[T, B, 5\]", core, torch.zeros(3, 2, 4, dtype=D))
    _err(r"input x has shape \(2, 5\)", core, torch.zeros(2, 5, dtype=D))
    _err(r"input x has shape \(0, 2, 5\)", core, torch.zeros(0, 2, IN, dtype=D))
    _err(
        r"reset has shape \(3, 1\); allowed: \[T, B\] = \[3, 2\]",
        core,
        torch.zeros(3, 2, IN, dtype=D),
        None,
        torch.zeros(3, 1, dtype=torch.bool),
    )
    if name != "ff":
        bad = core.initial_state(3)
        _err(r"state\[0\] has shape \(3, .*for batch 2", core, torch.zeros(3, 2, IN, dtype=D), bad)
        wrong = bad[:1] if len(bad) > 1 else bad * 2  # one tensor too few, or too many
        _err(rf"state has {len(wrong)} tensors", core, torch.zeros(3, 2, IN, dtype=D), wrong)


@pytest.mark.parametrize("specialised", [True, False], ids=["specialised", "generic"])
@pytest.mark.parametrize("name", ALL)
def test_stepper_equals_one_call_values_and_gradients(name, specialised):
    """``core.stepper(B).step(x_t)`` for t < T equals one call ``core(x)`` from the zero state
    (cores/base.py stepping contract), specialised steppers (fwm's low-rank form) included."""
    core = small(name)
    T, B = 7, 3
    x = torch.randn(T, B, IN, dtype=D, requires_grad=True)
    y, _ = core(x, None)
    stepper = core.stepper(B, specialised=specialised)
    y_steps = torch.stack([stepper.step(x[t]) for t in range(T)])
    assert y_steps.shape == (T, B, core.output_size)
    torch.testing.assert_close(y_steps, y, rtol=1e-9, atol=1e-10)
    w = torch.randn_like(y)
    params = [x, *core.parameters()]
    g_call = torch.autograd.grad((y * w).sum(), params, allow_unused=True)
    g_step = torch.autograd.grad((y_steps * w).sum(), params, allow_unused=True)
    for a, b in zip(g_call, g_step):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name, option, gates, gate", [("lstm", "forget_bias", 4, 1), ("gru", "update_bias", 3, 1)])
def test_gate_bias_sets_one_gate_and_keeps_the_others(name, option, gates, gate):
    # LSTM gates i, f, g, o; GRU r, z, n: b_ih + b_hh of the chosen gate equals the value in every layer
    torch.manual_seed(0)
    plain = cores.make(name, 4, hidden_size=6, num_layers=2)
    torch.manual_seed(0)
    biased = cores.make(name, 4, hidden_size=6, num_layers=2, **{option: 1.5})
    rnn_plain, rnn_biased = (getattr(c, name) for c in (plain, biased))
    for layer in range(2):
        total = getattr(rnn_biased, f"bias_ih_l{layer}") + getattr(rnn_biased, f"bias_hh_l{layer}")
        blocks = total.detach().view(gates, 6)
        torch.testing.assert_close(blocks[gate], torch.full((6,), 1.5))
        for g in set(range(gates)) - {gate}:
            for kind in ("ih", "hh"):
                torch.testing.assert_close(
                    getattr(rnn_biased, f"bias_{kind}_l{layer}").view(gates, 6)[g],
                    getattr(rnn_plain, f"bias_{kind}_l{layer}").view(gates, 6)[g],
                )


@pytest.mark.parametrize("name", ALL)
def test_every_core_builds_and_steps_in_the_meta_rl_and_sequence_models(name):
    from rfwp_rl.meta_rl.model import MetaRLAgent
    from rfwp_rl.seq.model import SeqModel

    torch.manual_seed(0)
    agent = MetaRLAgent(name, SMALL[name], obs_size=17, num_actions=3)
    logits, value = agent.stepper(2).step(torch.randn(2, 17))
    assert logits.shape == (2, 3) and value.shape == (2,)
    model = SeqModel(name, [11], 7, emb_size=8, core_config=SMALL[name])
    logits, _ = model(torch.randint(0, 11, (5, 2)))
    assert logits.shape == (5, 2, 7)
    model.loss(logits, torch.randint(0, 7, (5, 2))).backward()
    assert model.describe()["core_config"] == model.core.config
