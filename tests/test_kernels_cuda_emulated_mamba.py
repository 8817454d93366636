"""The CUDA kernels of ``mamba`` (Mamba's selective scan, ``csrc/cuda/selective_scan.cu``) without a
GPU: the real sources run through the host emulation (``csrc/cuda_emu``) equal the PyTorch
reference in values and gradients with the state size N and the channels D apart (the shared tests
of tests/test_kernels_cuda_emulated.py take N = d and D = H d), at the core's state size, with the
gradient of only one output, with checkpoint intervals that do and do not divide T, float32 and
float64; the float64 gradients pass gradcheck; the launches are what ``rfwp_rl.kernels.cuda_limits``
says. nvcc, the ThreadSanitizer race check, the torch side of the CUDA build, determinism, side
effects, the empty sequence and the global-memory layout are checked for every op in
tests/test_kernels_cuda_emulated.py."""

from __future__ import annotations

import math

import pytest
import torch

from rfwp_rl import ops
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import cases

TOL = {torch.float32: 2e-5, torch.float64: 1e-12}

pytestmark = pytest.mark.usefixtures("one_thread")


def emulated(emu, chunk):
    return lambda *a: ops.spec("mamba").fused(emu, chunk, *a)


def inputs(T: int, B: int, D: int, N: int, **kw):
    """make_inputs with D channels of N state values (H = 1, d = D, dk = N)."""
    return cases.make_inputs("mamba", T=T, B=B, H=1, d=D, dk=N, **kw)


@pytest.mark.parametrize(
    "N,D,threads",
    [(1, 3, 32), (4, 40, 32), (16, 8, 64), (7, 33, 64), (5, 2, 96)],
    ids=["N1-D3", "N4-D40", "N16-D8", "N7-D33", "N5-D2"],
)
def test_emulated_equals_reference(emu, N, D, threads):
    # D = 40 with 32 threads: one lane per channel, more channels than threads; N = 16, D = 8
    # with 64 threads: 8 lanes per channel; N = 5, D = 2 with 96 threads: more lanes than state
    # values, three warps
    emu.threads = threads
    args, reset = inputs(7, 3, D, N, seed=N + D, reset_at=((0, 1), (3, 0), (3, 2), (6, 1)))
    for chunk in (1, 3, 7, 10):
        err, gerr = cases.max_errors("mamba", emulated(emu, chunk), args, reset)
        assert err < TOL[torch.float64] and gerr < TOL[torch.float64], (chunk, err, gerr)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_emulated_core_state_size(emu, dtype):
    # the core's N = 16 state values, D = 64 channels, the launchers' default block (256 threads)
    emu.threads = 0
    args, reset = inputs(9, 2, 64, 16, seed=2, reset_at=((4, 1),))
    true_out, true_grad = cases.forward_backward(ops.naive("mamba"), args, reset)
    out, grad = cases.forward_backward(emulated(emu, 4), [a.to(dtype) for a in args], reset)
    emu.threads = 32
    assert cases.relative_error(true_out, out) < TOL[dtype]
    assert cases.relative_error(true_grad, grad) < TOL[dtype]


@pytest.mark.parametrize("which", [0, 1], ids=["y", "h_T"])
def test_emulated_gradient_of_one_output(emu, which):
    # the other output's gradient reaches the kernel as None (no zero tensor is made)
    emu.threads = 32
    args, reset = inputs(6, 2, 5, 3, seed=7, reset_at=((2, 0),))
    shape = args[0].shape if which == 0 else args[5].shape  # y [T, B, D] or h_T [B, D, N]
    w = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grads(fn):
        leaves = [a.clone().requires_grad_() for a in args]
        (fn(*leaves, reset)[which] * w).sum().backward()
        return [torch.zeros_like(x) if x.grad is None else x.grad for x in leaves]  # h_T does not read C

    assert cases.relative_error(grads(ops.naive("mamba")), grads(emulated(emu, 4))) < TOL[torch.float64]


def test_emulated_gradcheck(emu):
    emu.threads = 32
    args, reset = inputs(5, 2, 3, 2, seed=4, reset_at=((2, 1),))
    leaves = [a.clone().requires_grad_() for a in args]
    # fast mode: finite differences along random directions, a few kernel calls per input instead of one per element
    assert torch.autograd.gradcheck(lambda *a: emulated(emu, 2)(*a, reset), leaves, eps=1e-6, atol=1e-8, fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_launches_are_what_cuda_limits_says(emu, dtype):
    # one block per batch entry with the block size and dynamic shared memory of the launch
    # model, then the sum of A's gradient over the batch (128 threads per block, no shared memory)
    emu.threads = 0
    N, D, B = 6, 20, 3
    args, reset = inputs(4, B, D, N, dtype=dtype, reset_at=((1, 0),))
    emu.launches()
    cases.forward_backward(emulated(emu, 2), args, reset)
    log = emu.launches()
    elem = torch.empty((), dtype=dtype).element_size()
    expect = [cuda_limits.requirements("mamba", direction, N, D, elem) for direction in ("forward", "backward")]
    assert log[:2] == [(B, r.threads_per_block, r.smem_dynamic) for r in expect]
    assert log[2] == (math.ceil(D * N / 128), 128, 0) and len(log) == 3
    assert expect[0].threads_per_block == cuda_limits.launch_threads(N, D) == emu.launch_threads(N, D, 0)
    emu.threads = 32
