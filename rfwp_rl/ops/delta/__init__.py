"""``delta``: Delta Net, fast weights written by the delta rule (RFWP paper Eq. 8-10).

``delta(q, k, v, beta, W0, reset) -> (y, W)``: as ``lt`` plus beta ``[T, B, H]``.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.delta import fused, naive

OP = OpSpec(
    name="delta",
    naive=naive.delta,
    fused=fused.delta,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk,
    example_inputs=naive.example_inputs,
    state_args=(4,),
    time_args=(0, 1, 2, 3),
    final_state=lambda out: (out[1],),
)

__all__ = ["OP", "Dims"]
