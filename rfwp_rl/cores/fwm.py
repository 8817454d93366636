"""``fwm``: Fast Weight Memory, an LSTM controlling a third-order fast tensor (FWM paper §3.1).

Per step t, from the LSTM output h_t (``m`` = memory_size, ``N_r`` = num_reads):

- write (FWM paper Eq. 1-4)::

      [k1, k2, v] = tanh(W_write h_t)            k1, k2, v in R^m          (Eq. 1)
      β = σ(W_β h_t)                                                       (Eq. 2)
      v_old = F_{t-1} · vec(k1 ⊗ k2)                                       (§3.1.1)
      F' = F_{t-1} + β vec(k1 ⊗ k2) ⊗ (v - v_old)                          (Eq. 3)
      F_t = F' / max(1, ||F'||)   (norm over the whole tensor of each entry) (Eq. 4)

- read (FWM paper Eq. 5-8)::

      n_0 = tanh(W_n h_t);  e_i = tanh(W_e^i h_t)                          (Eq. 5-6)
      n_i = LN(F_t · vec(n_{i-1} ⊗ e_i)),  i = 1..N_r  (LN without affine) (Eq. 7)
      y_t = h_t + W_o n_{N_r}        (the residual from h is in §3.1)      (Eq. 8)

Choices (documented because the paper leaves them open or the reference code differs):

- The write happens before the read at the same step: the paper reads with ``F_t``, the
  tensor that already contains step t's write (Eq. 3-4 define F_t, Eq. 7 reads F_t); the
  published code does the same.
- All linear maps have biases (the paper writes W h; the published code uses biased
  ``nn.Linear``). The bias of β starts at +1, which is what the published code's
  ``sigmoid(W_β h + 1)`` amounts to at initialisation.
- As the paper states (Eq. 5-6), the read keys pass through tanh. (The published meta-RL
  code feeds them raw and scales every write by 1/m; neither is in the paper; not done here.)

``F`` is stored as ``[B, m, m, m]`` indexed (first key, second key, value).
Slow projections (W_write, W_β, W_n, W_e^i) are computed for the whole unroll at once;
only the fast tensor is updated in the Python loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfwp_rl.cores.base import (Core, CoreSpec, State, check_bool, check_positive_int,
                                reset_steps, zero_entries)
from rfwp_rl.cores.lstm import run_lstm

SPEC = CoreSpec(
    name="fwm",
    description="Fast Weight Memory: LSTM + third-order fast tensor [m, m, m] with "
                "num_reads chained reads; y = h + W_o n",
    equations="FWM paper Eq. 1-8 (§3.1)",
    defaults={"hidden_size": 32, "memory_size": 16, "num_reads": 3,
              "detach_state_every_step": False},
)


def fwm_write(Fm: Tensor, k1: Tensor, k2: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """One FWM write (FWM paper Eq. 3-4). Fm ``[B,m,m,m]``, k1/k2/v ``[B,m]``, beta ``[B]``.

    With F viewed as a matrix ``[B, m*m, m]`` (rows vec(k1 ⊗ k2), columns values) the write
    is a rank-one update and the lookup of v_old a vector-matrix product.
    """
    B, m = v.shape
    key = (k1[:, :, None] * k2[:, None, :]).reshape(B, 1, m * m)       # vec(k1 ⊗ k2)
    Fmat = Fm.reshape(B, m * m, m)
    v_old = torch.bmm(key, Fmat)                                        # [B, 1, m]
    dv = beta[:, None, None] * (v[:, None, :] - v_old)                  # β (v - v_old)
    Fp = torch.baddbmm(Fmat, key.transpose(1, 2), dv)                   # Eq. 3
    scale = torch.linalg.vector_norm(Fp, dim=(1, 2)).clamp(min=1.0)    # max(1, ||F'||)
    return (Fp * scale.reciprocal()[:, None, None]).view(B, m, m, m)    # Eq. 4


def fwm_read(Fm: Tensor, n: Tensor, es: Tensor) -> Tensor:
    """Chained reads (FWM paper Eq. 7). Fm ``[B,m,m,m]``, n ``[B,m]``, es ``[B,N_r,m]`` -> ``[B,m]``.

    ``n_i = LN(F vec(n_{i-1} ⊗ e_i))`` with LayerNorm without affine parameters.
    """
    B, m = n.shape
    Fmat = Fm.reshape(B, m * m, m)
    for i in range(es.shape[1]):
        query = (n[:, :, None] * es[:, None, i, :]).reshape(B, 1, m * m)  # vec(n ⊗ e_i)
        n = torch.bmm(query, Fmat).squeeze(1)
        n = F.layer_norm(n, (m,))
    return n


class FWMCore(Core):
    """x ``[T, B, input_size]`` -> y ``[T, B, hidden_size]``.

    State ``(h, c, F)``: h, c ``[B, hidden_size]`` (one LSTM layer), F ``[B, m, m, m]``.
    """

    name = "fwm"

    def __init__(self, input_size: int, hidden_size: int = 32, memory_size: int = 16,
                 num_reads: int = 3, detach_state_every_step: bool = False) -> None:
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.m = check_positive_int("memory_size", memory_size)
        self.num_reads = check_positive_int("num_reads", num_reads)
        self.detach_state_every_step = check_bool("detach_state_every_step",
                                                  detach_state_every_step)
        self.config = {"hidden_size": hidden_size, "memory_size": memory_size,
                       "num_reads": num_reads, "detach_state_every_step": detach_state_every_step}
        m = memory_size
        self.lstm = nn.LSTM(input_size, hidden_size)
        self.write = nn.Linear(hidden_size, 3 * m + 1)            # [W_write; W_β], Eq. 1-2
        self.read = nn.Linear(hidden_size, (1 + num_reads) * m)   # [W_n; W_e^1..N_r], Eq. 5-6
        self.out = nn.Linear(m, hidden_size)                      # W_o, Eq. 8
        with torch.no_grad():
            self.write.bias[3 * m].fill_(1.0)                     # β starts near σ(1)

    def project(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Slow projections of LSTM outputs ``h [..., hidden_size]``.

        Returns the write keys and value k1, k2, v ``[..., m]``, the write strength β ``[...]``
        and the read keys r ``[..., 1 + num_reads, m]`` (r[..., 0] = n_0, r[..., i] = e_i).
        """
        m = self.m
        w = self.write(h)
        k1, k2, v = torch.tanh(w[..., :3 * m]).split(m, dim=-1)     # FWM Eq. 1
        beta = torch.sigmoid(w[..., 3 * m])                          # FWM Eq. 2
        r = torch.tanh(self.read(h)).unflatten(-1, (1 + self.num_reads, m))  # FWM Eq. 5-6
        return k1, k2, v, beta, r

    def stepper(self, batch_size: int, device: torch.device | str | None = None,
                specialised: bool = True):
        """The exact low-rank stepper (:mod:`rfwp_rl.cores.fwm_factored`) unless
        ``specialised`` is False or the core detaches its state every step."""
        if specialised and not self.detach_state_every_step:
            from rfwp_rl.cores.fwm_factored import FactoredFWMStepper
            return FactoredFWMStepper(self, batch_size, device)
        return super().stepper(batch_size, device)

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        B, m = batch_size, self.m
        return [(B, self.hidden_size), (B, self.hidden_size), (B, m, m, m)]

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        T = x.shape[0]
        h0, c0, Fm = state
        hs, h, c = run_lstm(self.lstm, x, h0[None].contiguous(), c0[None].contiguous(), reset)
        k1, k2, v, beta, r = self.project(hs)                        # whole unroll at once
        flags = reset_steps(reset, T)
        ns = []
        for t in range(T):
            if flags[t]:
                Fm = zero_entries(Fm, reset[t])
            Fm = fwm_write(Fm, k1[t], k2[t], v[t], beta[t])          # FWM Eq. 3-4
            ns.append(fwm_read(Fm, r[t, :, 0], r[t, :, 1:]))         # FWM Eq. 7
        y = hs + self.out(torch.stack(ns))                           # FWM Eq. 8 + residual
        return y, (h[0], c[0], Fm)
