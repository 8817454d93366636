"""``delta_rnn``: Delta RNN version B, y = W q + R softmax(y_prev) (RFWP paper Eq. 12).

``delta_rnn(q, k, v, beta, kr, vr, beta_r, W0, R0, y0, reset) -> (y, W, R)``: as ``delta``
plus kr, vr ``[T, B, H, d]``, beta_r ``[T, B, H]``, R0 ``[B, H, d, d]``, y0 ``[B, H, d]``.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.delta_rnn import fused, naive

OP = OpSpec(
    name="delta_rnn",
    naive=naive.delta_rnn,
    fused=fused.delta_rnn,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk + dims.dv * dims.dv,
    example_inputs=naive.example_inputs,
    state_args=(7, 8, 9),
    time_args=(0, 1, 2, 3, 4, 5, 6),
    final_state=lambda out: (out[1], out[2], out[0][-1]),
)

__all__ = ["OP", "Dims"]
