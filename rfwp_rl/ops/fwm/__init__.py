"""``fwm``: Fast Weight Memory, a third-order fast tensor written by the FWM paper's update
rule and read N_r times in a chain (Schlag, Munkhdalai, Schmidhuber, ICLR 2021, Eq. 3-4, 7).

``fwm(w, r, F0, reset) -> (y, F)``: the controller's slow projections w ``[T, B, H, 3m + 1]``
(write keys and value, then the strength, before tanh / σ) and r ``[T, B, H, (1 + N_r) m]``
(read keys before tanh), F0 ``[B, H, m, m, m]``; y ``[T, B, H, m]`` (the last read of every
step). Fused on CPU only (CUDA inputs run on the reference).

``stepper(B, H, m, like, F0=None, backend="auto") -> Stepper | None``: the fused forward one
step at a time without gradients (acting), from ``F0 [B, H, m, m, m]`` (None: zero) in the
dtype and device of ``like``; None where it does not run.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.fwm import fused, naive
from rfwp_rl.ops.fwm.fused import stepper

OP = OpSpec(
    name="fwm",
    naive=naive.fwm,
    fused=fused.fwm,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv**3,
    example_inputs=naive.example_inputs,
    state_args=(fused.F0_ARG,),
    time_args=(0, 1),
    final_state=lambda out: (out[1],),
    key_size_free=False,
    cpu_checkpoints=False,
)

__all__ = ["OP", "Dims", "stepper"]
