"""The rfwp_rl.cores contract: chunking, resets, gradients, state layout, sizes, errors."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.cores.base import Core, CoreSpec
from rfwp_rl.errors import UserError

D = torch.float64
IN = 5
BUILTIN = ("ff", "lstm", "lt", "delta", "delta_rnn", "rdn", "fwm")
RECURRENT = ("lstm", "lt", "delta", "delta_rnn", "rdn", "fwm")
FAST = ("lt", "delta", "delta_rnn", "rdn")

# small configs so the suite stays fast
SMALL = {
    "ff": {},
    "lstm": {"hidden_size": 6, "num_layers": 2},
    "fwm": {"hidden_size": 6, "memory_size": 3, "num_reads": 2},
    **{k: {"hidden_size": 8, "num_layers": 2, "num_heads": 2, "ff_size": 12} for k in FAST},
}
# (core, extra config) combinations covering every feature map
VARIANTS = [(n, {}) for n in BUILTIN] + [
    ("lt", {"feature_map": "dpfp", "dpfp_nu": 2}), ("delta", {"feature_map": "softmax"}),
    ("delta", {"feature_map": "dpfp"}), ("delta_rnn", {"feature_map": "elu_sum"}),
    ("rdn", {"feature_map": "elu_sum"}), ("rdn", {"feature_map": "dpfp"}),
]


def _id(v):
    return v[0] + "".join(f"-{k}={x}" for k, x in v[1].items())


def small(name: str, seed: int = 0, **extra) -> Core:
    torch.manual_seed(seed)
    return cores.make(name, IN, **{**SMALL[name], **extra}).to(D)


def rand(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D)


def _loss(y, state, seed=7):
    """A scalar that depends on every output and on the final state."""
    loss = (y * rand(*y.shape, seed=seed)).sum()
    for s in state:
        loss = loss + (s * rand(*s.shape, seed=seed + 1)).sum()
    return loss


def _grads(core, x):
    return [p.grad.clone() for p in core.parameters()] + [x.grad.clone()]


# ------------------------------------------------------------------------- chunking

@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_one_call_equals_step_by_step_values_and_gradients(variant):
    name, extra = variant
    T, B = 6, 3
    core = small(name, **extra)
    x = rand(T, B, IN).requires_grad_()
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[2, 0] = reset[4, 1] = reset[4, 2] = True
    state0 = tuple(s + rand(*s.shape, seed=3 + i) * 0.1
                   for i, s in enumerate(core.initial_state(B)))   # non-zero initial state

    y, state = core(x, state0, reset)
    _loss(y, state).backward()
    g_full = _grads(core, x)

    core.zero_grad()
    x.grad = None
    ys, s = [], state0
    for t in range(T):
        yt, s = core(x[t:t + 1], s, reset[t:t + 1])
        ys.append(yt)
    y_steps = torch.cat(ys)
    torch.testing.assert_close(y, y_steps)
    for a, b in zip(state, s):
        torch.testing.assert_close(a, b)
    _loss(y_steps, s).backward()
    for a, b in zip(g_full, _grads(core, x)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", BUILTIN)
def test_output_shapes_and_state_layout(name):
    core = small(name)
    T, B = 3, 4
    y, state = core(rand(T, B, IN), core.initial_state(B))
    assert y.shape == (T, B, core.output_size) and y.dtype == D
    assert all(isinstance(s, torch.Tensor) and s.shape[0] == B for s in state)
    assert [tuple(s.shape) for s in state] == core.state_shapes(B)
    assert len(state) == {"ff": 0, "lstm": 2, "fwm": 3, "lt": 2, "delta": 2,
                          "delta_rnn": 6, "rdn": 4}[name]


@pytest.mark.parametrize("name", BUILTIN)
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
    y_second, s_second = core(x[cut:, 1:], None)                 # from the initial state
    torch.testing.assert_close(y[:cut, 1:], y_first)
    torch.testing.assert_close(y[cut:, 1:], y_second)
    for a, b in zip(s, s_second):
        torch.testing.assert_close(a[1:], b)
    # entry 0 did not reset: same as a run without any reset
    torch.testing.assert_close(y[:, :1], core(x[:, :1], tuple(t[:1] for t in s0))[0])
    # no gradient crosses the reset
    y[cut:, 1].sum().backward()
    assert x.grad[:cut, 1].abs().max() == 0
    if name != "ff":
        assert x.grad[cut:, 1].abs().max() > 0


def test_reset_accepts_non_bool_and_none():
    core = small("delta")
    x = rand(4, 2, IN)
    r = torch.zeros(4, 2)
    r[2, 0] = 1.0
    torch.testing.assert_close(core(x, None, r)[0], core(x, None, r.bool())[0])
    torch.testing.assert_close(core(x, None, None)[0], core(x, None, torch.zeros(4, 2, dtype=torch.bool))[0])


# ------------------------------------------------------------------------- gradient reach

@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("detach", [False, True])
def test_last_output_gradient_reaches_first_input(name, detach):
    extra = {"detach_state_every_step": detach} if name != "ff" else {}
    core = small(name, **extra)
    x = rand(6, 2, IN).requires_grad_()
    y, _ = core(x, None)
    y[-1].sum().backward()
    reach = x.grad[0].abs().max().item()
    if name in RECURRENT and not detach:
        assert reach > 1e-8
    else:
        assert reach == 0.0
    assert x.grad[-1].abs().max() > 0


def test_detach_every_step_keeps_forward_values():
    for name in RECURRENT:
        a = small(name)
        b = small(name, detach_state_every_step=True)
        x = rand(5, 2, IN)
        torch.testing.assert_close(a(x)[0], b(x)[0])


# ------------------------------------------------------------------------- sizes

def test_parameter_counts_of_the_atari_cores():
    # Atari setting: core input 257 (256 torso features + clipped reward). With the
    # torso+heads of the reference agents these give the design's agent totals, e.g.
    # Delta RNN 1,089,361 + 496,128 = 1,585,489 (+129 A).
    expect = {"lt": 428_544, "delta": 429_568, "rdn": 454_400, "delta_rnn": 496_128,
              "lstm": 527_360, "ff": 0}
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
    fw = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "ff_size": 512, "dropout": 0.0,
          "dpfp_nu": 1, "backend": "auto", "detach_state_every_step": False}
    for name, fm in (("lt", "elu_sum"), ("delta", "elu_sum"), ("delta_rnn", "softmax"),
                     ("rdn", "softmax")):
        assert specs[name].defaults == {**fw, "feature_map": fm}
    assert specs["lstm"].defaults == {"hidden_size": 256, "num_layers": 1,
                                      "detach_state_every_step": False}
    assert specs["fwm"].defaults == {"hidden_size": 32, "memory_size": 16, "num_reads": 3,
                                     "detach_state_every_step": False}
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


def test_reference_and_auto_backends_agree():
    # when the fused kernels are built this compares them with the reference inside a core
    for name in FAST:
        torch.manual_seed(0)
        a = cores.make(name, IN, **SMALL[name], backend="reference")
        torch.manual_seed(0)
        b = cores.make(name, IN, **SMALL[name], backend="auto")
        x = torch.randn(5, 3, IN)
        reset = torch.zeros(5, 3, dtype=torch.bool)
        reset[2, 1] = True
        torch.testing.assert_close(a(x, None, reset)[0], b(x, None, reset)[0],
                                   atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------- errors

def _err(match, fn, *args, **kw):
    with pytest.raises(UserError, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)


def test_errors_are_one_line_and_name_the_value():
    _err(r"unknown core 'dleta'; did you mean 'delta'", cores.make, "dleta", 4)
    _err(r"unknown config key 'hiden_size' for core 'lt'; did you mean 'hidden_size'",
         cores.make, "lt", 4, hiden_size=8)
    _err(r"unknown config key 'hidden_size' for core 'ff'; allowed: none", cores.make, "ff", 4,
         hidden_size=8)
    _err(r"hidden_size 130 is not divisible by num_heads 4", cores.make, "delta", 4,
         hidden_size=130)
    _err(r"unknown feature_map 'relu'", cores.make, "lt", 4, feature_map="relu")
    _err(r"unknown backend 'cuda'", cores.make, "lt", 4, backend="cuda")
    _err(r"hidden_size='8' has type str; allowed: int", cores.make, "lstm", 4, hidden_size="8")
    _err(r"num_layers 0 is invalid", cores.make, "lstm", 4, num_layers=0)
    _err(r"dropout 1.5 is invalid", cores.make, "lt", 4, dropout=1.5)
    _err(r"dpfp_nu 64 is invalid for head size 32", cores.make, "lt", 4, feature_map="dpfp",
         dpfp_nu=64)
    _err(r"input_size 0 is invalid", cores.make, "lt", 0)
    _err(r"feature_map 'elu_sum' with backend 'kernel' for core 'rdn'", cores.make, "rdn", 4,
         feature_map="elu_sum", backend="kernel")


@pytest.mark.parametrize("name", BUILTIN)
def test_call_errors(name):
    core = small(name)
    _err(r"input x has shape \(3, 2, 4\); allowed: \[T, B, 5\]", core, torch.zeros(3, 2, 4, dtype=D))
    _err(r"input x has shape \(2, 5\)", core, torch.zeros(2, 5, dtype=D))
    _err(r"input x has shape \(0, 2, 5\)", core, torch.zeros(0, 2, IN, dtype=D))
    _err(r"reset has shape \(3, 1\); allowed: \[T, B\] = \[3, 2\]", core,
         torch.zeros(3, 2, IN, dtype=D), None, torch.zeros(3, 1, dtype=torch.bool))
    if name != "ff":
        bad = core.initial_state(3)
        _err(r"state\[0\] has shape \(3, .*for batch 2", core, torch.zeros(3, 2, IN, dtype=D), bad)
        _err(r"state has 1 tensors", core, torch.zeros(3, 2, IN, dtype=D), bad[:1])
