"""The CUDA kernels through torch on a GPU: values and gradients equal the PyTorch reference,
with non-zero initial states and resets mid-sequence, several block sizes, bitwise
determinism, no side effects, the device guard. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import kernels, ops
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

OPS = tuple(n for n in ops.OPS if n in cuda_limits.OPS)  # the ops with CUDA kernels


def test_op_without_cuda_kernel_runs_the_reference_on_the_gpu():
    # fwm has no CUDA kernel: 'auto' computes CUDA inputs with the reference, 'kernel' refuses
    from rfwp_rl.errors import UserError

    args, reset = cases.make_inputs("fwm", T=4, B=2, H=1, d=8, reset_at=((2, 1),), device="cuda")
    torch.testing.assert_close(ops.get("fwm", "auto")(*args, reset), ops.naive("fwm")(*args, reset))
    with pytest.raises(UserError, match="fwm has no CUDA kernel"):
        ops.get("fwm", "kernel")(*args, reset)


@pytest.fixture(scope="module")
def ext():
    backend, why = kernels.status()
    ext = kernels.load()[0]
    if backend != "kernel" or not ext.has_cuda():
        pytest.fail(f"CUDA kernels are not available although a GPU is: {why}")
    return ext


class _Threads:
    """The extension with a fixed CUDA block size."""

    def __init__(self, ext, threads: int) -> None:
        self.ext, self.threads = ext, threads

    def __getattr__(self, name):
        fn = getattr(self.ext, name)
        return lambda *a: fn(*a, threads=self.threads)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d,threads", [(5, 0), (16, 32), (32, 0), (33, 64), (64, 0)])
def test_cuda_equals_reference_float64(ext, name, d, threads):
    args, reset = cases.make_inputs(name, T=9, B=3, H=2, d=d, device="cuda", seed=d, reset_at=((0, 1), (3, 2), (5, 0)))
    be = _Threads(ext, threads)
    for chunk in (1, 4):
        fn = lambda *a, chunk=chunk: ops.spec(name).fused(be, chunk, *a)
        err, gerr = cases.max_errors(name, fn, args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)


@pytest.mark.parametrize("name", OPS)
def test_cuda_float32_atari_size(ext, name):
    args, reset = cases.make_inputs(name, T=51, B=32, H=4, d=32, device="cuda", seed=3, reset_at=((17, 1), (30, 31)))
    true_out, true_grad = cases.forward_backward(ops.naive(name), args, reset)
    out, grad = cases.forward_backward(ops.get(name, "kernel"), [a.float() for a in args], reset)
    for x, y in zip(true_out + true_grad, out + grad):
        torch.testing.assert_close(y.double(), x, rtol=1e-4, atol=1e-4 * float(x.abs().max()))


@pytest.mark.parametrize("name", OPS)
def test_cuda_deterministic_and_side_effect_free(ext, name):
    args, reset = cases.make_inputs(name, T=12, B=4, H=2, d=32, device="cuda", dtype=torch.float32, reset_at=((5, 1),))
    before = [a.clone() for a in args]
    fn = ops.get(name, "kernel")
    (o1, g1), (o2, g2) = cases.forward_backward(fn, args, reset), cases.forward_backward(fn, args, reset)
    for x, y in zip(o1 + g1, o2 + g2):
        assert torch.equal(x, y)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_device_guard_second_gpu(ext):
    args, reset = cases.make_inputs("delta", T=6, B=2, H=2, d=8, device="cuda:1", reset_at=((2, 0),))
    err, gerr = cases.max_errors("delta", ops.get("delta", "kernel"), args, reset)
    assert err < 1e-12 and gerr < 1e-12


# ------------------------------------------------------- sizes, limits, dtypes, edge cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    "d,dk", [(16, 16), (32, 32), (64, 64), (128, 128), (16, 32)], ids=["d16", "d32", "d64", "d128", "dpfp16"]
)
@pytest.mark.parametrize("name", OPS)
def test_cuda_head_sizes_or_a_clean_refusal(ext, name, d, dk, dtype):
    # every size either equals the reference or is refused with NotImplementedError exactly
    # when cuda_limits says this GPU cannot run it
    if name in ("rdn", "srwm") and dk != d:
        pytest.skip(f"{name} has keys of the head size only (its DPFP form runs on the reference)")
    limits = cuda_limits.DeviceLimits.from_torch(torch.cuda.current_device())
    why = cuda_limits.check(name, "forward", dk, d, dtype.itemsize, limits) or cuda_limits.check(
        name, "backward", dk, d, dtype.itemsize, limits
    )
    args, reset = cases.make_inputs(
        name, T=20, B=3, H=2, d=d, dk=dk, device="cuda", seed=d, dtype=dtype, reset_at=((3, 1), (11, 0), (12, 2))
    )
    fn = lambda *a: ops.spec(name).fused(ext, 8, *a)
    if why is not None:
        with pytest.raises(NotImplementedError, match="cannot run on this GPU"):
            cases.forward_backward(fn, args, reset)
        return
    err, gerr = cases.max_errors(name, fn, args, reset)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    assert err < tol and gerr < tol, (err, gerr)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", OPS)
def test_cuda_half_inputs(ext, name, dtype):
    args, reset = cases.make_inputs(name, T=9, B=3, H=2, d=32, device="cuda", seed=2, reset_at=((4, 1),))
    halves = [a.to(dtype) for a in args]
    dtypes, worst = cases.half_precision_errors(name, lambda *a: ops.spec(name).fused(ext, 4, *a), halves, reset)
    assert dtypes == {dtype} and worst <= 4, (dtypes, worst)  # within 4 eps of the float64 reference


@pytest.mark.parametrize("name", OPS)
def test_cuda_empty_sequence_and_odd_requests(ext, name):
    # T = 0 keeps the states; absurd block sizes are clamped; non-contiguous inputs are copied
    args, reset = cases.make_inputs(name, T=0, B=2, H=2, d=8, device="cuda")
    out = ops.spec(name).fused(ext, 4, *args, reset)
    assert out[0].shape[0] == 0
    assert torch.equal(out[1], args[ops.spec(name).state_args[0]])
    args, reset = cases.make_inputs(name, T=7, B=2, H=2, d=8, device="cuda", reset_at=((3, 0),))
    be = _Threads(ext, 100000)
    err, gerr = cases.max_errors(name, lambda *a: ops.spec(name).fused(be, 4, *a), args, reset)
    assert err < 1e-12 and gerr < 1e-12
    strided = [a.transpose(-1, -2).contiguous().transpose(-1, -2) if a.dim() >= 2 else a for a in args]
    with torch.no_grad():
        y = getattr(ext, f"{name}_forward")(*strided, reset, 0)[0]
    torch.testing.assert_close(y, ops.naive(name)(*args, reset)[0], rtol=1e-12, atol=1e-12)


def test_cuda_limits_match_the_device():
    props = torch.cuda.get_device_properties(0)
    lim = cuda_limits.DeviceLimits.from_torch(0)
    assert lim.arch == 10 * props.major + props.minor
    assert lim.smem_optin_bytes >= 48 * 1024
