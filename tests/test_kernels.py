"""The kernels layer (build, load, the raw extension): the build cache, failures falling
back to the reference with one line, the prebuild command, the binding's checks, the
kernels' exp/tanh; and that it imports neither ops nor cores. The ops' fused kernels
against the reference: tests/ops/."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rfwp_rl import kernels, ops
from rfwp_rl.errors import UserError
from rfwp_rl.kernels import _build
from rfwp_rl.ops import cases

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kernels_import_neither_ops_nor_cores():
    # layers: cores -> ops -> kernels. Every module of rfwp_rl.kernels, imported in a fresh
    # process, leaves rfwp_rl.ops and rfwp_rl.cores unimported.
    code = (
        "import pkgutil, sys, importlib\n"
        "import rfwp_rl.kernels as k\n"
        "names = [m.name for m in pkgutil.iter_modules(k.__path__, 'rfwp_rl.kernels.')]\n"
        "for n in names: importlib.import_module(n)\n"
        "k.status()\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('rfwp_rl.ops', 'rfwp_rl.cores')))\n"
        "print(len(names), bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    count, bad = proc.stdout.split(" ", 1)
    assert int(count) >= 4 and bad.strip() == "[]", proc.stdout


def test_cuda_build_cache_key_names_the_gpu_architecture(monkeypatch):
    # a CUDA build compiled for an H100 has no kernel image for an A100 sharing the cache
    assert _build.extension_name(True, arch="8.0") != _build.extension_name(True, arch="9.0")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert _build.cuda_arch_list() == "8.0 9.0"
    both = _build.extension_name(True)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert _build.extension_name(True) != both
    assert _build.extension_name(True) == _build.extension_name(True, arch="9.0")
    # the CPU build does not depend on it (its cache stays valid)
    cpu = _build.extension_name(False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert _build.extension_name(False) == cpu


# ------------------------------------------------------------------------- the extension


def test_binding_rejects_bad_shapes(ext):
    (q, k, v, W0), reset = cases.make_inputs("lt", T=3, B=2, H=1, d=4)
    with pytest.raises(RuntimeError, match="W0 has shape"):
        ext.lt_forward(q, k, v, W0[:, :, :3].contiguous(), reset, 2)
    with pytest.raises(RuntimeError, match="reset must be"):
        ext.lt_forward(q, k, v, W0, reset[:2].contiguous(), 2)


def test_build_failure_warns_once_and_uses_reference(monkeypatch, caplog):
    def failing(with_cuda):
        raise _build.BuildError("build failed (error: boom)", Path("/tmp/x/build.log"))

    monkeypatch.setattr(kernels, "_state", {"loaded": False, "ext": None, "why": "", "build_seconds": 0.0})
    monkeypatch.setattr(_build, "load_extension", failing)
    monkeypatch.setattr(_build, "torch_has_cuda", lambda: False)
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.kernels"):
        assert kernels.load()[0] is None
        assert kernels.load()[0] is None
        assert ops.get("lt", "auto") is ops.naive("lt")
        assert ops.resolve("delta", "auto", ops.Dims(4, 4)) is ops.naive("delta")
    records = [r for r in caplog.records if r.name == "rfwp_rl.kernels"]
    assert len(records) == 1 and "boom" in records[0].getMessage()
    assert "\n" not in records[0].getMessage()
    backend, why = kernels.status()
    assert backend == "reference" and "boom" in why and "/tmp/x/build.log" in why
    with pytest.raises(UserError, match="boom"):
        ops.get("lt", "kernel")
    with pytest.raises(UserError, match="boom"):
        ops.resolve("rdn", "kernel", ops.Dims(4, 4))


def test_stale_build_marker_of_a_killed_build_is_cleared(monkeypatch, tmp_path):
    # a build killed after torch created its in-progress marker ("lock" in the build
    # directory) must not make every later build wait for it forever
    from torch.utils import cpp_extension

    if _build.shutil.which("ninja") is None:
        pytest.skip("ninja is not installed")
    monkeypatch.setenv("RFWP_RL_KERNEL_CACHE", str(tmp_path))
    name = _build.extension_name(False)
    (tmp_path / name).mkdir()
    (tmp_path / name / "lock").write_text("")
    seen = []

    def fake_load(name, sources, build_directory, **kwargs):
        seen.append(Path(build_directory, "lock").exists())
        raise RuntimeError("error: compiler stopped by the test")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    with pytest.raises(_build.BuildError, match="compiler stopped by the test"):
        _build.load_extension(False)
    assert seen == [False]


def test_missing_sources_one_line_on_stderr(tmp_path):
    # a real process: the package imports, the op works on the reference, stderr gets one line
    code = (
        "from pathlib import Path\n"
        "from rfwp_rl.kernels import _build\n"
        f"_build.CSRC = Path({str(tmp_path / 'no_csrc')!r})\n"
        "from rfwp_rl import ops\n"
        "assert ops.get('lt', 'auto') is ops.naive('lt') and ops.get('rdn') is ops.naive('rdn')\n"
        "from rfwp_rl import kernels\n"
        "print(kernels.status()[0])\n"
    )
    env = dict(os.environ, RFWP_RL_KERNEL_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "reference"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "sources are not installed" in lines[0], proc.stderr


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {"loaded": False, "ext": None, "why": "", "build_seconds": 0.0})
    monkeypatch.setenv("RFWP_RL_KERNELS", "0")
    assert kernels.status() == ("reference", "fused kernels disabled by RFWP_RL_KERNELS=0")
    assert ops.get("delta") is ops.naive("delta")


def test_prebuild_command(ext, capsys):
    from rfwp_rl.kernels.__main__ import main

    assert main([]) == 0
    assert capsys.readouterr().out.startswith("kernel: fused C++ kernels (CPU")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_exp_and_tanh_accuracy(ext, dtype):
    # the CPU kernels' vectorisable exp/tanh (csrc/cpu/vec_math.h) against torch's, in ulp
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(200_000, generator=g, dtype=torch.float64) * 3,
            torch.logspace(-12, 3, 20_000, dtype=torch.float64),
            -torch.logspace(-12, 3, 20_000, dtype=torch.float64),
            torch.linspace(-0.25, 0.25, 10_001, dtype=torch.float64),
        ]
    ).to(dtype)
    fi = torch.finfo(dtype)
    for fn, ref_fn, max_ulp in (("exp", torch.exp, 2), ("tanh", torch.tanh, 8)):
        xs = x[x < 700] if fn == "exp" and dtype == torch.float64 else x
        if fn == "exp" and dtype == torch.float32:
            xs = xs[xs < 88]
        got, want = ext._vec_math(xs, fn), ref_fn(xs.double())
        ulp = torch.clamp((want.abs() * fi.eps).to(dtype), min=fi.tiny).double()
        err = ((got.double() - want).abs() / ulp).max().item()
        assert err <= max_ulp, (fn, err)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e4, -1e4], dtype=dtype)
    e, t = ext._vec_math(special, "exp"), ext._vec_math(special, "tanh")
    assert e[:4].tolist() == [1.0, 1.0, float("inf"), 0.0] and e[4].isnan() and e[5] == float("inf")
    assert e[6] == 0 and t[:4].tolist() == [0.0, 0.0, 1.0, -1.0] and t[4].isnan()
    assert t[5:].tolist() == [1.0, -1.0]
