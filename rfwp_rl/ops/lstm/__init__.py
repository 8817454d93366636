"""``lstm``: one LSTM layer (Hochreiter & Schmidhuber 1997, forget gate of Gers et al. 2000)
with torch.nn.LSTM's parameters and gate order, so that the cores can run it instead of
``nn.LSTM`` without changing their state dicts.

``lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, reset) -> (y, h_T, c_T)``: x ``[T, B, I]``,
h0, c0 ``[B, H]``, w_ih ``[4H, I]``, w_hh ``[4H, H]``, b_ih, b_hh ``[4H]``; y ``[T, B, H]``.
Fused on CPU only (CUDA inputs run on the reference; the cores use cuDNN's nn.LSTM there).
Its :class:`~rfwp_rl.ops.base.Dims` are the input size (``dk``) and the hidden size (``dv``).

``layer(backend, like, hidden_size) -> op | None``: the fused op where it runs inputs like
``like`` (and, for backend ``'auto'``, where it is the faster: hidden sizes up to
``fused.AUTO_MAX_HIDDEN``), else None (the caller runs ``nn.LSTM``).
``recorder(backend, like, hidden_size, h0, c0) -> Recorder | None``: steps without gradients
that keep what the backward needs, then ``replay``: their outputs as one autograd node.
"""

from rfwp_rl.ops.base import Dims, OpSpec
from rfwp_rl.ops.lstm import fused, naive
from rfwp_rl.ops.lstm.fused import layer, recorder

OP = OpSpec(
    name="lstm",
    naive=naive.lstm,
    fused=fused.lstm,
    supported=fused.supported,
    dims_of=fused.dims_of,
    state_elems=lambda dims: 2 * dims.dv,
    example_inputs=naive.example_inputs,
    state_args=(fused.H0_ARG, fused.C0_ARG),
    time_args=(0,),
    final_state=lambda out: (out[1], out[2]),
    key_size_free=True,
    cpu_checkpoints=False,
)

__all__ = ["OP", "Dims", "layer", "recorder"]
