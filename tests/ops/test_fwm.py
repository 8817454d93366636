"""``fwm`` (FWM paper Eq. 1-7): the reference against the equations on a case written out by
hand (association, chained read, convex overwrite, both branches of Eq. 4), the fused kernel
against the reference at the meta-RL and Atari sizes, chained calls (T = 1 and chunks) equal
one call in values and gradients, the incremental stepper, the gradient of F0 only when
needed, CUDA inputs on the reference; and every check of op_contract.py."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)
from op_contract import RESETS

from rfwp_rl import kernels, ops
from rfwp_rl.errors import UserError
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import cases, dispatch
from rfwp_rl.ops.fwm import fused, naive

OP = "fwm"
D = torch.float64
EPS = naive.LN_EPS


def _ln2(a: float, b: float) -> list[float]:
    """LN of the 2-vector (a, b) without affine map: ±(a - b)/2 / sqrt(((a - b)/2)² + ε)."""
    h = (a - b) / 2
    s = h / math.sqrt(h * h + EPS)
    return [s, -s]


# ------------------------------------------------------------------ the equations by hand

A = 0.8
"""Length of every key after tanh in the hand case (a unit key is out of tanh's range)."""


def _hand_case():
    """m = 2, N_r = 2, one memory, three steps, F0 = 0; keys A u1 or A u2 (u: unit vectors).
    The op takes the slow projections: the inverse tanh / σ of the values below."""
    u1, u2 = [A, 0.0], [0.0, A]
    k1, k2 = [u1, u2, u1], [u2, u1, u2]
    v = [[0.6, -0.8], [-0.95, 0.95], [0.95, 0.95]]
    beta = torch.tensor([0.5, 0.95, 0.95], dtype=D)
    atanh = lambda rows: torch.atanh(torch.tensor(rows, dtype=D))
    w = torch.cat([atanh(k1), atanh(k2), atanh(v), torch.logit(beta)[:, None]], -1)
    r = atanh([u1 + u2 + u1] * 3)  # n0 = A u1, e_1 = A u2, e_2 = A u1
    return [w[:, None, None], r[:, None, None], torch.zeros(1, 1, 2, 2, 2, dtype=D)]


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_three_steps_written_out(backend):
    """F[a][b] is the value stored under the key pair (u_a, u_b); vec(A u_a ⊗ A u_b) has A² = 0.64.

    Step 0 (Eq. 3): v_old = 0, z = β v = (0.3, -0.4), F[0][1] = A² z = (0.192, -0.256);
    ||F'|| = 0.32 < 1: no rescaling (Eq. 4). Reads (Eq. 7): r1 = A² F[0][1] = (0.12288, -0.16384),
    n1 = LN(r1) = (c, -c); r2 = A (n1[0] F[0][0] + n1[1] F[1][0]) = 0, so y = LN(0) = 0.
    Step 1: pair (u2, u1), z = 0.95 (-0.95, 0.95), F[1][0] = A² z = (-0.5776, 0.5776);
    ||F'||² = 0.76964352 < 1. Chained read: n1 = (c, -c) again, r2 = A n1[1] F[1][0]
    = 0.46208 c (1, -1): the first read's value is the second read's key.
    Step 2: pair (u1, u2) again, v = (0.95, 0.95): v_old = A² F[0][1] = (0.12288, -0.16384),
    z = 0.95 (v - v_old) = (0.785764, 1.058148), F'[0][1] = (0.69488896, 0.42121472);
    ||F'||² = 1.327536... > 1: F = F' / ||F'|| (Eq. 4).
    """
    y, F = ops.get(OP, backend)(*_hand_case(), None)
    c = _ln2(0.12288, -0.16384)[0]
    f01 = [0.192 + 0.64 * 0.95 * (0.95 - 0.12288), -0.256 + 0.64 * 0.95 * (0.95 + 0.16384)]
    assert f01 == pytest.approx([0.69488896, 0.42121472])
    f10 = [-0.5776, 0.5776]
    norm = math.sqrt(f01[0] ** 2 + f01[1] ** 2 + 2 * 0.5776**2)
    assert norm**2 == pytest.approx(1.327536, abs=1e-6)
    c2 = _ln2(0.64 * f01[0] / norm, 0.64 * f01[1] / norm)[0]
    expect = [[0.0, 0.0], _ln2(0.46208 * c, -0.46208 * c), _ln2(-c2 * A * f10[0] / norm, -c2 * A * f10[1] / norm)]
    torch.testing.assert_close(y[:, 0, 0], torch.tensor(expect, dtype=D))
    F_T = torch.zeros(2, 2, 2, dtype=D)
    F_T[0, 1] = torch.tensor(f01, dtype=D) / norm
    F_T[1, 0] = torch.tensor(f10, dtype=D) / norm
    torch.testing.assert_close(F[0, 0], F_T)
    assert abs(float(F.norm()) - 1.0) < 1e-12  # Eq. 4 rescaled to norm 1


def _rescaled_steps(args, reset):
    """(steps where Eq. 4 rescaled, all steps) of the reference, per (t, b, h)."""
    T = args[0].shape[0]
    norms = torch.stack(
        [
            naive.fwm(*[a[: t + 1] for a in args[:2]], args[2], reset[: t + 1])[1].flatten(2).norm(dim=-1)
            for t in range(T)
        ]
    )
    return int((norms > 1 - 1e-12).sum()), norms.numel()


@pytest.mark.parametrize("backend", ["reference", "kernel"])
def test_gradcheck_on_both_branches_of_the_rescaling(backend):
    # keys through tanh, F0 of norm 0.5: most writes push ||F'|| above 1 (rescaled), some not
    args, reset = cases.make_inputs(OP, T=6, B=2, H=1, d=3, reset_at=((3, 1),), seed=4)
    rescaled, total = _rescaled_steps(args, reset)
    assert 0 < rescaled < total
    fn = ops.get(OP, backend)
    leaves = [a.clone().requires_grad_() for a in args]
    assert torch.autograd.gradcheck(lambda *a: fn(*a, reset), tuple(leaves), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------- the fused kernel's own checks


def _reference_noise(args, reset) -> tuple[float, float]:
    """Bounds for the fused float64 kernel against the reference: 10x how far the reference's
    outputs and gradients move when its inputs move by about one ulp (at least 1e-12). The
    chained layer norms of Eq. 7 amplify rounding by 1/std of each read: about 1e-11 in the
    gradients at m = 32 (the contract's fixed 1e-12 is for ops without them)."""
    g = torch.Generator().manual_seed(0)
    moved = [a * (1 + 1e-15 * torch.randn(a.shape, generator=g, dtype=D)) for a in args]
    ref_out, ref_grad = cases.forward_backward(naive.fwm, args, reset)
    out, grad = cases.forward_backward(naive.fwm, moved, reset)
    return (max(1e-12, 10 * cases.relative_error(ref_out, out)), max(1e-12, 10 * cases.relative_error(ref_grad, grad)))


@pytest.mark.parametrize("d", [5, 16, 32, 64])
def test_fused_float64_equals_reference(ext, name, d):  # noqa: F811 (the bound of _reference_noise)
    args, reset = cases.make_inputs(name, T=7, B=3, H=2, d=d, reset_at=RESETS, seed=d)
    bound = _reference_noise(args, reset)
    for chunk in (1, 3, 7):  # a fold every step, every 3, none
        err, gerr = cases.max_errors(name, lambda *a, chunk=chunk: fused.fwm(ext, chunk, *a), args, reset)
        assert err < bound[0] and gerr < bound[1], (chunk, err, gerr, bound)


@pytest.mark.parametrize("backend", ["auto", "kernel"])
def test_inference_without_checkpoints(ext, name, backend):  # noqa: F811 (as above)
    # without gradients the forward keeps nothing for a backward and builds no autograd node
    args, reset = cases.make_inputs(name, T=5, B=2, H=2, d=16, reset_at=((2, 1),))
    with torch.no_grad():
        out = ops.get(name, backend)(*args, reset)
    assert all(o.grad_fn is None for o in out)
    assert cases.relative_error(naive.fwm(*args, reset), out) < _reference_noise(args, reset)[0]
    y, F, saved, bases = ext.fwm_forward(*args, reset, 0)
    assert saved.shape[0] == 0 and bases.shape[1] == 0
    with pytest.raises(ValueError, match="checkpoint interval must be >= 1"):
        fused.fwm(ext, 0, *[a.clone().requires_grad_() for a in args], reset)


FWM_SIZES = {
    "meta_rl": dict(T=30, B=600, H=1, d=16),  # agents/meta_rl_fwm.toml, batch 600
    "atari": dict(T=51, B=32, H=1, d=32),
}  # agents/atari_fwm.toml, unroll 50 (+1)


@pytest.mark.parametrize("zero_start", [True, False], ids=["zero F0", "F0"])
@pytest.mark.parametrize("size", sorted(FWM_SIZES))
def test_fused_float32_at_benchmark_sizes(ext, size, zero_start):  # noqa: F811 (fwm's sizes)
    # the float32 fused kernel against the float64 reference, values and gradients of every
    # input and of F0, resets mid-sequence; a zero F0 is what every meta-RL episode starts from.
    # Within 1e-4 of the largest value, or no worse than the float32 reference itself: a layer
    # norm of a nearly constant read (one in thousands of random steps) amplifies rounding.
    s = FWM_SIZES[size]
    T, B = s["T"], s["B"]
    args, reset = cases.make_inputs(OP, **s, reset_at=((T // 3, 1), (T // 2, B - 1)), seed=7)
    if zero_start:
        args[-1] = torch.zeros_like(args[-1])
    single = [a.float() for a in args]
    true_out, true_grad = cases.forward_backward(naive.fwm, args, reset)
    out, grad = cases.forward_backward(ops.get(OP, "kernel"), single, reset)
    ref_out, ref_grad = cases.forward_backward(naive.fwm, single, reset)
    for x, y, r in zip(true_out + true_grad, out + grad, ref_out + ref_grad):
        assert y.dtype == torch.float32
        scale = float(x.abs().max())
        err, ref_err = (float((z.double() - x).abs().max()) / scale for z in (y, r))
        assert err <= max(1e-4, ref_err), (err, ref_err)


@pytest.mark.parametrize("pieces", [[1] * 7, [3, 4], [2, 1, 4]], ids=["T=1 each", "3+4", "2+1+4"])
def test_chained_calls_equal_one_call(ext, pieces):
    # F_T of one call is the F0 of the next: values and gradients (through the final state's
    # gradient and the initial state's) equal one call of 7 steps, with resets
    args, reset = cases.make_inputs(OP, T=7, B=3, H=2, d=4, reset_at=((1, 0), (4, 2), (5, 1)), seed=3)
    fn = ops.get(OP, "kernel")

    def chained(w, r, F, reset):
        ys, t = [], 0
        for n in pieces:
            y, F = fn(w[t : t + n], r[t : t + n], F, reset[t : t + n])
            ys.append(y)
            t += n
        return torch.cat(ys), F

    one_out, one_grad = cases.forward_backward(fn, args, reset)
    out, grad = cases.forward_backward(chained, args, reset)
    for x, y in zip(one_out + one_grad, out + grad):
        torch.testing.assert_close(y, x, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("d, T", [(3, 40), (16, 9)], ids=["folds", "meta-rl"])
def test_stepper_equals_one_call(ext, d, T):
    # the incremental stepper (acting): each step of one call, from a non-zero F0, with resets;
    # d = 3 folds its tail into the base every 16 steps
    args, reset = cases.make_inputs(OP, T=T, B=3, H=2, d=d, reset_at=((2, 1), (5, 0)), seed=d)
    y, F = naive.fwm(*args, reset)
    stepper = fused.Stepper(ext, 3, 2, d, args[2], args[2])
    ys = torch.stack([stepper.step(args[0][t], args[1][t], reset[t]) for t in range(T)])
    torch.testing.assert_close(ys, y, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(stepper.dense(), F, rtol=1e-11, atol=1e-12)
    tail_length, has_base = stepper.state[5].unbind(-1)  # per group of tasks
    assert has_base.all()  # F0, and folds of the tail
    assert (int(tail_length.max()) < T) == (d == 3)  # folded: a shorter tail


@pytest.mark.parametrize("d, T", [(3, 12), (16, 30)])
def test_recorded_steps_replay_one_call_with_resets(ext, d, T):
    # a recording stepper from the zero tensor: the replay's outputs are the steps' and its
    # gradients of w and r equal the reference's, resets mid-sequence included
    args, reset = cases.make_inputs(OP, T=T, B=3, H=2, d=d, reset_at=((2, 1), (5, 0)), seed=d)
    w, r = (a.detach().requires_grad_() for a in args[:2])
    F0 = torch.zeros_like(args[2])
    stepper = fused.Stepper(ext, 3, 2, d, w.detach(), record=True)
    with torch.no_grad():
        ys = torch.stack([stepper.step(w[t], r[t], reset[t]) for t in range(T)])
    y = stepper.replay(w, r)
    y_ref, _ = naive.fwm(w, r, F0, reset)
    torch.testing.assert_close(y, ys, rtol=0, atol=0)
    # float64 rounding of the dense reference vs the factored kernel, amplified by LN (Eq. 7)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    g = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(d))
    for a, b in zip(torch.autograd.grad((y * g).sum(), (w, r)), torch.autograd.grad((y_ref * g).sum(), (w, r))):
        # LN's backward divides by the standard deviation at every step: gradients reach the
        # hundreds at d=16, T=30, so the rounding is bounded relative to their largest entry
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8 * float(b.abs().max()))


def test_no_replay_from_F0_or_after_a_fold(ext):
    args, _ = cases.make_inputs(OP, T=20, B=2, H=1, d=3, seed=1)
    from_F0 = fused.Stepper(ext, 2, 1, 3, args[2], args[2], record=True)
    long = fused.Stepper(ext, 2, 1, 3, args[2], record=True)
    assert long.fold == 16
    with torch.no_grad():
        from_F0.step(args[0][0], args[1][0])
        for t in range(16):
            long.step(args[0][t], args[1][t])
    assert from_F0.replay(args[0][:1], args[1][:1]) is None
    assert long.replay(args[0][:16], args[1][:16]) is not None  # 16 terms: no fold yet
    with torch.no_grad():
        long.step(args[0][16], args[1][16])  # the 17th step folds
    assert long.replay(args[0][:17], args[1][:17]) is None


def test_gradient_of_F0_only_when_needed(ext, monkeypatch):
    # the gradient of a zero F0 costs O(m³) per step: not computed when F0 needs no gradient
    args, reset = cases.make_inputs(OP, T=5, B=2, H=1, d=8, reset_at=((3, 0),), seed=1)
    args[-1] = torch.zeros_like(args[-1])
    asked = []
    backward = ext.fwm_backward
    monkeypatch.setattr(ext, "fwm_backward", lambda *a: asked.append(a[8]) or backward(*a))
    fn = ops.get(OP, "kernel")
    leaves = [a.clone().requires_grad_(i < 2) for i, a in enumerate(args)]
    y, _ = fn(*leaves, reset)
    grads = torch.autograd.grad(y.square().sum(), leaves[:2])
    ref_leaves = [a.clone().requires_grad_(i < 2) for i, a in enumerate(args)]
    ref = torch.autograd.grad(naive.fwm(*ref_leaves, reset)[0].square().sum(), ref_leaves[:2])
    torch.testing.assert_close(grads, ref)
    assert asked == [False]


def test_cuda_inputs_run_on_the_reference(ext, monkeypatch, caplog):
    # no CUDA kernel: 'auto' takes the reference (one warning), 'kernel' refuses in one line
    assert (
        fused.supported(ops.Dims(16, 16), torch.float32, "cuda", cuda_limits.H100)
        == "fwm has no CUDA kernel (fused on cpu only)"
    )
    monkeypatch.setattr(dispatch, "_warned", set())

    class CudaExt:
        def has_cuda(self) -> bool:
            return True

        def __getattr__(self, name):
            return getattr(ext, name)

    monkeypatch.setattr(kernels, "_state", {"loaded": True, "ext": CudaExt(), "why": "test", "build_seconds": 0.0})
    cuda = torch.device("cuda", 0)
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        plan = ops.resolve(OP, "auto", ops.Dims(16, 16))._plan((cuda, torch.float32))
    assert not isinstance(plan, dispatch.FusedCall)
    assert [r.getMessage() for r in caplog.records if r.name == "rfwp_rl.ops"] == [
        "rfwp_rl: op 'fwm' at key size 16, value size 16 (float32, cuda:0) runs on the PyTorch "
        "reference: fwm has no CUDA kernel (fused on cpu only)"
    ]
    with pytest.raises(UserError, match="fwm has no CUDA kernel"):
        ops.resolve(OP, "kernel", ops.Dims(16, 16))._plan((cuda, torch.float32))
