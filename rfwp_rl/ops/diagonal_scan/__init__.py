"""``diagonal_scan``: the diagonal linear recurrence of the state-space and decaying-memory
cores, ``h_t = a_t ⊙ h_{t-1} + b_t`` (LRU, Orvieto et al. 2023, Eq. 1 with a diagonal
Λ; FFM's aggregator, Morad et al. 2023; a selective SSM's discretised step, Gu & Dao 2023).

``diagonal_scan(a, b, h0, reset) -> (h, h_T)``: b ``[T, B, *S]`` (real or complex), a
broadcastable to b (``[1, 1, *S]`` for a decay that does not change with time), h0 ``[B, *S]``,
reset ``[T, B]`` bool or None (True zeroes entry b's state before step t). ``scan`` is the
parallel form (log-depth, no fused kernel: every step is elementwise), ``naive`` the loop.
"""

from rfwp_rl.ops.diagonal_scan.naive import diagonal_scan as naive
from rfwp_rl.ops.diagonal_scan.scan import diagonal_scan

__all__ = ["diagonal_scan", "naive"]
