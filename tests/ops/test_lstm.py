"""``lstm`` (one LSTM layer with nn.LSTM's parameters): the reference against torch.nn.LSTM
(values and gradients, resets mid-sequence, a non-zero initial state), the fused kernel against
the reference (gradcheck, float32 at the meta-RL and an Atari-like size, the gradient of x only
when needed), the lstm and fwm cores on the kernel against the reference backend, bad inputs;
and every check of op_contract.py."""

from __future__ import annotations

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)
from torch import nn

from rfwp_rl import cores, ops
from rfwp_rl.cores.lstm import run_lstm
from rfwp_rl.errors import UserError
from rfwp_rl.ops import cases
from rfwp_rl.ops.lstm import fused, naive

OP = "lstm"
D = torch.float64


def _params(lstm: nn.LSTM, layer: int = 0) -> list[torch.Tensor]:
    return [getattr(lstm, f"{n}_l{layer}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]


def _nn_lstm_with_resets(lstm: nn.LSTM, x, h0, c0, reset):
    """torch's nn.LSTM, one call per segment between resets (the reference backend's path)."""
    y, h, c = run_lstm(lstm, x, h0[None], c0[None], reset, backend="reference")
    return y, h[0], c[0]


def test_reference_equals_nn_lstm_with_resets_and_initial_state():
    torch.manual_seed(0)
    T, B, N, H = 9, 4, 5, 6  # N inputs
    lstm = nn.LSTM(N, H).double()
    x = torch.randn(T, B, N, dtype=D)
    h0, c0 = torch.randn(B, H, dtype=D), torch.randn(B, H, dtype=D)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 1] = reset[6, 2] = reset[6, 0] = True
    w = torch.randn(T, B, H, dtype=D)
    out = {}
    for name, fn in (
        ("nn", lambda *a: _nn_lstm_with_resets(lstm, *a)),
        ("naive", lambda *a: naive.lstm(*a[:3], *_params(lstm), a[3])),
    ):
        leaves = [t.clone().requires_grad_() for t in (x, h0, c0)]
        y, h, c = fn(*leaves, reset)
        loss = (y * w).sum() + h.square().sum() + c.sum()
        grads = torch.autograd.grad(loss, leaves + _params(lstm))
        out[name] = [y, h, c, *grads]
    for a, b in zip(out["naive"], out["nn"]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_fused_gradcheck_with_resets_and_initial_state(ext):
    args, reset = cases.make_inputs(OP, T=5, B=3, H=1, d=3, dk=4, reset_at=((0, 1), (2, 2), (3, 0)), seed=2)
    leaves = tuple(a.clone().requires_grad_() for a in args)
    fn = ops.get(OP, "kernel")
    assert torch.autograd.gradcheck(lambda *a: fn(*a, reset), leaves, eps=1e-6, atol=1e-7)


def test_inference_without_checkpoints(ext, name):  # noqa: F811 (the lstm forward's outputs)
    # without gradients the forward keeps no activations and builds no autograd node
    args, reset = cases.make_inputs(OP, T=5, B=2, H=1, d=16, reset_at=((2, 1),))
    for backend in ("auto", "kernel"):
        with torch.no_grad():
            out = ops.get(OP, backend)(*args, reset)
        assert all(o.grad_fn is None for o in out)
        torch.testing.assert_close(out, naive.lstm(*args, reset), rtol=1e-12, atol=1e-12)
    y, h, c, acts, cs, hs = ext.lstm_forward(*args, reset, 0)
    assert acts.numel() == 0 and cs.numel() == 0
    with pytest.raises(ValueError, match="checkpoint interval must be >= 1"):
        fused.lstm(ext, 0, *[a.clone().requires_grad_() for a in args], reset)


LSTM_SIZES = {
    "meta_rl": dict(T=30, B=600, d=32, dk=17),  # agents/meta_rl_fwm.toml, batch 600
    "atari": dict(T=51, B=32, d=256, dk=257),
}  # the Atari lstm core, unroll 50 (+1)


@pytest.mark.parametrize("size", sorted(LSTM_SIZES))
def test_fused_float32_at_lstm_sizes(ext, size):
    # the float32 kernel against the float64 reference, every output and gradient (of x, the
    # state and the four parameters), resets mid-sequence, within 1e-4 of the largest value
    s = LSTM_SIZES[size]
    T, B = s["T"], s["B"]
    args, reset = cases.make_inputs(OP, **s, H=1, reset_at=((T // 3, 1), (T // 2, B - 1)), seed=7)
    true_out, true_grad = cases.forward_backward(naive.lstm, args, reset)
    out, grad = cases.forward_backward(ops.get(OP, "kernel"), [a.float() for a in args], reset)
    for x, y in zip(true_out + true_grad, out + grad):
        assert y.dtype == torch.float32
        torch.testing.assert_close(y.double(), x, rtol=1e-4, atol=1e-4 * float(x.abs().max()))


def test_gradient_of_x_only_when_needed(ext, monkeypatch):
    # the gradient of x is a GEMM over all steps: not formed for inputs without gradients
    # (the agents' observations)
    args, reset = cases.make_inputs(OP, T=4, B=3, H=1, d=5, dk=7, reset_at=((2, 0),), seed=1)
    asked = []
    backward = ext.lstm_backward
    monkeypatch.setattr(ext, "lstm_backward", lambda *a: asked.append(a[12]) or backward(*a))
    leaves = [a.clone().requires_grad_(i > 0) for i, a in enumerate(args)]
    y = ops.get(OP, "kernel")(*leaves, reset)[0]
    grads = torch.autograd.grad(y.square().sum(), leaves[1:])
    ref_leaves = [a.clone().requires_grad_(i > 0) for i, a in enumerate(args)]
    ref = torch.autograd.grad(naive.lstm(*ref_leaves, reset)[0].square().sum(), ref_leaves[1:])
    torch.testing.assert_close(grads, ref, rtol=1e-12, atol=1e-13)
    assert asked == [False]


# ---------------------------------------------------------------------------- in the cores


def _core_outputs(name: str, backend: str, num_layers: int = 1, **options):
    torch.manual_seed(0)
    config = (
        {"hidden_size": 8, "num_layers": num_layers, **options}
        if name == "lstm"
        else {"hidden_size": 8, "memory_size": 4, "num_reads": 2}
    )
    core = cores.make(name, 5, backend=backend, **config).double()
    g = torch.Generator().manual_seed(1)
    T, B = 7, 3
    x = torch.randn(T, B, 5, dtype=D, generator=g).requires_grad_()
    state = [torch.randn(s, dtype=D, generator=g) * 0.5 for s in core.state_shapes(B)]
    state = [s.requires_grad_() for s in state]
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 1] = reset[5, 0] = True
    y, final = core(x, state, reset)
    w = torch.randn(y.shape, dtype=D, generator=g)
    loss = (y * w).sum() + sum(s.sin().sum() for s in final)
    grads = torch.autograd.grad(loss, [x, *state, *core.parameters()])
    return [y, *final, *grads]


INIT = {"forget_bias": 1.0, "recurrent_init": "orthogonal"}


@pytest.mark.parametrize(
    "name, layers, options", [("lstm", 1, {}), ("lstm", 2, {}), ("fwm", 1, {}), ("lstm", 2, INIT)], ids=str
)
def test_cores_equal_on_kernel_and_reference(ext, name, layers, options, monkeypatch):
    # backend 'kernel' runs the op on the nn.LSTM's parameters, 'reference' nn.LSTM itself
    # (so the initialisation options reach both)
    calls = []
    forward = ext.lstm_forward
    monkeypatch.setattr(ext, "lstm_forward", lambda *a: calls.append(1) or forward(*a))
    ref = _core_outputs(name, "reference", layers, **options)
    assert calls == []
    got = _core_outputs(name, "kernel", layers, **options)
    assert len(calls) == layers
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if options:  # the options changed the numbers the kernel computes
        assert (got[0] - _core_outputs(name, "kernel", layers)[0]).abs().max() > 1e-3


def test_acting_steps_equal_one_call(ext):
    # the lstm core's generic stepper (one op call per step) equals one call on the sequence
    torch.manual_seed(0)
    core = cores.make("lstm", 5, hidden_size=8, backend="kernel").double()
    x = torch.randn(6, 3, 5, dtype=D)
    with torch.no_grad():
        y, _ = core(x)
        stepper = core.stepper(3)
        steps = torch.stack([stepper.step(x[t]) for t in range(6)])
    torch.testing.assert_close(steps, y, rtol=1e-12, atol=1e-13)


def test_recorded_steps_replay_one_call_in_values_and_gradients(ext):
    # steps without gradients that keep the activations, then one autograd node over them:
    # the reference's outputs and weight gradients, from a non-zero state
    torch.manual_seed(1)
    lstm = nn.LSTM(5, 8).double()
    x = torch.randn(7, 3, 5, dtype=D)
    h0, c0 = torch.randn(3, 8, dtype=D), torch.randn(3, 8, dtype=D)
    rec = fused.Recorder(ext, h0, c0)
    with torch.no_grad():
        ys = torch.stack([rec.step(x[t], *_params(lstm)) for t in range(7)])
    y = rec.replay(*_params(lstm))
    y_ref, _, _ = naive.lstm(x, h0, c0, *_params(lstm), None)
    torch.testing.assert_close(y, ys, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-13)
    g = torch.randn_like(y)
    for a, b in zip(
        torch.autograd.grad((y * g).sum(), _params(lstm)), torch.autograd.grad((y_ref * g).sum(), _params(lstm))
    ):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


# ---------------------------------------------------------------------------- bad inputs


def test_bad_inputs_give_one_line_errors(ext):
    args, reset = cases.make_inputs(OP, T=3, B=2, H=1, d=4, dk=3)
    with pytest.raises(UserError) as info:
        ops.get(OP, "kernel")(*[a.to(torch.int32) for a in args], reset)
    assert str(info.value) == (
        "backend 'kernel' cannot run op 'lstm' at key size 3, value size 4 "
        "(int32, cpu): dtype torch.int32 (fused kernels: float32, float64; "
        "float16/bfloat16 computed in float32); use backend 'auto' or "
        "'reference'"
    )
    bad = list(args)
    bad[4] = bad[4][:, :3]  # w_hh [16, 3] for H = 4
    with pytest.raises(RuntimeError, match=r"^w_hh must be \[4H, H\] with H >= 1, got \[16, 3\]$"):
        ops.get(OP, "kernel")(*bad, reset)
    bad = list(args)
    bad[1] = bad[1][:1]  # h0 of one entry, x of two
    with pytest.raises(RuntimeError, match=r"^h0 has shape \[1, 4\], expected \[2, 4\]$"):
        ops.get(OP, "kernel")(*bad, reset)
    with pytest.raises(UserError, match=r"^unknown backend 'fused'"):
        cores.make("lstm", 3, backend="fused")


def test_auto_runs_nn_lstm_above_the_size_where_the_kernel_is_faster(ext):
    # 'auto' takes the kernel up to AUTO_MAX_HIDDEN (measured faster there), nn.LSTM above;
    # 'kernel' takes it at every size, 'reference' never
    like = torch.zeros(1)
    big = fused.AUTO_MAX_HIDDEN + 1
    assert fused.layer("auto", like, fused.AUTO_MAX_HIDDEN) is not None
    assert fused.layer("auto", like, big) is None
    assert fused.layer("kernel", like, big) is not None
    assert fused.layer("reference", like, 8) is None
    assert fused.layer("auto", like.to("meta"), 8) is None  # not the CPU: nn.LSTM
