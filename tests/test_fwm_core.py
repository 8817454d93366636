"""The ``fwm`` core on the ``fwm`` op: the fused kernel equals the reference inside the core at
the paper's meta-RL size with FWM Eq. 4's rescaling active (values and gradients of every
weight), and the incremental stepper for acting (made without gradients) equals one call.
(The contract every core passes is in test_cores.py; the op itself in tests/ops/test_fwm.py.)"""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.cores.base import CoreStepper
from rfwp_rl.cores.fwm import FWMStepper
from rfwp_rl.errors import UserError

D = torch.float64
IN = 17  # the meta-RL observation


def _paper_core(backend: str, scale: float = 3.0) -> cores.Core:
    """The meta-RL FWM (LSTM 32, m = 16, 3 reads), weights scaled so that the keys saturate and
    Eq. 4 rescales."""
    torch.manual_seed(0)
    core = cores.make("fwm", IN, backend=backend).double()
    with torch.no_grad():
        for p in core.parameters():
            p.mul_(scale)
    return core


def test_stepper_kinds(ext):
    core = cores.make("fwm", 5, hidden_size=6, memory_size=3, num_reads=2)
    assert type(core.stepper(2)) is CoreStepper  # with gradients
    with torch.no_grad():
        assert isinstance(core.stepper(2), FWMStepper)  # acting
        assert type(core.stepper(2, specialised=False)) is CoreStepper
        reference = cores.make("fwm", 5, hidden_size=6, memory_size=3, backend="reference")
        assert type(reference.stepper(2)) is CoreStepper


def test_kernel_equals_reference_in_the_core_with_active_rescaling(ext):
    x = torch.randn(30, 5, IN, dtype=D, generator=torch.Generator().manual_seed(1))
    reset = torch.zeros(30, 5, dtype=torch.bool)
    reset[11, 2] = True
    out = {}
    for backend in ("reference", "kernel"):
        core = _paper_core(backend)
        y, state = core(x, None, reset)
        w = torch.randn(y.shape, dtype=D, generator=torch.Generator().manual_seed(2))
        grads = torch.autograd.grad((y * w).sum() + state[2].sum(), list(core.parameters()))
        out[backend] = (y, state, grads)
    y, state, grads = out["kernel"]
    assert state[2].flatten(1).norm(dim=1).max().item() == pytest.approx(1.0)  # Eq. 4 was active
    torch.testing.assert_close(y, out["reference"][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(state + grads, out["reference"][1] + out["reference"][2]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_acting_stepper_equals_one_call(ext):
    core = _paper_core("auto")
    x = torch.randn(30, 5, IN, dtype=D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y, _ = core(x, None)
        stepper = core.stepper(5)
        assert isinstance(stepper, FWMStepper)
        y_steps = torch.stack([stepper.step(x[t]) for t in range(30)])
    torch.testing.assert_close(y_steps, y, rtol=1e-10, atol=1e-12)


def test_acting_stepper_refuses_gradients(ext):
    core = cores.make("fwm", 5, hidden_size=6, memory_size=3, num_reads=2)
    with torch.no_grad():
        stepper = core.stepper(2)
        stepper.step(torch.randn(2, 5))
    with pytest.raises(UserError, match="made without gradients"):
        stepper.step(torch.randn(2, 5))


def test_recording_stepper_replays_one_call_in_values_and_gradients(ext):
    # acting with record keeps what the fused backward passes need; the replay is the core's
    # output over the steps with the gradients of one call (paper size, Eq. 4 active, float64)
    core = _paper_core("kernel")
    x = torch.randn(30, 5, IN, dtype=D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        stepper = core.stepper(5, record=True)
        y_steps = torch.stack([stepper.step(x[t]) for t in range(30)])
    y = stepper.replay()
    y_ref, _ = core(x, None)
    torch.testing.assert_close(y, y_steps, rtol=1e-12, atol=1e-14)  # the steps' numbers (W_o n in one GEMM)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(y.shape, dtype=D, generator=torch.Generator().manual_seed(5))
    for a, b in zip(
        torch.autograd.grad((y * w).sum(), list(core.parameters())),
        torch.autograd.grad((y_ref * w).sum(), list(core.parameters())),
    ):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    with torch.no_grad():
        plain = core.stepper(5)
        plain.step(x[0])
    assert plain.replay() is None  # no record asked for
    reference = cores.make("fwm", IN, backend="reference")
    with torch.no_grad():
        assert reference.stepper(5, record=True).replay() is None  # generic stepper
