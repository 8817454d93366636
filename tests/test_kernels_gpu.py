"""The CUDA kernels through torch on a GPU: values and gradients equal the PyTorch reference,
with non-zero initial states and resets mid-sequence, several block sizes, bitwise
determinism, no side effects, the device guard. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import kernels
from rfwp_rl.kernels import cases, functions
from rfwp_rl.ops import reference as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]

OPS = cases.OPS


@pytest.fixture(scope="module")
def ext():
    backend, why = kernels.status()
    ext = kernels._load()[0]
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
    args, reset = cases.make_inputs(name, T=9, B=3, H=2, d=d, device="cuda", seed=d,
                                    reset_at=((0, 1), (3, 2), (5, 0)))
    be = _Threads(ext, threads)
    for chunk in (1, 4):
        fn = lambda *a: functions.FUSED[name](be, chunk, *a)  # noqa: E731
        err, gerr = cases.max_errors(name, fn, args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)


@pytest.mark.parametrize("name", OPS)
def test_cuda_float32_atari_size(ext, name):
    args, reset = cases.make_inputs(name, T=51, B=32, H=4, d=32, device="cuda", seed=3,
                                    reset_at=((17, 1), (30, 31)))
    true_out, true_grad = cases.forward_backward(getattr(ref, name), args, reset)
    out, grad = cases.forward_backward(kernels.get(name, required=True), [a.float() for a in args], reset)
    for x, y in zip(true_out + true_grad, out + grad):
        torch.testing.assert_close(y.double(), x, rtol=1e-4, atol=1e-4 * float(x.abs().max()))


@pytest.mark.parametrize("name", OPS)
def test_cuda_deterministic_and_side_effect_free(ext, name):
    args, reset = cases.make_inputs(name, T=12, B=4, H=2, d=32, device="cuda", dtype=torch.float32,
                                    reset_at=((5, 1),))
    before = [a.clone() for a in args]
    fn = kernels.get(name, required=True)
    (o1, g1), (o2, g2) = cases.forward_backward(fn, args, reset), cases.forward_backward(fn, args, reset)
    for x, y in zip(o1 + g1, o2 + g2):
        assert torch.equal(x, y)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_device_guard_second_gpu(ext):
    args, reset = cases.make_inputs("delta", T=6, B=2, H=2, d=8, device="cuda:1", reset_at=((2, 0),))
    err, gerr = cases.max_errors("delta", kernels.get("delta", required=True), args, reset)
    assert err < 1e-12 and gerr < 1e-12
