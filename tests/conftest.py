"""Shared test setup.

- ``@pytest.mark.moolib``: the test needs the moolib wheel (``scripts/build_moolib.sh``). It is
  skipped where moolib is missing, unless ``RFWP_REQUIRE_MOOLIB=1`` (``.ci/run``), where it runs
  and fails.
- ``one_thread``: torch runs on one thread during the test (many tiny ops, and the trainers'
  small per-step inference, are fastest so on a busy machine); trainer test modules use it with
  ``pytestmark = pytest.mark.usefixtures("one_thread")``.
- ``ext``: the built fused-kernel extension, for the kernel and op tests.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_MOOLIB = importlib.util.find_spec("moolib") is not None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "moolib: needs moolib (skipped without it unless RFWP_REQUIRE_MOOLIB=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_MOOLIB or os.environ.get("RFWP_REQUIRE_MOOLIB") == "1":
        return
    skip = pytest.mark.skip(reason="moolib is not built (bash scripts/setup.sh)")
    for item in items:
        if "moolib" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    # Many tiny reference ops: on a shared 2-core machine OpenMP's barriers make them 10-50x
    # slower with 2 threads than with 1. The multi-threaded kernel path is tested explicitly.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ext():
    """The built fused-kernel extension (the tests fail, not skip, when it is missing)."""
    from rfwp_rl import kernels

    extension, why = kernels.load()
    if extension is None:
        pytest.fail(f"the fused CPU kernels are not available: {why}")
    return extension


def _old_import_paths() -> None:
    """Transition only: tests/test_kernels_cuda_emulated.py and tests/test_kernels_gpu.py
    (kept with the CUDA sources) still import the op test helpers from their old homes
    (``rfwp_rl.kernels.cases`` with ``OPS``/``STATE_ARGS``/``TIME_ARGS``,
    ``rfwp_rl.kernels.functions.FUSED``, ``rfwp_rl.ops.reference``, ``kernels.get``,
    ``kernels._load``). Map those names to the new ones (``rfwp_rl.ops.cases``, ``ops.OPS``
    and each ``OpSpec``'s ``state_args``/``time_args``/``fused``, ``ops.naive(name)``,
    ``ops.get``, ``kernels.load``) for this test session only; remove once those files import the new names. The package itself has no
    such aliases (rfwp_rl.kernels imports neither ops nor cores)."""
    import types

    from rfwp_rl import kernels, ops
    from rfwp_rl.ops import cases

    def module(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    if not hasattr(kernels, "cases"):
        kernels.cases = module("rfwp_rl.kernels.cases", **{k: v for k, v in vars(cases).items()
                                                           if not k.startswith("__")},
                               OPS=tuple(ops.OPS),
                               STATE_ARGS={n: s.state_args for n, s in ops.OPS.items()},
                               TIME_ARGS={n: s.time_args for n, s in ops.OPS.items()})
    if not hasattr(kernels, "functions"):
        kernels.functions = module("rfwp_rl.kernels.functions",
                                   FUSED={n: s.fused for n, s in ops.OPS.items()})
    if not hasattr(ops, "reference"):
        ops.reference = module("rfwp_rl.ops.reference",
                               **{n: s.naive for n, s in ops.OPS.items()})
    if not hasattr(kernels, "get"):
        kernels.get = lambda name, required=False: ops.get(name, "kernel" if required else "auto")
    if not hasattr(kernels, "_load"):
        kernels._load = kernels.load


_old_import_paths()
