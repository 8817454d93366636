"""``gated_delta``: the gated delta rule of Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR
2025, Eq. 10): a data-dependent decay α_t of the state, then a delta-rule write.

``gated_delta(q, k, v, alpha, beta, S0, reset) -> (o, S)``: q, k ``[T, B, H, dk]``,
v ``[T, B, H, dv]``, alpha, beta ``[T, B, H]``, S0 ``[B, H, dv, dk]``.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.gated_delta import fused, naive

OP = OpSpec(
    name="gated_delta",
    naive=naive.gated_delta,
    fused=fused.gated_delta,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk,
    example_inputs=naive.example_inputs,
    state_args=(5,),
    time_args=(0, 1, 2, 3, 4),
    final_state=lambda out: (out[1],),
)

__all__ = ["OP", "Dims"]
