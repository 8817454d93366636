"""``mlstm``: the matrix-memory cell of xLSTM (Beck et al., *xLSTM: Extended Long Short-Term
Memory*, NeurIPS 2024, Sec. 2.3, Eq. 19-27) with exponential input gate, sigmoid forget gate and
the stabiliser state of Sec. 2.2 (Eq. 15-17).

``mlstm_naive(q, k, v, i_pre, f_pre, C0, n0, m0, reset) -> (h, C, n, m)`` (``naive.py``, one
step per loop iteration; ``naive.mlstm_step`` is one step) and ``mlstm_chunked(..., chunk_size)``
(``chunked.py``, the parallel form of the paper's App. A inside chunks of the unroll, the state
carried between chunks; the same numbers). Shapes: q, k ``[T, B, H, dk]``, v ``[T, B, H, dv]``,
the gate pre-activations i_pre, f_pre ``[T, B, H]``, the stabilised state C0 ``[B, H, dv, dk]``,
n0 ``[B, H, dk]``, m0 ``[B, H]``; h ``[T, B, H, dv]`` (before the output gate).

Not an :class:`~rfwp_rl.ops.base.OpSpec` of :data:`rfwp_rl.ops.OPS` (that needs a fused kernel):
the chunked form is parallel in PyTorch.
"""

from rfwp_rl.ops.mlstm.chunked import mlstm_chunked
from rfwp_rl.ops.mlstm.naive import mlstm_naive, mlstm_step

__all__ = ["mlstm_chunked", "mlstm_naive", "mlstm_step"]
