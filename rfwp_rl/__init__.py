"""rfwp_rl: reinforcement learning with Recurrent Fast Weight Programmers.

Subpackages: ``cores`` (shared recurrent cores), ``ops`` (fast-weight recurrences:
PyTorch reference + dispatch to fused kernels), ``kernels`` (Python side of ``csrc/``),
``impala`` (IMPALA/V-trace actor-learner), ``meta_rl`` (POMDP graphs + A2C),
``seq`` (language modelling and algorithmic tasks), ``envs`` (environment factories),
``bench`` (``rfwp-rl bench``). ``resources`` finds the data folders read at run time
(``csrc/``, ``agents/``, ``results/paper/``: the checkout's, or the copies shipped in a wheel).
The command line: ``rfwp-rl`` (:mod:`rfwp_rl.cli`).
"""

from __future__ import annotations

import re
import sys

__version__ = "0.1.0"

# Checkpoints are read with torch.load(weights_only=True), which runs code from a crafted file before
# torch 2.6 (CVE-2025-32434): an older torch is refused at import, not worked around.
MIN_TORCH = (2, 6)


def torch_problem(version: str | None = None) -> str | None:
    """A one-line error if torch ``version`` (default: the installed one) is older than :data:`MIN_TORCH`,
    a pre-release of it, or not a version number; None if it will do, or if torch is not installed."""
    if version is None:
        if "torch" in sys.modules:
            version = str(sys.modules["torch"].__version__)
        else:
            from importlib import metadata

            try:
                version = metadata.version("torch")
            except metadata.PackageNotFoundError:  # importing torch fails on its own
                return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)$", version)
    release = (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None
    minimum = (*MIN_TORCH, 0)
    pre = m is not None and re.match(r"[._-]?(a|b|rc|dev|alpha|beta|pre)", m[4]) is not None
    if release is not None and (release > minimum or (release == minimum and not pre)):
        return None
    need = ".".join(map(str, MIN_TORCH))
    return (
        f"rfwp_rl needs torch >= {need} (torch.load(weights_only=True) is unsafe before {need}, CVE-2025-32434); "
        f"this is torch {version!r}: pip install --upgrade 'torch>={need},<3'"
    )


def _require_torch() -> None:
    problem = torch_problem()
    if problem is None:
        return
    argv = getattr(sys, "argv", None) or [""]
    if re.search(r"(^|/)rfwp-rl$", argv[0]):  # the command line: one line, no traceback
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(problem)


_require_torch()
