"""Feature maps φ for fast-weight keys and queries (applied over the last dimension).

- ``elu_sum``: ELU + 1 (Secretly-FWP Eq. 30) then sum normalisation (Secretly-FWP Eq. 29);
- ``softmax``: positive and sums to one by construction (what the RFWP paper's Atari RDN and
  Delta RNN used, RFWP paper §3.1);
- ``dpfp``: deterministic parameter-free projection DPFP-ν (Secretly-FWP Eq. 37) from d to
  2νd dimensions, then sum normalisation (Eq. 29);
- ``l2``: unit vectors, ``x / |x|`` (the L2-normalised keys and queries of Gated DeltaNet §3.4).
  Under the delta rule (Secretly-FWP Eq. 24) a write with a unit key sets W k to
  (1 - β) W k + β v; with a sum-normalised key (|k| < 1) it keeps 1 - β|k|² of W k, and repeated
  writes store v / |k| along the key's direction: a larger memory for the same values.

Sum normalisation divides by ``Σ_j φ_j + 1e-5``, the small constant the reference Atari
agents used; it keeps DPFP finite when every component is zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.ops.common import softmax, unit_vectors  # the ops' own (the rdn op recognises softmax)

FEATURE_MAPS = ("elu_sum", "softmax", "dpfp", "l2")
SUM_NORM_EPS = 1e-5


def sum_normalise(phi: Tensor) -> Tensor:
    """Secretly-FWP Eq. 29: φ / Σ_j φ_j (last dimension)."""
    return phi / (phi.sum(-1, keepdim=True) + SUM_NORM_EPS)


def elu_sum(x: Tensor) -> Tensor:
    """ELU(x) + 1 (Secretly-FWP Eq. 30), sum-normalised (Eq. 29). ``[..., d] -> [..., d]``."""
    return sum_normalise(F.elu(x) + 1.0)


def dpfp(x: Tensor, nu: int = 1) -> Tensor:
    """DPFP-ν (Secretly-FWP Eq. 37), sum-normalised (Eq. 29). ``[..., d] -> [..., 2νd]``.

    With ``x' = [relu(x), relu(-x)]`` (2d components), component ``(j, i)`` is
    ``x'_i · x'_{(i+j) mod 2d}`` for ``j = 1..ν``, ``i = 1..2d``, ordered j-major.
    """
    xx = torch.cat([F.relu(x), F.relu(-x)], dim=-1)
    phi = torch.cat([xx * xx.roll(shifts=-j, dims=-1) for j in range(1, nu + 1)], dim=-1)
    return sum_normalise(phi)


def feature_dim(name: str, d: int, nu: int = 1) -> int:
    """Output size of feature map ``name`` for input size ``d``."""
    return 2 * nu * d if name == "dpfp" else d


def get(name: str, d: int, nu: int = 1) -> Callable[[Tensor], Tensor]:
    """The feature map ``name`` for head size ``d`` (checks ``name`` and ``nu``)."""
    check_choice("feature_map", name, FEATURE_MAPS)
    if name == "dpfp":
        if isinstance(nu, bool) or not isinstance(nu, int) or not 1 <= nu < 2 * d:
            raise UserError(
                f"dpfp_nu {nu!r} is invalid for head size {d}; "
                f"allowed: an integer in [1, {2 * d - 1}] (Secretly-FWP Eq. 37)"
            )
        return _Dpfp(nu)
    return {"elu_sum": elu_sum, "softmax": softmax, "l2": unit_vectors}[name]


class _Dpfp:
    """``dpfp`` with a fixed ν, as a picklable callable."""

    def __init__(self, nu: int) -> None:
        self.nu = nu

    def __call__(self, x: Tensor) -> Tensor:
        return dpfp(x, self.nu)

    def __repr__(self) -> str:
        return f"dpfp(nu={self.nu})"
