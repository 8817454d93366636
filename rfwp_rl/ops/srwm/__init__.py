"""``srwm``: the modern self-referential weight matrix (Irie, Schlag, Csordás, Schmidhuber,
ICML 2022, Eq. 5-8): one fast matrix per head generates its own output, query, key and
learning rates and modifies itself with the delta rule.

``srwm(x, W_init, dW0, reset, *, feature_map=None) -> (y, dW)``: x ``[T, B, H, D]``
(through φ), W_init ``[H, 3d + 4, D]``, dW0 ``[B, H, 3d + 4, D]`` (the state: the change
from W_init); y ``[T, B, H, d]``.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.srwm import fused, naive

OP = OpSpec(
    name="srwm",
    naive=naive.srwm,
    fused=fused.srwm,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: naive.rows(dims.dv) * dims.dk,
    example_inputs=naive.example_inputs,
    state_args=(2,),
    time_args=(0,),
    final_state=lambda out: (out[1],),
    key_size_free=False,
)

__all__ = ["OP", "Dims"]
