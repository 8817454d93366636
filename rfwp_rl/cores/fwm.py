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

``F`` is stored as ``[B, m, m, m]`` indexed (first key, second key, value). The LSTM and the
slow projections (W_write, W_β, W_n, W_e^i) run on the whole unroll at once; tanh / σ of Eq. 1-2,
5-6, the write and the reads are the ``fwm`` op (:mod:`rfwp_rl.ops.fwm`: its PyTorch reference,
or its fused CPU kernel, chosen once at construction by ``backend`` as for the other cores). Acting one step at
a time without gradients (``stepper`` under ``torch.no_grad()``) uses the op's incremental
stepper, which appends one low-rank term per step instead of rewriting the dense tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rfwp_rl import ops
from rfwp_rl.cores.base import Core, CoreSpec, CoreStepper, State, check_backend, check_bool, check_positive_int
from rfwp_rl.cores.lstm import run_lstm
from rfwp_rl.errors import UserError
from rfwp_rl.ops import fwm as fwm_op
from rfwp_rl.ops import lstm as lstm_op

SPEC = CoreSpec(
    name="fwm",
    description="Fast Weight Memory: LSTM + third-order fast tensor [m, m, m] with "
    "num_reads chained reads; y = h + W_o n",
    equations="FWM paper Eq. 1-8 (§3.1)",
    defaults={
        "hidden_size": 32,
        "memory_size": 16,
        "num_reads": 3,
        "detach_state_every_step": False,
        "backend": "auto",
    },
)


class FWMCore(Core):
    """x ``[T, B, input_size]`` -> y ``[T, B, hidden_size]``.

    State ``(h, c, F)``: h, c ``[B, hidden_size]`` (one LSTM layer), F ``[B, m, m, m]``.
    """

    name = "fwm"
    act_without_gradients = True  # the incremental stepper: O(t m) per step, no dense tensor

    def __init__(
        self,
        input_size: int,
        hidden_size: int = 32,
        memory_size: int = 16,
        num_reads: int = 3,
        detach_state_every_step: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.output_size = self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.m = check_positive_int("memory_size", memory_size)
        self.num_reads = check_positive_int("num_reads", num_reads)
        self.detach_state_every_step = check_bool("detach_state_every_step", detach_state_every_step)
        self.backend = check_backend(backend)
        self.config = {
            "hidden_size": hidden_size,
            "memory_size": memory_size,
            "num_reads": num_reads,
            "detach_state_every_step": detach_state_every_step,
            "backend": backend,
        }
        m = memory_size
        self.lstm = nn.LSTM(input_size, hidden_size)
        self.write = nn.Linear(hidden_size, 3 * m + 1)  # [W_write; W_β], Eq. 1-2
        self.read = nn.Linear(hidden_size, (1 + num_reads) * m)  # [W_n; W_e^1..N_r], Eq. 5-6
        self.out = nn.Linear(m, hidden_size)  # W_o, Eq. 8
        with torch.no_grad():
            self.write.bias[3 * m].fill_(1.0)  # β starts near σ(1)
        # with backend 'kernel' a one-line error now if the fused kernel cannot run these sizes
        self.op = ops.resolve("fwm", backend, ops.Dims(dk=m, dv=m))

    def project(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """The slow projections of LSTM outputs ``h [..., hidden_size]`` as the op takes them
        (one memory: a head dimension of 1): ``[W_write; W_β] h`` ``[..., 1, 3m + 1]`` and
        ``[W_n; W_e^1..N_r] h`` ``[..., 1, (1 + num_reads) m]``; the op applies tanh and σ
        (FWM Eq. 1-2, 5-6)."""
        return self.write(h).unsqueeze(-2), self.read(h).unsqueeze(-2)

    def stepper(
        self, batch_size: int, device: torch.device | str | None = None, specialised: bool = True, record: bool = False
    ) -> CoreStepper | FWMStepper:
        """Made without gradients (acting), the op's incremental fused stepper when it runs
        here (see :class:`FWMStepper`; ``record``: for its ``replay``); otherwise, or with
        ``specialised=False``, the generic one."""
        if specialised and not torch.is_grad_enabled() and self.backend != "reference":
            p = next(self.parameters())
            like = p.detach() if device is None else p.detach().to(device)
            memory = fwm_op.stepper(batch_size, 1, self.m, like, backend=self.backend, record=record)
            if memory is not None:
                return FWMStepper(self, memory)
        return super().stepper(batch_size, device)

    def output(self, h: Tensor, n: Tensor) -> Tensor:
        """y = h + W_o n (FWM Eq. 8 and the residual of §3.1): LSTM output h ``[..., hidden]``,
        last read n ``[..., 1, m]`` (one memory)."""
        return h + self.out(n.squeeze(-2))

    def state_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        B, m = batch_size, self.m
        return [(B, self.hidden_size), (B, self.hidden_size), (B, m, m, m)]

    def _forward(self, x: Tensor, state: State, reset: Tensor | None) -> tuple[Tensor, State]:
        h0, c0, Fm = state
        hs, h, c = run_lstm(self.lstm, x, h0[None].contiguous(), c0[None].contiguous(), reset, self.backend)
        n, Fm = self.op(*self.project(hs), Fm.unsqueeze(1), reset)  # FWM Eq. 1-7
        return self.output(hs, n), (h[0], c[0], Fm.squeeze(1))


class FWMStepper:
    """``step(x [B, input_size]) -> y [B, hidden_size]`` from the zero state, without gradients
    (acting): the LSTM one step at a time, the memory in the op's incremental stepper (O(t m)
    per step from the zero state). Equal to one call of the core on the whole sequence;
    stepping with gradients enabled is refused, as it would silently lose the memory's part.

    When the memory records (the op's stepper made with ``record``) and the fused ``lstm`` op
    runs the LSTM, the steps keep what the fused backward passes need, and :meth:`replay` turns
    the steps taken into the core's output over the whole sequence with gradients, without
    computing the LSTM and the memory again: the acting forward doubles as the training
    forward."""

    def __init__(self, core: FWMCore, memory: fwm_op.fused.Stepper) -> None:
        self.core, self.memory = core, memory
        B = memory.B
        p = next(core.parameters())
        self.h = torch.zeros(1, B, core.hidden_size, dtype=p.dtype, device=p.device)
        self.c = torch.zeros_like(self.h)
        self.lstm = lstm_op.recorder(core.backend, p, core.hidden_size, self.h[0], self.c[0]) if memory.record else None

    def _lstm_weights(self) -> list[Tensor]:
        return [getattr(self.core.lstm, f"{n}_l0") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]

    def step(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            raise UserError(
                "core 'fwm': this stepper was made without gradients (acting); make "
                "it with gradients enabled to backpropagate through its steps"
            )
        if self.lstm is not None:
            h = self.lstm.step(x, *self._lstm_weights())
        else:
            hs, self.h, self.c = run_lstm(self.core.lstm, x.unsqueeze(0), self.h, self.c, None, self.core.backend)
            h = hs[0]
        n = self.memory.step(*self.core.project(h))  # FWM Eq. 1-7
        return self.core.output(h, n)

    def replay(self) -> Tensor | None:
        """The core's output ``[T, B, hidden_size]`` over the steps taken, with gradients to its
        weights: equal to the core on the stacked inputs from the zero state (call with
        gradients enabled, before the weights change). None without a record (see the class)."""
        if self.lstm is None or not self.memory.record:
            return None
        hs = self.lstm.replay(*self._lstm_weights())
        n = self.memory.replay(*self.core.project(hs))  # FWM Eq. 1-7, recorded
        return None if n is None else self.core.output(hs, n)
