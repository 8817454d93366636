"""Build hook: ship the run-time data folders inside the wheel.

All project metadata lives in pyproject.toml; this file only extends ``build_py`` so that a
regular (non-editable) wheel carries copies of ``csrc/``, ``agents/`` and ``results/paper/``
under ``rfwp_rl/_data/`` (``rfwp_rl.resources.data_dir`` finds them there). Editable installs
(``pip install -e .``) copy nothing: they read the folders of the checkout in place.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent

# folder (relative to the repository root) -> files shipped from it; the folders must be
# rfwp_rl.resources.SHIPPED (tests/test_packaging.py checks). Only what is read at run time:
# kernel sources and headers, agent presets, the paper's score tables.
SHIPPED = {
    "csrc": ("*.h", "*.cuh", "*.cpp", "*.cu", "README.md"),
    "agents": ("*.toml", "README.md"),
    "results/paper": ("*.csv", "README.md"),
}


def shipped_files() -> list[tuple[Path, Path]]:
    """(source file, path inside the wheel) for every shipped data file."""
    out = set()
    for folder, patterns in SHIPPED.items():
        base = ROOT / folder
        for pattern in patterns:
            for f in base.rglob(pattern):
                if f.is_file() and "__pycache__" not in f.parts:
                    out.add((f, Path("rfwp_rl", "_data", folder, f.relative_to(base))))
    return sorted(out)


class build_py_with_data(build_py):
    """``build_py`` that also copies the shipped data folders into ``rfwp_rl/_data``."""

    def _ships_data(self) -> bool:
        return not getattr(self, "editable_mode", False)

    def run(self) -> None:
        super().run()
        if not self._ships_data():
            return
        for src, rel in shipped_files():
            dst = Path(self.build_lib) / rel
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self._ships_data():
            outputs += [str(Path(self.build_lib) / rel) for _, rel in shipped_files()]
        return outputs


setup(cmdclass={"build_py": build_py_with_data})
