"""Plain PyTorch reference of ``lstm``: one LSTM layer, one step per loop iteration, the
equations as torch.nn.LSTM documents them; autograd does the backward pass, inputs are never
modified in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rfwp_rl.ops.common import reset_steps, zero_entries

if TYPE_CHECKING:
    from rfwp_rl.ops.cases import Rand


def lstm(
    x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor, reset: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer (Hochreiter & Schmidhuber 1997, forget gate of Gers et al. 2000), with
    torch.nn.LSTM's parameters and gate order (i, f, g, o)::

        [a_i, a_f, a_g, a_o] = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
        i, f, o = σ(a_i), σ(a_f), σ(a_o);  g = tanh(a_g)
        c_t = f c_{t-1} + i g;  h_t = o tanh(c_t)

    Args:
        x: ``[T, B, I]`` inputs.
        h0, c0: ``[B, H]`` the state before step 0.
        w_ih: ``[4H, I]``, w_hh ``[4H, H]``, b_ih, b_hh ``[4H]`` (nn.LSTM's ``weight_ih_l0``,
            ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``).
        reset: ``[T, B]`` bool or None; ``reset[t, b]`` zeroes entry b's (h, c) before step t.
    Returns:
        y ``[T, B, H]`` (h_t of every step), h_T and c_T ``[B, H]``.
    """
    T = x.shape[0]
    flags = reset_steps(reset, T)
    xa = torch.nn.functional.linear(x, w_ih, b_ih + b_hh)  # the input part of every step
    h, c = h0, c0
    ys = []
    for t in range(T):
        if flags[t]:
            h, c = zero_entries(h, reset[t]), zero_entries(c, reset[t])
        i, f, g, o = (xa[t] + h @ w_hh.t()).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ys.append(h)
    y = torch.stack(ys) if ys else x.new_zeros(0, *h0.shape)
    return y, h, c


def example_inputs(rand: Rand, T: int, B: int, H: int, d: int, dk: int) -> list[Tensor]:
    """Random ``(x, h0, c0, w_ih, w_hh, b_ih, b_hh)`` with input size ``dk`` and hidden size
    ``d`` (``H`` is ignored: one layer has no heads): N(0, 1) inputs, a non-zero state, weights
    of nn.LSTM's initial scale (uniform in ±1/sqrt(d) has standard deviation 1/sqrt(3d))."""
    scale = (3 * d) ** -0.5
    return [
        rand.normal(T, B, dk),
        rand.state(B, d),
        rand.state(B, d),
        rand.normal(4 * d, dk, scale=scale),
        rand.normal(4 * d, d, scale=scale),
        rand.normal(4 * d, scale=scale),
        rand.normal(4 * d, scale=scale),
    ]
