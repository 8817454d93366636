"""``rdn``: Recurrent Delta Net, k, v, q, β also see tanh(y_prev) (RFWP paper Eq. 15-18).

``rdn(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0, reset, *, feature_map=None) -> (y, W)``: the
slow projections xq, xk, xv ``[T, B, H, d]``, xb ``[T, B, H]``; recurrent slow weights
Rq, Rk, Rv ``[H, d, d]``, rb ``[H, d]``; W0 ``[B, H, d, d]``, y0 ``[B, H, d]``.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.rdn import fused, naive

OP = OpSpec(
    name="rdn",
    naive=naive.rdn,
    fused=fused.rdn,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk,
    example_inputs=naive.example_inputs,
    state_args=(8, 9),
    time_args=(0, 1, 2, 3),
    final_state=lambda out: (out[1], out[0][-1]),
    key_size_free=False,
)

__all__ = ["OP", "Dims"]
