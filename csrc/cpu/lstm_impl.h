// CPU LSTM layer: the pointwise part of one step, forward and backward, for rows [b0, b1) of
// the batch. No torch: the matrix products (the input projection of all steps, the recurrent
// product of each step, the weight gradients over all steps) are GEMMs in the binding
// (bindings.cpp, lstm section), which calls these between them.
//
// Equations (Hochreiter & Schmidhuber 1997, with the forget gate of Gers et al. 2000), as
// torch.nn.LSTM documents them, gate order i, f, g, o of its weights:
//   a = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          [4H]: a_i, a_f, a_g, a_o
//   i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o)
//   c_t = f c_{t-1} + i g,   h_t = o tanh(c_t)
// reset[t, b] zeroes entry b's (h, c) before step t: the binding zeroes the rows of h_{t-1}
// that enter the recurrent product, the step reads c_{t-1} of those rows as 0, and the backward
// passes no gradient into them.
//
// Layouts: gates [B][4H] (the four blocks of H per row, nn.LSTM's order), states [B][H].
// Activations use cpu/vec_math.h so that the loops over a row vectorise.
#pragma once

#include <cstdint>

#include "vec_math.h"

namespace rfwp {
namespace cpu {

// One forward step. gates: the pre-activations a of step t, overwritten by the activations
// (i, f, g, o), which the backward reads. c_prev: c_{t-1} (rows with reset[b] read as 0);
// c, h: c_t and h_t.
template <typename S>
void lstm_step_forward(S* __restrict__ gates, const S* __restrict__ c_prev,
                       const uint8_t* reset, S* __restrict__ c, S* __restrict__ h, int b0,
                       int b1, int H) {
  for (int b = b0; b < b1; ++b) {
    S* a = gates + static_cast<int64_t>(b) * 4 * H;
    const S* cp = c_prev + static_cast<int64_t>(b) * H;
    S* cb = c + static_cast<int64_t>(b) * H;
    S* hb = h + static_cast<int64_t>(b) * H;
    const S keep = (reset != nullptr && reset[b]) ? S(0) : S(1);
#pragma omp simd
    for (int j = 0; j < H; ++j) {
      const S i = vsigmoid(a[j]), f = vsigmoid(a[H + j]);
      const S g = vtanh(a[2 * H + j]), o = vsigmoid(a[3 * H + j]);
      const S ct = f * (keep * cp[j]) + i * g;
      a[j] = i;
      a[H + j] = f;
      a[2 * H + j] = g;
      a[3 * H + j] = o;
      cb[j] = ct;
      hb[j] = o * vtanh(ct);
    }
  }
}

// One backward step (reverse mode of the forward step). acts: the activations (i, f, g, o) of
// step t; c: c_t; c_prev: c_{t-1} (rows with reset[b] read as 0); gy: ∂L/∂h_t from the
// outputs (null: 0); dh: ∂L/∂h_t through step t + 1 (W_hhᵀ da_{t+1}, zero after the last
// step), not used in rows with reset_next[b] (the flags of step t + 1; null: none), and
// overwritten by the whole ∂L/∂h_t; dc: ∂L/∂c_t through step t + 1 (zero in those rows
// already), replaced by ∂L/∂c_{t-1}. Writes da, the pre-activation gradients of step t.
template <typename S>
void lstm_step_backward(const S* __restrict__ acts, const S* __restrict__ c,
                        const S* __restrict__ c_prev, const uint8_t* reset,
                        const uint8_t* reset_next, const S* __restrict__ gy, S* __restrict__ dh,
                        S* __restrict__ dc, S* __restrict__ da, int b0, int b1, int H) {
  for (int b = b0; b < b1; ++b) {
    const int64_t r4 = static_cast<int64_t>(b) * 4 * H, r = static_cast<int64_t>(b) * H;
    const S* a = acts + r4;
    S* d = da + r4;
    S* dhb = dh + r;
    S* dcb = dc + r;
    const S* cb = c + r;
    const S* cp = c_prev + r;
    // the whole ∂L/∂h_t first, so that the main loop has no branch and vectorises
    const S through = (reset_next != nullptr && reset_next[b]) ? S(0) : S(1);
    if (gy != nullptr) {
      const S* gyb = gy + r;
#pragma omp simd
      for (int j = 0; j < H; ++j) dhb[j] = through * dhb[j] + gyb[j];
    } else if (through == S(0)) {
      for (int j = 0; j < H; ++j) dhb[j] = S(0);
    }
    const S keep = (reset != nullptr && reset[b]) ? S(0) : S(1);
#pragma omp simd
    for (int j = 0; j < H; ++j) {
      const S i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
      const S ghj = dhb[j];
      const S tc = vtanh(cb[j]);
      const S gc = dcb[j] + ghj * o * (S(1) - tc * tc);
      d[j] = gc * g * i * (S(1) - i);                  // ∂/∂a_i
      d[H + j] = gc * keep * cp[j] * f * (S(1) - f);   // ∂/∂a_f
      d[2 * H + j] = gc * i * (S(1) - g * g);          // ∂/∂a_g
      d[3 * H + j] = ghj * tc * o * (S(1) - o);        // ∂/∂a_o
      dcb[j] = keep * gc * f;                          // ∂L/∂c_{t-1}; none across a reset
    }
  }
}

}  // namespace cpu
}  // namespace rfwp
