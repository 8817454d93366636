"""The ``fwm`` core's exact low-rank stepper (rfwp_rl.cores.fwm_factored) against its dense
form. (The generic stepping contract of every core is tested in test_cores.py.)"""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.cores.fwm_factored import FactoredFWMStepper

D = torch.float64
IN = 5


def test_fwm_stepper_kinds():
    core = cores.make("fwm", IN, hidden_size=6, memory_size=3, num_reads=2)
    assert isinstance(core.stepper(2), FactoredFWMStepper)
    assert not isinstance(core.stepper(2, specialised=False), FactoredFWMStepper)
    detached = cores.make("fwm", IN, hidden_size=4, memory_size=3, detach_state_every_step=True)
    assert not isinstance(detached.stepper(2), FactoredFWMStepper)   # needs the full BPTT graph
    with pytest.raises(ValueError, match="detach_state_every_step"):
        FactoredFWMStepper(detached, 2)


def test_factored_fwm_equals_dense_core_with_active_norm_clamp():
    """The paper-sized meta-RL core (m = 16, 3 reads) over a full 30-step episode, with weights
    large enough that the keys saturate and FWM Eq. 4's rescaling is active."""
    torch.manual_seed(0)
    core = cores.make("fwm", 17).double()
    with torch.no_grad():
        for p in core.parameters():
            p.mul_(3)
    x = torch.randn(30, 5, 17, dtype=D)
    y, state = core(x, None)
    assert state[2].flatten(1).norm(dim=1).max().item() == pytest.approx(1.0)   # Eq. 4 was active
    stepper = core.stepper(5)
    y2 = torch.stack([stepper.step(x[t]) for t in range(30)])
    torch.testing.assert_close(y2, y, rtol=1e-9, atol=1e-9)
    dense_F = torch.einsum("tbi,tbj,tbk->bijk", stepper.k1, stepper.k2, stepper.z)
    torch.testing.assert_close(dense_F, state[2], rtol=1e-9, atol=1e-12)
    w = torch.randn_like(y)
    g1 = torch.autograd.grad((y * w).sum(), list(core.parameters()))
    stepper = core.stepper(5)
    y2 = torch.stack([stepper.step(x[t]) for t in range(30)])
    g2 = torch.autograd.grad((y2 * w).sum(), list(core.parameters()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a, rtol=1e-7, atol=1e-9)
