"""The op tests: ``test_<op>.py`` sets ``OP = "<op>"``, holds that op's own checks, and
imports the checks every op passes from ``op_contract.py``."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture
def name(request) -> str:
    """The op under test: the ``OP`` of the test module."""
    return request.module.OP
