"""``rfwp-rl info --check``: every op on every kernel backend present against the reference,
a table, exit code 1 when one disagrees (or when there is nothing to check)."""

from __future__ import annotations

import shutil

from rfwp_rl import cli, kernels, ops
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import selftest


def test_info_check_passes_here(ext, capsys):
    assert cli.main(["info", "--check"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("self-check:") :]
    emulated = shutil.which("g++") is not None  # the emulated CUDA kernels: ops that have one
    for name in ops.OPS:
        assert table.count(f"\n{name} ") >= (4 if emulated and name in cuda_limits.OPS else 2)
    assert "fused C++      float64" in table and "fused C++      float32" in table
    if emulated:
        assert "emulated CUDA  float64" in table
        rows = [line.split() for line in table.splitlines() if "emulated CUDA" in line and "pass" in line]
        assert rows and all(row[-2:] == ["-", "-"] for row in rows)  # checked, not timed: emulated on the CPU
    # two dtypes, C++ (and emulated CUDA)
    checks = 2 * len(ops.OPS) + (2 * len(set(ops.OPS) & set(cuda_limits.OPS)) if emulated else 0)
    assert "FAIL" not in table and table.rstrip().endswith(f"pass ({checks} checks)")


class _WrongRdnBackward:
    """The extension with an rdn backward whose first gradient is off by 0.1%."""

    def __init__(self, ext) -> None:
        self.ext = ext

    def rdn_backward(self, *args):
        grads = self.ext.rdn_backward(*args)
        return [grads[0] * 1.001, *grads[1:]]

    def __getattr__(self, name):
        return getattr(self.ext, name)


def test_check_fails_when_an_op_disagrees(ext, monkeypatch):
    monkeypatch.setattr(
        kernels, "_state", {"loaded": True, "ext": _WrongRdnBackward(ext), "why": "test", "build_seconds": 0.0}
    )
    lines = []
    assert selftest.main(emulation=False, print_fn=lines.append) == 1
    rows = [ln for ln in "\n".join(lines).splitlines() if ln.startswith(tuple(ops.OPS))]
    n = 2 * len(ops.OPS)  # two dtypes per op, C++ only
    assert len(rows) == n
    failed = [ln.split()[:4] for ln in rows if "FAIL" in ln]
    assert failed == [["rdn", "cpu", "fused", "C++"]] * 2
    assert lines[-1] == f"self-check: FAIL (2 of {n} disagree with the reference)"


def test_check_fails_without_kernels(monkeypatch):
    monkeypatch.setattr(
        kernels,
        "_state",
        {"loaded": True, "ext": None, "why": "fused kernels disabled by RFWP_RL_KERNELS=0", "build_seconds": 0.0},
    )
    lines = []
    assert selftest.main(emulation=False, print_fn=lines.append) == 1
    assert "  fused kernels: fused kernels disabled by RFWP_RL_KERNELS=0" in lines
    assert lines[-1] == "self-check: FAIL (no fused kernel to check)"
