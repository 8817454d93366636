"""The CUDA kernels of the Householder delta-rule ops (``gated_delta``, ``delta_product``: one kernel,
``csrc/cuda/householder_product.cu``; ``srwm``: ``csrc/cuda/srwm.cu``) without a GPU: the real
sources run through the host emulation (``csrc/cuda_emu``) equal the PyTorch reference in values
and gradients (resets mid-sequence, non-zero initial states, several checkpoint intervals and
block shapes, float32 and float64), launch what ``rfwp_rl.kernels.cuda_limits`` says they
launch. nvcc, the ThreadSanitizer race check, the torch side of the CUDA build, determinism and
side effects are checked for every op in tests/test_kernels_cuda_emulated.py."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import ops
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import cases

OPS = ("gated_delta", "delta_product", "srwm")
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}

pytestmark = pytest.mark.usefixtures("one_thread")


def emulated(emu, name, chunk):
    return lambda *a: ops.spec(name).fused(emu, chunk, *a)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d,threads", [(5, 32), (33, 32), (4, 64), (16, 64)])
def test_emulated_equals_reference(emu, name, d, threads):
    # d = 5: fewer rows than threads; d = 33: more rows than threads (and, for srwm, 103 rows);
    # d = 4 with 64 threads: most threads idle; d = 16: a head size of the presets
    emu.threads = threads
    args, reset = cases.make_inputs(name, T=6, B=2, H=2, d=d, seed=d, reset_at=((0, 1), (2, 1), (4, 0)))
    for chunk in (1, 4):
        err, gerr = cases.max_errors(name, emulated(emu, name, chunk), args, reset)
        assert err < TOL[torch.float64] and gerr < TOL[torch.float64], (chunk, err, gerr)


@pytest.mark.parametrize("name", OPS)
def test_emulated_float32(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=8, B=2, H=1, d=8, reset_at=((3, 1),), seed=4)
    true_out, true_grad = cases.forward_backward(ops.naive(name), args, reset)
    out, grad = cases.forward_backward(emulated(emu, name, 3), [a.float() for a in args], reset)
    assert cases.relative_error(true_out, out) < TOL[torch.float32]
    assert cases.relative_error(true_grad, grad) < TOL[torch.float32]


@pytest.mark.parametrize("name", ["gated_delta", "delta_product"])
def test_emulated_key_size_different_from_value_size(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=5, B=2, H=1, d=3, dk=7, reset_at=((2, 0),))
    err, gerr = cases.max_errors(name, emulated(emu, name, 2), args, reset)
    assert err < 1e-12 and gerr < 1e-12


def test_emulated_delta_product_with_three_householder_steps(emu):
    emu.threads = 32
    g = torch.Generator().manual_seed(9)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)
    args = [
        unit(r(5, 2, 2, 6)),
        unit(r(5, 2, 2, 3, 6)),
        r(5, 2, 2, 3, 6),
        2 * torch.sigmoid(r(5, 2, 2, 3)),
        r(2, 2, 6, 6),
    ]
    reset = torch.zeros(5, 2, dtype=torch.bool)
    reset[3, 1] = True
    err, gerr = cases.max_errors("delta_product", emulated(emu, "delta_product", 2), args, reset)
    assert err < 1e-12 and gerr < 1e-12


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_launches_are_what_cuda_limits_says(emu, name, dtype):
    # one block per (b, h) with the block size and dynamic shared memory of the launch model
    # (srwm: a second launch sums the W_init gradients over the batch)
    emu.threads = 0
    d, B, H = 6, 2, 3
    args, reset = cases.make_inputs(name, T=4, B=B, H=H, d=d, dtype=dtype, reset_at=((1, 0),))
    emu.launches()
    cases.forward_backward(emulated(emu, name, 2), args, reset)
    log = emu.launches()
    elem = torch.empty((), dtype=dtype).element_size()
    expect = [cuda_limits.requirements(name, direction, d, d, elem) for direction in ("forward", "backward")]
    assert [(g, t, s) for g, t, s in log[:2]] == [(B * H, r.threads_per_block, r.smem_dynamic) for r in expect]
    assert len(log) == (3 if name == "srwm" else 2)
    if name == "srwm":
        assert log[0][1] == emu.srwm_threads(d, 0) == cuda_limits.block_threads("srwm", d, d)
    emu.threads = 32


def test_emulated_srwm_unstaged_layout(emu):
    # a device whose shared memory cannot hold the (3d + 4) x d matrix: the launchers keep dW and
    # its gradient in global memory, with the same results
    emu.threads = 32
    d = 6
    staged = [cuda_limits.smem_request("srwm", direction, d, d, 8) for direction in ("forward", "backward")]
    optin = min(staged) - 1
    unstaged = [
        cuda_limits.smem_request("srwm", direction, d, d, 8, smem_optin=optin) for direction in ("forward", "backward")
    ]
    assert all(u < s for u, s in zip(unstaged, staged)) and max(unstaged) <= optin
    args, reset = cases.make_inputs("srwm", T=5, B=2, H=2, d=d, reset_at=((2, 1),), seed=3)
    emu.set_device_smem_optin(optin)
    try:
        emu.launches()
        err, gerr = cases.max_errors("srwm", emulated(emu, "srwm", 2), args, reset)
        log = emu.launches()
    finally:
        emu.set_device_smem_optin(None)
    assert err < 1e-12 and gerr < 1e-12
    assert [smem for _, _, smem in log] == unstaged + [0]  # then the batch sum
