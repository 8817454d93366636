"""Checks every fast-weight op passes: its PyTorch reference against itself (resets,
chaining, gradients, no side effects) and its fused kernel against the reference (values
and gradients with non-zero initial states and resets mid-sequence, several checkpoint
intervals, float32 at the benchmark sizes, float16/bfloat16 through float32, determinism,
no side effects). ``test_<op>.py`` imports them all and sets ``OP``; the ``name`` fixture
(conftest.py) reads it."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import kernels, ops
from rfwp_rl.ops import cases

D = torch.float64
RESETS = ((0, 1), (2, 2), (4, 0), (5, 1))  # (t, b): includes a reset at t = 0
SIZES = {"atari": dict(T=51, B=32, H=4, d=32), "lm": dict(T=256, B=8, H=8, d=16)}


def naive(name):
    return ops.naive(name)


def fused(ext, name: str, chunk: int):
    """The fused kernel of ``name`` with checkpoints every ``chunk`` steps."""
    return lambda *a: ops.spec(name).fused(ext, chunk, *a)


def _final_state(name: str, out: tuple) -> tuple[torch.Tensor, ...]:
    return ops.spec(name).final_state(out)


# ------------------------------------------------------------- the reference against itself


def test_reference_reset_equals_two_separate_sequences(name):
    T, cut = 6, 3
    spec = ops.spec(name)
    args, _ = cases.make_inputs(name, T=T, B=2, H=2, d=4)
    reset = torch.zeros(T, 2, dtype=torch.bool)
    reset[cut, 1] = True  # entry 1 restarts at step 3, entry 0 does not
    out = spec.naive(*args, reset)
    y = out[0]
    # entry 0: identical to running with no reset
    torch.testing.assert_close(y[:, 0], spec.naive(*args, None)[0][:, 0])
    # entry 1: first part as usual, second part from a zero state
    first = [a[:cut] if i in spec.time_args else a for i, a in enumerate(args)]
    second = [
        a[cut:] if i in spec.time_args else (torch.zeros_like(a) if i in spec.state_args else a)
        for i, a in enumerate(args)
    ]
    torch.testing.assert_close(y[:cut, 1], spec.naive(*first, None)[0][:, 1])
    out2 = spec.naive(*second, None)
    torch.testing.assert_close(y[cut:, 1], out2[0][:, 1])
    for s, s2 in zip(_final_state(name, out), _final_state(name, out2)):
        torch.testing.assert_close(s[1], s2[1])


def test_reference_no_gradient_crosses_a_reset(name):
    T, cut = 5, 2
    spec = ops.spec(name)
    args, _ = cases.make_inputs(name, T=T, B=2, H=2, d=4)
    args = [a.requires_grad_() for a in args]
    reset = torch.zeros(T, 2, dtype=torch.bool)
    reset[cut, :] = True
    y = spec.naive(*args, reset)[0]
    # random weights: a plain sum of layer-normed outputs (fwm) is identically zero
    w = torch.randn(y[cut:].shape, generator=torch.Generator().manual_seed(0), dtype=y.dtype)
    (y[cut:] * w).sum().backward()
    for i in spec.time_args:
        assert args[i].grad[:cut].abs().max() == 0, f"input {i} before the reset got gradient"
        assert args[i].grad[cut:].abs().max() > 0
    for i in spec.state_args:
        assert args[i].grad.abs().max() == 0, f"initial state {i} got gradient across a reset"


def test_reference_inputs_not_modified(name):
    args, reset = cases.make_inputs(name, T=5, B=3, H=2, d=4, reset_at=((2, 0),))
    before = [a.clone() for a in args]
    versions = [a._version for a in args]
    naive(name)(*args, reset)
    for a, b, ver in zip(args, before, versions):
        assert torch.equal(a, b) and a._version == ver


def test_reference_one_call_equals_chained_calls(name):
    T, cut = 6, 4
    spec = ops.spec(name)
    args, reset = cases.make_inputs(name, T=T, B=3, H=2, d=4, reset_at=((1, 0), (4, 2), (5, 1)))
    out = spec.naive(*args, reset)
    first = [a[:cut] if i in spec.time_args else a for i, a in enumerate(args)]
    out1 = spec.naive(*first, reset[:cut])
    state = dict(zip(spec.state_args, _final_state(name, out1)))
    second = [a[cut:] if i in spec.time_args else state.get(i, a) for i, a in enumerate(args)]
    out2 = spec.naive(*second, reset[cut:])
    torch.testing.assert_close(out[0], torch.cat([out1[0], out2[0]]))
    for s, s2 in zip(_final_state(name, out), _final_state(name, out2)):
        torch.testing.assert_close(s, s2)


def test_reference_gradcheck_with_initial_state_and_reset(name):
    # non-zero initial state (the reference code's LT backward got this wrong) + a mid reset
    args, reset = cases.make_inputs(name, T=3, B=2, H=1, d=2, reset_at=((2, 1),))
    args = [a.requires_grad_() for a in args]
    fn = lambda *a: naive(name)(*a, reset)
    assert torch.autograd.gradcheck(fn, tuple(args), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------ the fused kernel = reference


@pytest.mark.parametrize("d", [3, 16])  # 3: plain-loop path, 16: register-blocked path
def test_fused_gradcheck_with_initial_state_and_reset(ext, name, d):
    B = 2 if d == 3 else 1
    args, reset = cases.make_inputs(name, T=4, B=B, H=1, d=d, reset_at=((2, B - 1),))
    args = [a.requires_grad_() for a in args]
    fn = lambda *a: fused(ext, name, 2)(*a, reset)
    assert torch.autograd.gradcheck(fn, tuple(args), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("d", [5, 16, 32, 64])
def test_fused_float64_equals_reference(ext, name, d):
    args, reset = cases.make_inputs(name, T=7, B=3, H=2, d=d, reset_at=RESETS, seed=d)
    for chunk in (1, 3, 7):
        err, gerr = cases.max_errors(name, fused(ext, name, chunk), args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)


def test_fused_key_size_different_from_value_size(ext, name):
    # DPFP-ν maps d to 2νd: W is [d, 2νd]
    spec = ops.spec(name)
    if not spec.key_size_free:  # then the fused kernel says so instead of computing it
        assert "key size" in spec.supported(ops.Dims(10, 5), torch.float64, "cpu")
        return
    args, reset = cases.make_inputs(name, T=6, B=2, H=3, d=5, dk=10, reset_at=((3, 1),))
    err, gerr = cases.max_errors(name, fused(ext, name, 4), args, reset)
    assert err < 1e-12 and gerr < 1e-12


def _assert_close_to_truth(truth: list[torch.Tensor], got: list[torch.Tensor], dtype: torch.dtype, rtol: float) -> None:
    for x, y in zip(truth, got):
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), x, rtol=rtol, atol=rtol * float(x.abs().max()))


@pytest.mark.parametrize("size", sorted(SIZES))
def test_fused_float32_at_benchmark_sizes(ext, name, size):
    # the float32 fused kernel against the float64 reference (ground truth)
    s = SIZES[size]
    T, B = s["T"], s["B"]
    args, reset = cases.make_inputs(name, **s, reset_at=((T // 3, 1), (T // 2, B - 1)), seed=7)
    # the same random cotangents (seeded; rounded to float32 for the kernel) for both runs
    true_out, true_grad = cases.forward_backward(naive(name), args, reset)
    out, grad = cases.forward_backward(ops.get(name, "kernel"), [a.float() for a in args], reset)
    _assert_close_to_truth(true_out + true_grad, out + grad, torch.float32, 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_precision_runs_fused_in_float32(ext, name, dtype, monkeypatch):
    # float16/bfloat16 inputs take the fused kernel (the extension converts them once to
    # float32, results and gradients back), not the reference: compared with the float32
    # reference on the same (rounded) inputs, within the half type's rounding of the results
    args, reset = cases.make_inputs(name, T=9, B=2, H=2, d=16, reset_at=((3, 1),), seed=2)
    half = [a.to(dtype) for a in args]
    seen = []
    forward = getattr(ext, f"{name}_forward")
    monkeypatch.setattr(ext, f"{name}_forward", lambda *a: seen.append(a[0].dtype) or forward(*a))
    out, grad = cases.forward_backward(ops.get(name, "auto"), half, reset)
    assert seen == [dtype]
    # the reference in float32 on the same rounded inputs and cotangents (forward_backward's
    # seeded ones, as the half-precision run rounded them)
    g = torch.Generator().manual_seed(1)
    cot = [torch.randn(o.shape, generator=g, dtype=D).to(dtype).float() for o in out]
    ref_out, ref_grad = cases.forward_backward(naive(name), [h.float() for h in half], reset, cot)
    eps = torch.finfo(dtype).eps  # the results' rounding to the half type: eps / 2
    _assert_close_to_truth([x.double() for x in ref_out + ref_grad], out + grad, dtype, 2 * eps)


@pytest.mark.parametrize("backend", ["auto", "kernel"])
def test_inference_without_checkpoints(ext, name, backend):
    # without gradients the forward stores no checkpoints and builds no autograd node
    args, reset = cases.make_inputs(name, T=5, B=2, H=2, d=16, reset_at=((2, 1),))
    with torch.no_grad():
        out = ops.get(name, backend)(*args, reset)
    assert all(o.grad_fn is None for o in out)
    torch.testing.assert_close(out, naive(name)(*args, reset), rtol=1e-12, atol=1e-12)
    forward = getattr(ext, f"{name}_forward")(*args, reset, 0)
    ckpt = forward[3 if name == "delta_rnn" else 2]
    assert ckpt.shape[0] == 0
    with pytest.raises(ValueError, match="checkpoint interval must be >= 1"):
        fused(ext, name, 0)(*[a.clone().requires_grad_() for a in args], reset)


def test_fused_inputs_and_states_not_modified(ext, name):
    args, reset = cases.make_inputs(name, T=6, B=2, H=2, d=16, reset_at=((3, 0),))
    args = [a.requires_grad_() for a in args]
    before = [a.detach().clone() for a in args]
    versions = [a._version for a in args]
    reset_before = reset.clone()
    out = ops.get(name, "kernel")(*args, reset)
    sum(o.square().sum() for o in out).backward()
    for a, b, ver in zip(args, before, versions):
        assert torch.equal(a.detach(), b) and a._version == ver
    assert torch.equal(reset, reset_before)


def test_fused_bitwise_deterministic_across_runs_and_thread_counts(ext, name):
    args, reset = cases.make_inputs(name, T=9, B=8, H=2, d=32, dtype=torch.float32, reset_at=((4, 3),))
    fn = ops.get(name, "kernel")
    runs = []
    for n in (2, 2, 1):  # the (b, h) tasks split over 2 threads, then all on one
        torch.set_num_threads(n)
        runs.append(cases.forward_backward(fn, args, reset))
    for other in runs[1:]:
        for x, y in zip(runs[0][0] + runs[0][1], other[0] + other[1]):
            assert torch.equal(x, y)


def test_default_chunking_one_chunk_and_several(ext, name):
    # the dispatch's default interval: the whole sequence when the T states of one (b, h)
    # fit ONE_CHUNK_BYTES (one checkpoint), else max(16, sqrt(T)) (several chunks, each
    # recomputed from its checkpoint); both against the reference, with resets. (An op whose
    # CPU kernel keeps no state checkpoints gets the whole sequence: only the values count.)
    spec = ops.spec(name)
    one, one_reset = cases.make_inputs(name, T=12, B=3, H=2, d=32, reset_at=((0, 1), (7, 2)), seed=5)
    state_bytes = spec.state_elems(ops.Dims(32, 32)) * 8
    if spec.cpu_checkpoints:
        assert kernels.checkpoint_interval(12, state_bytes) == 12
    err, gerr = cases.max_errors(name, ops.get(name, "kernel"), one, one_reset)
    assert err < 1e-12 and gerr < 1e-12, (err, gerr)
    # float32, head size 64 (4 rows of 16 lanes per vector block): 40 states of 16 KiB > 512 KiB
    T = 40
    several, reset = cases.make_inputs(name, T=T, B=2, H=1, d=64, reset_at=((17, 0), (33, 1)), seed=6)
    if spec.cpu_checkpoints:
        assert kernels.checkpoint_interval(T, spec.state_elems(ops.Dims(64, 64)) * 4) == 16
    true_out, true_grad = cases.forward_backward(naive(name), several, reset)
    out, grad = cases.forward_backward(ops.get(name, "kernel"), [a.float() for a in several], reset)
    _assert_close_to_truth(true_out + true_grad, out + grad, torch.float32, 1e-4)


def test_supported_on_cpu_at_every_size(name):
    # the CPU kernels have no size limit (plain loops beyond the register-blocked sizes)
    spec = ops.spec(name)
    for d in (1, 16, 32, 64, 128, 300):
        assert spec.supported(ops.Dims(d, d), torch.float32, "cpu") is None
    assert "float32, float64" in spec.supported(ops.Dims(8, 8), torch.int32, "cpu")
    assert spec.supported(ops.Dims(8, 8), torch.float32, "meta") == "device 'meta' (fused kernels: cpu, cuda)"


__all__ = [n for n in dir() if n.startswith("test_")]
