"""The single-layer fast-weight memory of the Secretly-FWP paper's synthetic retrieval
experiments (Sec. 6.1), for ``rfwp-rl seq --task assoc --model memory``.

The model reads L key-value pairs, then one query (input as in :mod:`.tasks.assoc`):

- key ``k = W_K [e(k); v] ∈ R^{d_key}`` with a learned key embedding ``e`` and the value's
  fixed one-hot vector ``v ∈ R^S`` (Secretly-FWP Sec. 6.1);
- write into the fast weights ``W ∈ R^{S × D}`` (D = size of φ(k)) with either update rule,
  computed by the same ops as the ``lt`` and ``delta`` cores (:mod:`rfwp_rl.ops`):
  ``lt``: ``W += v ⊗ φ(k)`` (RFWP Eq. 6); ``delta``: ``W += β (v - W φ(k)) ⊗ φ(k)`` with
  ``β = σ(W_β [e(k); v])`` (RFWP Eq. 8-10; Secretly-FWP Eq. 23-24);
- read with the query ``q = W_Q e(q)``: ``v̂ = W φ(q) ∈ R^S``;
- loss ``½ Σ_j (v̂_j - v*_j)²`` against the one-hot of the stored value (the paper's loss);
  the prediction is ``argmax v̂``.

Nothing but the memory stores the associations (no feed-forward layers, no residual path),
so its capacity is that of the fast weight matrix: keys live in a ``D``-dimensional space
(D = d_key for ``elu_sum``/``softmax``, 2ν d_key for ``dpfp``), and at most D keys can be
orthogonal (Secretly-FWP Sec. 4.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rfwp_rl import ops
from rfwp_rl.cores import feature_maps
from rfwp_rl.errors import UserError, check_choice

RULES = {"lt": "sum", "delta": "delta"}
IGNORE = -100


class AssocMemory(nn.Module):
    """Secretly-FWP Sec. 6.1 memory (see the module docstring).

    Args:
        num_keys: S (keys and values).
        rule: ``lt`` (sum update rule) or ``delta`` (delta rule).
        d_key: key/query size before φ.
        emb_size: key embedding size.
        feature_map: φ (elu_sum, softmax, dpfp); dpfp_nu: ν for dpfp.
        backend: the op backend (auto, kernel, reference).
    """

    carries_state = False
    positions = False

    def __init__(
        self,
        num_keys: int,
        rule: str = "delta",
        d_key: int = 64,
        emb_size: int = 64,
        feature_map: str = "elu_sum",
        dpfp_nu: int = 1,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.rule = check_choice("memory update rule (--core)", rule, RULES)
        if d_key < 1 or emb_size < 1:
            raise UserError(f"d_key {d_key} / emb_size {emb_size} are invalid; allowed: >= 1")
        self.S, self.d_key, self.backend = num_keys, d_key, backend
        self.phi = feature_maps.get(feature_map, d_key, dpfp_nu)
        self.D = feature_maps.feature_dim(feature_map, d_key, dpfp_nu)
        self.config = {
            "rule": RULES[rule],
            "d_key": d_key,
            "d_dot": self.D,
            "emb_size": emb_size,
            "feature_map": feature_map,
            "dpfp_nu": dpfp_nu,
        }
        self.embed = nn.Embedding(num_keys, emb_size)
        self.W_K = nn.Linear(emb_size + num_keys, d_key, bias=False)
        self.W_Q = nn.Linear(emb_size, d_key, bias=False)
        self.W_beta = nn.Linear(emb_size + num_keys, 1) if rule == "delta" else None
        # chosen once for these sizes (a one-line error now if backend 'kernel' cannot run them)
        self.op = ops.resolve(rule, backend, ops.Dims(dk=self.D, dv=num_keys))

    def describe(self) -> dict[str, Any]:
        return {"model": "memory", "core": self.rule, "core_config": dict(self.config)}

    def initial_state(self, batch_size: int, device: Any = None) -> tuple:
        return ()

    def forward(
        self, x: Tensor, state: Sequence[Tensor] | None = None, reset: Tensor | None = None
    ) -> tuple[Tensor, tuple]:
        """x ``[L + 1, B, 2]`` (pairs, then the query) -> scores ``[L + 1, B, S]`` (the read
        ``v̂`` at the last step, zeros before it) and ``()``."""
        if x.dim() != 3 or x.shape[-1] != 2 or x.shape[0] < 2:
            raise UserError(f"memory input has shape {tuple(x.shape)}; allowed: [L + 1, B, 2]")
        if reset is not None and bool(reset.any()):
            raise UserError("the memory model reads one sequence per call; resets are not supported")
        keys, values = x[:-1, :, 0], x[:-1, :, 1]
        v = F.one_hot(values, self.S).to(self.embed.weight.dtype)  # [L, B, S]
        inp = torch.cat([self.embed(keys), v], dim=-1)
        k = self.phi(self.W_K(inp)).unsqueeze(2)  # [L, B, 1, D]
        q = self.phi(self.W_Q(self.embed(x[-1, :, 0])))  # [B, D]
        B = x.shape[1]
        W0 = torch.zeros(B, 1, self.S, self.D, dtype=k.dtype, device=k.device)
        vh = v.unsqueeze(2)
        if self.rule == "lt":
            _, W = self.op(k, k, vh, W0, None)  # RFWP Eq. 6
        else:
            beta = torch.sigmoid(self.W_beta(inp))  # RFWP Eq. 9
            _, W = self.op(k, k, vh, beta, W0, None)  # RFWP Eq. 8, 10
        read = torch.matmul(W[:, 0], q.unsqueeze(-1)).squeeze(-1)  # v̂ = W φ(q)
        out = torch.zeros(x.shape[0], B, self.S, dtype=read.dtype, device=read.device)
        out[-1] = read
        return out, ()

    @staticmethod
    def loss(scores: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
        """½ Σ_j (v̂_j - onehot(y)_j)² over the scored positions (Secretly-FWP Sec. 6.1)."""
        scored = y != IGNORE
        s = scores[scored]
        err = 0.5 * ((s - F.one_hot(y[scored], s.shape[-1]).to(s.dtype)) ** 2).sum(-1)
        return err.sum() if reduction == "sum" else err.mean()
