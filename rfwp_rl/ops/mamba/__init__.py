"""``mamba``: the selective state-space model (S6) of Mamba (Gu & Dao 2023, *Mamba:
Linear-Time Sequence Modeling with Selective State Spaces*, Eq. 2a-2b and 4, Algorithm 2):
per channel d and state index n, ``h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t``,
``y_t = C_t · h_t``.

``selective_scan(u, delta, A, B, C, h0, reset, chunk_size, parallel) -> (y, h_T)``: u, delta
``[T, B, D]``, A ``[D, N]``, B, C ``[T, B, N]``, h0 ``[B, D, N]``, reset ``[T, B]`` bool or
None; y ``[T, B, D]``. ``selective_scan`` (:mod:`.chunked`) runs chunks of steps, each
recomputed in the backward pass, so the states of all steps are never kept; ``naive`` is the
loop. No fused kernel: every step is elementwise.
"""

from rfwp_rl.ops.mamba.chunked import selective_scan
from rfwp_rl.ops.mamba.naive import selective_scan as naive

__all__ = ["naive", "selective_scan"]
