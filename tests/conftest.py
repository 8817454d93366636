"""Shared test setup.

- ``@pytest.mark.moolib``: the test needs the moolib wheel (``scripts/build_moolib.sh``). It is
  skipped where moolib is missing, unless ``RFWP_REQUIRE_MOOLIB=1`` (``.ci/run``), where it runs
  and fails.
- ``one_thread``: torch runs on one thread during the test (many tiny ops, and the trainers'
  small per-step inference, are fastest so on a busy machine); trainer test modules use it with
  ``pytestmark = pytest.mark.usefixtures("one_thread")``.
- Every test starts from random states seeded by its own id, so what a test draws does not depend
  on which tests ran before it (a tolerance that passes once passes on every machine and order).
- ``ext``: the built fused-kernel extension, for the kernel and op tests.
- ``emu``: the CUDA kernels run on the host (``csrc/cuda_emu``), for the emulated-CUDA tests.
- The toolchain builds the selected kernel tests need (the emulation, nvcc, ThreadSanitizer, the CUDA
  binding's syntax check) start in a background thread once the tests are collected, so that on a cold
  cache they run beside the tests before them; a test that needs one waits for it on the build's lock
  (or builds it, and reports its errors, if the thread failed).
- Network peers started by the tests share an auth key in a temporary file (``RFWP_AUTH_KEY_FILE``), removed
  when the session ends.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import random
import shutil
import threading
import zlib

import numpy as np
import pytest
import torch

HAS_MOOLIB = importlib.util.find_spec("moolib") is not None

# Learners, actors and brokers started by the tests share one auth key, made by the first of them
# in a per-session temporary file, never in the user's ~/.config.
if "RFWP_AUTH_KEY" not in os.environ and "RFWP_AUTH_KEY_FILE" not in os.environ:
    import atexit
    import tempfile

    _auth_dir = tempfile.mkdtemp(prefix="rfwp-auth-")
    atexit.register(shutil.rmtree, _auth_dir, ignore_errors=True)  # the key never outlives the session
    os.environ["RFWP_AUTH_KEY_FILE"] = os.path.join(_auth_dir, "auth.key")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "moolib: needs moolib (skipped without it unless RFWP_REQUIRE_MOOLIB=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_MOOLIB or os.environ.get("RFWP_REQUIRE_MOOLIB") == "1":
        return
    skip = pytest.mark.skip(reason="moolib is not built (bash scripts/setup.sh)")
    for item in items:
        if "moolib" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    builds = [] if session.config.option.collectonly else _builds_ahead(session.items)
    if builds:
        threading.Thread(target=_build_ahead, args=(builds,), name="rfwp-build-ahead", daemon=True).start()


def _builds_ahead(items: list[pytest.Item]) -> list:
    """The cached builds the selected tests will ask for, in the order they do."""
    from rfwp_rl.kernels import _build

    names = {
        getattr(item, "originalname", item.name)
        for item in items
        if item.path.name.startswith("test_kernels_cuda_emulated")
    }
    if not names:
        return []
    builds = []
    if shutil.which("nvcc") and any(name.startswith("test_nvcc_") for name in names):
        builds += [functools.partial(_build.nvcc_compile, cu, arch) for arch in (80, 90) for cu in _build.EMU_CU_FILES]
    if "test_cuda_torch_binding_compiles" in names and (include := _build.cuda_runtime_include()) is not None:
        builds.append(functools.partial(_build.cuda_binding_syntax_check, include))
    if shutil.which("g++"):
        uses_emu = any("emu" in item.fixturenames for item in items if item.path.name.startswith("test_kernels_cuda"))
        builds += [_build.emulated_cuda_library] if uses_emu else []
        builds += [_build.race_check_binary] if "test_no_data_race_between_threads_of_a_block" in names else []
    return builds


def _build_ahead(builds: list) -> None:
    for build in builds:
        try:
            build()
        except Exception:  # the test that needs it builds it again and reports what went wrong
            pass


@pytest.fixture(autouse=True)
def _seeded_by_test_id(request: pytest.FixtureRequest) -> None:
    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


@pytest.fixture(scope="module")
def emu():
    """The CUDA kernels on the host emulation, 32 threads (skipped without g++; a build error fails)."""
    import shutil

    from rfwp_rl.kernels import _build
    from rfwp_rl.kernels.emulated import EmulatedCuda

    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler (g++) to build the CUDA emulation")
    try:
        be = EmulatedCuda(threads=32)
    except _build.BuildError as e:
        pytest.fail(f"{e} (log: {e.log})")
    yield be
    be.set_device_smem_optin(None)
