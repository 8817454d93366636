"""``fwm``: Fast Weight Memory, a third-order fast tensor written by the FWM paper's update
rule and read N_r times in a chain (Schlag, Munkhdalai, Schmidhuber, ICLR 2021, Eq. 3-4, 7).

``fwm(k1, k2, v, beta, n0, e, F0, reset) -> (y, F)``: k1, k2, v, n0 ``[T, B, H, m]``, beta
``[T, B, H]``, e ``[T, B, H, N_r, m]``, F0 ``[B, H, m, m, m]``; y ``[T, B, H, m]`` (the last
read of every step). Fused on CPU only (CUDA inputs run on the reference).

``stepper(F0, backend) -> Stepper | None``: the fused forward one step at a time without
gradients (acting), from ``F0 [B, H, m, m, m]``; None where it does not run.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.fwm import fused, naive
from rfwp_rl.ops.fwm.fused import stepper

OP = OpSpec(
    name="fwm", naive=naive.fwm, fused=fused.fwm, supported=fused.supported,
    dims_of=fused.dims_of, state_elems=lambda dims: dims.dv ** 3,
    example_inputs=naive.example_inputs, state_args=(fused.F0_ARG,), time_args=(0, 1, 2, 3, 4, 5),
    final_state=lambda out: (out[1],), key_size_free=False, cpu_checkpoints=False)

__all__ = ["OP", "Dims", "stepper"]
