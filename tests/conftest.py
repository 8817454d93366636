"""Shared test setup: the ``moolib`` marker and the one-thread fixture.

- ``@pytest.mark.moolib``: the test needs the moolib wheel (``scripts/build_moolib.sh``). It is
  skipped where moolib is missing, unless ``RFWP_REQUIRE_MOOLIB=1`` (``.ci/run``), where it runs
  and fails.
- ``one_torch_thread``: torch runs on one thread during the test (the trainers' small per-step
  inference is fastest so on a busy machine, and tests stay fast); modules use it with
  ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
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
def one_torch_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
