"""``lt``: Linear Transformer, purely additive fast weights (RFWP paper Eq. 6-7).

``lt(q, k, v, W0, reset) -> (y, W)``: q, k ``[T, B, H, dk]``, v ``[T, B, H, dv]``,
W0 ``[B, H, dv, dk]``; y ``[T, B, H, dv]``, W the final fast weights.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.lt import fused, naive

OP = OpSpec(
    name="lt",
    naive=naive.lt,
    fused=fused.lt,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk,
    example_inputs=naive.example_inputs,
    state_args=(3,),
    time_args=(0, 1, 2),
    final_state=lambda out: (out[1],),
    cpu_checkpoints=False,
)  # the CPU backward rebuilds W_t from W0 in place

__all__ = ["OP", "Dims"]
