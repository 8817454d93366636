"""Python side of ``csrc/``: builds the fused kernels and wraps them as autograd Functions.

(Placeholder until the kernels land: no fused kernel is available, so ``auto`` uses the
PyTorch reference.)
"""

from __future__ import annotations

from typing import Callable

from rfwp_rl.errors import UserError


def status() -> tuple[str, str]:
    """(active backend, why) for ``rfwp-rl info``."""
    return "reference", "fused kernels are not part of this build yet"


def get(name: str, required: bool = False) -> Callable | None:
    if required:
        raise UserError(f"backend 'kernel' requested for op {name!r} but {status()[1]}; "
                        "use backend 'auto' or 'reference'")
    return None
