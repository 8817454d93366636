"""The selective SSM of Mamba: the loop against hand-computed numbers, the chunked PyTorch form
(loop or parallel scan inside chunks, chunks recomputed in the backward pass) against the loop,
what the chunked form keeps for the backward pass, when the core's layer takes the fused kernel;
and every check of op_contract.py (the fused CPU kernel against the loop)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from op_contract import *  # noqa: F401,F403  (the checks every op passes)

from rfwp_rl import kernels
from rfwp_rl.errors import UserError
from rfwp_rl.ops import Dims, dispatch
from rfwp_rl.ops.mamba import fused, layer, naive, selective_scan

OP = "mamba"
D = torch.float64
LN2 = math.log(2.0)
FORMS = {
    "naive": naive,
    "loop": lambda *a: selective_scan(*a),
    "loop_chunks": lambda *a: selective_scan(*a, chunk_size=1),
    "parallel": lambda *a: selective_scan(*a, parallel=True),
    "parallel_chunks": lambda *a: selective_scan(*a, chunk_size=1, parallel=True),
}


def _hand_case():
    """d_inner = 1, d_state = 2, T = 2, batch 1: A = (-1, -2) and Δ = ln 2 make Ā = (1/2, 1/4)."""
    u = torch.tensor([1.0, 2.0], dtype=D).view(2, 1, 1)
    delta = torch.full((2, 1, 1), LN2, dtype=D)
    A = torch.tensor([[-1.0, -2.0]], dtype=D)
    B = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=D).view(2, 1, 2)
    C = torch.tensor([[1.0, 1.0], [2.0, -1.0]], dtype=D).view(2, 1, 2)
    h0 = torch.tensor([[4.0, 8.0]], dtype=D).view(1, 1, 2)
    return u, delta, A, B, C, h0


@pytest.mark.parametrize("form", FORMS)
def test_recurrence_matches_hand_computed_case(form: str) -> None:
    run = FORMS[form]
    # step 0: h = (4/2 + ln2 * 1 * 1, 8/4 + ln2 * 1 * 0) = (2 + ln2, 2);  y = (2 + ln2) + 2
    # step 1: h = ((2 + ln2)/2 + ln2 * 2 * 1, 2/4 + ln2 * 2 * 1) = (1 + 2.5 ln2, 0.5 + 2 ln2)
    #         y = 2 (1 + 2.5 ln2) - (0.5 + 2 ln2) = 1.5 + 3 ln2
    y, h = run(*_hand_case(), None)
    torch.testing.assert_close(y.flatten(), torch.tensor([4 + LN2, 1.5 + 3 * LN2], dtype=D))
    torch.testing.assert_close(h.flatten(), torch.tensor([1 + 2.5 * LN2, 0.5 + 2 * LN2], dtype=D))
    # a reset before step 1 drops the state: h = (2 ln2, 2 ln2), y = 2 (2 ln2) - 2 ln2 = 2 ln2
    reset = torch.tensor([[False], [True]])
    y, h = run(*_hand_case(), reset)
    torch.testing.assert_close(y.flatten(), torch.tensor([4 + LN2, 2 * LN2], dtype=D))
    torch.testing.assert_close(h.flatten(), torch.tensor([2 * LN2, 2 * LN2], dtype=D))


def _inputs(T: int, B: int = 3, Dn: int = 4, N: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(T, B, Dn, generator=g, dtype=D)
    delta = torch.nn.functional.softplus(torch.randn(T, B, Dn, generator=g, dtype=D))
    A = -torch.exp(0.5 * torch.randn(Dn, N, generator=g, dtype=D))
    Bm = torch.randn(T, B, N, generator=g, dtype=D)
    C = torch.randn(T, B, N, generator=g, dtype=D)
    h0 = torch.randn(B, Dn, N, generator=g, dtype=D)
    reset = torch.rand(T, B, generator=g) < 0.2
    reset[T // 2, 0] = True  # a reset mid-sequence for at least one entry
    reset[:, 1] = False  # and one entry that carries h0 through the whole unroll
    return [t.requires_grad_() for t in (u, delta, A, Bm, C, h0)], reset


@pytest.mark.parametrize("parallel", [False, True], ids=["loop", "parallel"])
@pytest.mark.parametrize("T, chunk_size", [(7, 0), (7, 1), (7, 3), (10, 4), (10, 10), (5, 8), (1, 0), (1, 3)])
def test_chunked_matches_naive_values_and_gradients(T: int, chunk_size: int, parallel: bool) -> None:
    args, reset = _inputs(T, seed=T + chunk_size)
    y, h = selective_scan(*args, reset, chunk_size=chunk_size, parallel=parallel)
    y_ref, h_ref = naive(*args, reset)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)
    g = torch.Generator().manual_seed(1)
    wy, wh = torch.randn(y.shape, generator=g, dtype=D), torch.randn(h.shape, generator=g, dtype=D)
    grads = torch.autograd.grad((y * wy).sum() + (h * wh).sum(), args)
    grads_ref = torch.autograd.grad((y_ref * wy).sum() + (h_ref * wh).sum(), args)
    for name, a, b in zip(("u", "delta", "A", "B", "C", "h0"), grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"d{name}: {m}")
    assert grads_ref[-1][1].abs().min() > 0  # h0 reaches the entry that never resets


def test_without_gradients_chunks_give_the_same_numbers() -> None:
    args, reset = _inputs(9)
    with torch.no_grad():
        y, h = selective_scan(*args, reset, chunk_size=4)
    assert not y.requires_grad
    y_ref, h_ref = naive(*(a.detach() for a in args), reset)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)


def _saved_bytes(chunk_size: int, args) -> int:
    """Bytes of the storages autograd keeps after the forward pass, other than the inputs'."""
    inputs = {a.untyped_storage().data_ptr() for a in args}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        selective_scan(*args, None, chunk_size=chunk_size)
    return sum(seen.values())


def test_chunks_keep_only_boundary_states_for_the_backward_pass() -> None:
    T, B, Dn, N, chunk = 32, 2, 16, 8, 8
    args, _ = _inputs(T, B, Dn, N)
    state_bytes = B * Dn * N * 8  # one step's state in float64
    assert _saved_bytes(0, args) >= T * state_bytes  # every step's state
    assert _saved_bytes(chunk, args) <= (T // chunk) * state_bytes  # the states at chunk boundaries


class _WrongMamba:
    """A kernel backend whose mamba forward is off by 1% (a miscompiled kernel, say)."""

    def __init__(self, ext) -> None:
        self.ext = ext

    def has_cuda(self) -> bool:
        return False

    def mamba_forward(self, *args):
        y, h, ckpt = self.ext.mamba_forward(*args)
        return y * 1.01, h, ckpt

    def __getattr__(self, name):
        return getattr(self.ext, name)


def test_layer_runs_the_chunked_form_where_the_kernel_disagrees_at_first_use(ext, monkeypatch, caplog) -> None:
    # on a device type whose first kernel use is verified (CUDA; here also the CPU) a kernel
    # that disagrees with the reference is never used by the core: 'auto' takes the chunked
    # PyTorch form after one warning, 'kernel' refuses in one line; a CUDA device without CUDA
    # kernels in the build is refused the same way
    monkeypatch.setattr(
        kernels, "_state", {"loaded": True, "ext": _WrongMamba(ext), "why": "test", "build_seconds": 0.0}
    )
    monkeypatch.setattr(dispatch, "VERIFY_DEVICE_TYPES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_verified", {})
    u = torch.zeros(3, 2, 6, dtype=D)
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        assert layer("auto", u, 4) is None and layer("auto", u, 4) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "rfwp_rl.ops"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "rfwp_rl: op 'mamba' at key size 4, value size 6 (float64, cpu) runs on the chunked PyTorch form: "
        "its first run disagrees with the reference (relative error"
    )
    with pytest.raises(UserError, match=r"^backend 'kernel' cannot run op 'mamba' at key size 4, value size 6 "):
        layer("kernel", u, 4)
    assert layer("reference", u, 4) is None
    if not ext.has_cuda():
        why = fused._refusal(ext, torch.device("cuda", 0), torch.float32, Dims(16, 256))
        assert why == "this build has CPU kernels only"
    # a kernel that agrees passes the check (once) and runs
    monkeypatch.setattr(kernels, "_state", {"loaded": True, "ext": ext, "why": "test", "build_seconds": 0.0})
    assert layer("auto", u, 4) is fused._kernel_op()
