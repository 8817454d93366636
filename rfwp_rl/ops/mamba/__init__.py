"""``mamba``: the selective state-space model (S6) of Mamba (Gu & Dao 2023, *Mamba:
Linear-Time Sequence Modeling with Selective State Spaces*, Eq. 2a-2b and 4, Algorithm 2):
per channel d and state index n, ``h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t``,
``y_t = C_t · h_t``.

``mamba(u, delta, A, B, C, h0, reset) -> (y, h_T)``: u, delta ``[T, B, D]``, A ``[D, N]``,
B, C ``[T, B, N]``, h0 ``[B, D, N]``, reset ``[T, B]`` bool or None; y ``[T, B, D]``. Its
:class:`~rfwp_rl.ops.base.Dims` are the state size N (``dk``) and the channels D (``dv``).
``naive`` is the loop; the fused kernel runs on the CPU and on CUDA (``fused.py``; the CUDA
kernel ``csrc/cuda/selective_scan.cu`` has no size limit);
``selective_scan(..., chunk_size, parallel)`` (:mod:`.chunked`) is the PyTorch form the core
runs elsewhere: chunks of steps, each recomputed in the backward pass, the recurrence inside a
chunk as a loop with its adjoint written out or as the parallel scan.
``layer(backend, like, state_size) -> op | None``: the fused op where it runs inputs like
``like`` with ``state_size`` state values per channel, else None (the caller runs
``selective_scan``).
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.mamba import fused
from rfwp_rl.ops.mamba import naive as _naive
from rfwp_rl.ops.mamba.chunked import selective_scan
from rfwp_rl.ops.mamba.fused import layer

naive = _naive.selective_scan

OP = OpSpec(
    name="mamba",
    naive=_naive.selective_scan,
    fused=fused.selective_scan,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: dims.dv * dims.dk,
    example_inputs=_naive.example_inputs,
    state_args=(5,),
    time_args=(0, 1, 3, 4),
    final_state=lambda out: (out[1],),
)

__all__ = ["OP", "Dims", "layer", "naive", "selective_scan"]
