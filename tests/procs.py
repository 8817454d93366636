"""Process helpers shared by the tests that run trainers, actors and brokers as subprocesses."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (empty once it has ended)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def children_and_grandchildren(pid: int) -> list[int]:
    """``pid``'s children and theirs: a trainer's moolib env pool and the pool's worker processes."""
    return [w for c in children(pid) for w in [c, *children(c)]]


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def ended(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for ``pids`` to end (a SIGKILLed process ends a moment after the
    signal); the ones still alive then."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]
