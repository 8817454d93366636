"""Where the data folders the package reads at run time live.

Three top-level folders of the repository are read at run time: ``csrc/`` (the C++/CUDA
sources the fused kernels are compiled from), ``agents/`` (agent presets) and
``results/paper/`` (the paper's score tables). A source checkout (git clone or
``pip install -e .``) reads them in place, so edits take effect at once. A regular wheel
carries copies of them inside the package under ``rfwp_rl/_data/<folder>`` (``setup.py``
copies them at build time; its ``SHIPPED`` table must name the same folders as ``SHIPPED``
here, which ``tests/test_packaging.py`` checks).
"""

from __future__ import annotations

import functools
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from rfwp_rl.errors import UserError, check_choice

#: the data folders shipped with the package, as paths relative to the repository root
SHIPPED = ("csrc", "agents", "results/paper")

PACKAGE_DIR = Path(__file__).resolve().parent
#: the repository root when the package runs from a source checkout
SOURCE_ROOT = PACKAGE_DIR.parent
#: where a wheel install keeps its copies of the folders
SHIPPED_ROOT = PACKAGE_DIR / "_data"


@functools.cache
def _is_source_tree(root: Path) -> bool:
    """``root`` is this project's checkout: its pyproject.toml names the rfwp_rl project (so an
    unrelated ``agents/`` next to an installed package in site-packages is never picked up)."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    project = data.get("project")
    return isinstance(project, dict) and project.get("name") == "rfwp_rl"


def data_dir(name: str, required: bool = True) -> Path:
    """The directory of the shipped data folder ``name`` (one of :data:`SHIPPED`).

    Looks in the source checkout first (``<repository>/<name>``), then in the copy inside the
    installed package (``rfwp_rl/_data/<name>``). When neither exists: ``required=True`` raises
    a one-line :class:`UserError` naming both places; ``required=False`` returns the path where
    this kind of install keeps the folder (callers that degrade gracefully, e.g. the kernels
    falling back to the PyTorch reference, report it themselves).
    """
    check_choice("data folder", name, SHIPPED)
    candidates = [SHIPPED_ROOT / name]
    if _is_source_tree(SOURCE_ROOT):
        candidates.insert(0, SOURCE_ROOT / name)
    for path in candidates:
        if path.is_dir():
            return path
    if required:
        raise UserError(
            f"rfwp_rl's {name}/ folder is missing (looked in "
            f"{' and '.join(str(p) for p in candidates)}); reinstall rfwp_rl or use a "
            "complete checkout of the repository"
        )
    return candidates[0]
