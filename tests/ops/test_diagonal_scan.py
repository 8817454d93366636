"""The diagonal linear recurrence: the parallel scan against the loop, the loop against
hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl.ops.diagonal_scan import diagonal_scan, naive

D = torch.float64
C = torch.complex128


def test_loop_matches_hand_computed_case() -> None:
    # h_t = a h_{t-1} + b_t with a = 0.5, h0 = 2, b = (1, 3, 5), reset before the last step
    a = torch.tensor([[[0.5]]], dtype=D)
    b = torch.tensor([1.0, 3.0, 5.0], dtype=D).view(3, 1, 1)
    h0 = torch.tensor([[2.0]], dtype=D)
    reset = torch.tensor([[False], [False], [True]])
    h, last = naive(a, b, h0, reset)
    # 0.5*2+1 = 2; 0.5*2+3 = 4; reset: 0.5*0+5 = 5
    assert h.flatten().tolist() == [2.0, 4.0, 5.0]
    assert last.item() == 5.0
    h, _ = naive(a, b, h0, None)
    assert h.flatten().tolist() == [2.0, 4.0, 7.0]


def test_loop_complex_rotation() -> None:
    # a = i rotates the state by 90 degrees each step: h = i*1 + 0 = i, then i*i = -1
    a = torch.tensor([[[1j]]], dtype=C)
    b = torch.zeros(2, 1, 1, dtype=C)
    h, _ = naive(a, b, torch.ones(1, 1, dtype=C), None)
    assert torch.allclose(h.flatten(), torch.tensor([1j, -1.0], dtype=C))


@pytest.mark.parametrize("T", [1, 2, 5, 8, 13, 32])
@pytest.mark.parametrize("dtype", [D, C])
@pytest.mark.parametrize("decay", ["constant", "per_step"])
def test_scan_matches_loop(T: int, dtype: torch.dtype, decay: str) -> None:
    g = torch.Generator().manual_seed(T)
    B, S = 3, (2, 4)
    real = torch.float64

    def rnd(*shape: int) -> torch.Tensor:
        x = torch.randn(*shape, generator=g, dtype=real)
        return torch.complex(x, torch.randn(*shape, generator=g, dtype=real)) if dtype == C else x

    shape = (1, 1, *S) if decay == "constant" else (T, B, *S)
    mag = 0.2 + 0.79 * torch.rand(*shape, generator=g, dtype=real)
    a = mag * torch.exp(1j * torch.randn(*shape, generator=g, dtype=real)) if dtype == C else mag
    a = a.requires_grad_()
    b = rnd(T, B, *S).requires_grad_()
    h0 = rnd(B, *S).requires_grad_()
    reset = torch.rand(T, B, generator=g) < 0.25
    reset[T // 2, 0] = True  # a reset mid-sequence for at least one entry

    h, last = diagonal_scan(a, b, h0, reset)
    h_ref, last_ref = naive(a, b, h0, reset)
    assert torch.allclose(h, h_ref, atol=1e-12) and torch.equal(last, h[-1])
    w = rnd(T, B, *S)
    grads = torch.autograd.grad((h * w).real.sum(), (a, b, h0))
    grads_ref = torch.autograd.grad((h_ref * w).real.sum(), (a, b, h0))
    for x, y in zip(grads, grads_ref):
        assert torch.allclose(x, y, atol=1e-11)


def test_reset_cuts_the_past_and_its_gradient() -> None:
    a = torch.full((1, 1, 1), 0.9, dtype=D)
    b = torch.ones(4, 2, 1, dtype=D, requires_grad=True)
    h0 = torch.full((2, 1), 10.0, dtype=D, requires_grad=True)
    reset = torch.tensor([[False, True], [False, False], [True, False], [False, False]])
    h, _ = diagonal_scan(a, b, h0, reset)
    g_b, g_h0 = torch.autograd.grad(h[3, 0].sum() + h[0, 1].sum(), (b, h0))
    # entry 0 resets before step 2: steps 0, 1 and h0 do not reach h[3, 0]
    assert g_b[0, 0].item() == 0.0 and g_b[1, 0].item() == 0.0 and g_h0[0].item() == 0.0
    assert g_b[2, 0].item() == pytest.approx(0.9) and g_b[3, 0].item() == 1.0
    # entry 1 resets before step 0: h0 does not reach it
    assert g_h0[1].item() == 0.0


@pytest.mark.parametrize("T", [1, 3, 8, 11])
def test_prefix_scan_equals_the_loop(T: int) -> None:
    # the loop runs on the CPU, the log-depth scan on other devices: both must give the same states
    from rfwp_rl.ops.diagonal_scan.scan import recurrence_loop, recurrence_prefix_scan

    g = torch.Generator().manual_seed(T)
    a = torch.complex(torch.rand(T, 2, 3, generator=g, dtype=D), torch.rand(T, 2, 3, generator=g, dtype=D)) * 0.7
    a[T // 2, 1] = 0  # a reset
    b = torch.randn(T, 2, 3, generator=g, dtype=C)
    h0 = torch.randn(2, 3, generator=g, dtype=C)
    assert torch.allclose(recurrence_prefix_scan(a, b, h0), recurrence_loop(a, b, h0), atol=1e-13)


@pytest.mark.parametrize("dtypes", [(D, D, D), (C, C, C), (D, C, C)])
def test_gradcheck(dtypes: tuple[torch.dtype, torch.dtype, torch.dtype]) -> None:
    g = torch.Generator().manual_seed(7)
    a = (0.5 * torch.rand(5, 2, 3, generator=g, dtype=D)).to(dtypes[0]).requires_grad_()
    b = torch.randn(5, 2, 3, generator=g, dtype=dtypes[1]).requires_grad_()
    h0 = torch.randn(2, 3, generator=g, dtype=dtypes[2]).requires_grad_()
    reset = torch.tensor([[False, False], [False, True], [False, False], [True, False], [False, False]])
    assert torch.autograd.gradcheck(lambda a, b, h0: diagonal_scan(a, b, h0, reset)[0], (a, b, h0))
