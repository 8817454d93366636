"""``delta_product``: DeltaProduct (Siems et al., NeurIPS 2025), n_h delta-rule steps per
input (a product of n_h generalised Householder matrices as the state transition).

``delta_product(q, k, v, beta, S0, reset) -> (o, S)``: q ``[T, B, H, dk]``,
k ``[T, B, H, n_h, dk]``, v ``[T, B, H, n_h, dv]``, beta ``[T, B, H, n_h]``,
S0 ``[B, H, dv, dk]``.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.delta_product import fused, naive

OP = OpSpec(
    name="delta_product",
    naive=naive.delta_product,
    fused=fused.delta_product,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk,
    example_inputs=naive.example_inputs,
    state_args=(4,),
    time_args=(0, 1, 2, 3),
    final_state=lambda out: (out[1],),
)

__all__ = ["OP", "Dims"]
