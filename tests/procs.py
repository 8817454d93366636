"""Process helpers shared by the tests that run trainers, actors and brokers as subprocesses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rfwp_rl.impala.net import free_port  # noqa: F401 - the tests' and scripts' port helper, one for the package

# Appended to a moolib script a test runs and reads: its output flushed, the process ends without moolib's
# teardown, which can abort ("terminate called without an active exception") while its threads still run.
MOOLIB_EXIT = "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_os._exit(0)\n"


def script_result(
    argv: list[str],
    env: dict | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float = 300,
    lines: list[str] | None = None,
) -> Any:
    """Run ``argv``, a script that prints its result as one JSON line (an object or a list), and return that
    result as soon as it is printed; the script is then killed, not waited for (moolib's threads can hold a
    finished script for a minute, and its exit says nothing the result does not). ``lines``, if given, receives
    the script's output lines (stdout and stderr) up to then. AssertionError with that output if the script
    ends or ``timeout`` seconds pass without printing a result."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [] if lines is None else lines

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline, checked = time.monotonic() + timeout, 0
    try:
        while True:
            ended = proc.poll() is not None and not reader.is_alive()
            for line in lines[checked:]:
                try:
                    result = json.loads(line)
                except ValueError:
                    continue
                if isinstance(result, (dict, list)):
                    return result
            checked = len(lines)
            if ended or time.monotonic() >= deadline:
                output = "".join(lines)[-6000:]
                assert not ended, f"the script ended ({proc.returncode}) without a result:\n{output}"
                raise AssertionError(f"no result within {timeout:.0f} s:\n{output}")
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (empty once it has ended)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def children_and_grandchildren(pid: int) -> list[int]:
    """``pid``'s children and theirs: a trainer's moolib env pool and the pool's worker processes."""
    return [w for c in children(pid) for w in [c, *children(c)]]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs and so on (a benchmark's learners, actors, brokers and
    their env worker processes)."""
    found, stack = [], children(pid)
    while stack:
        child = stack.pop()
        found.append(child)
        stack += children(child)
    return found


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


def listening_ports(pid: int) -> list[int]:
    """The TCP ports (IPv4 and IPv6) that ``pid`` listens on (its sockets in /proc/net/tcp*, state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def finite(obj: Any) -> bool:
    """No NaN or inf in ``obj``: its floating-point tensors and floats, in dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(finite(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)
