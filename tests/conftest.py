"""Fixtures shared by the kernel and op tests."""

from __future__ import annotations

import pytest
import torch


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
