"""Child processes of a benchmark, none of which may outlive it.

Each child runs in a session of its own (a Ctrl-C at the terminal reaches only the benchmark, which then
stops its children itself) and writes its output to a log file, which the benchmark reads line by line.
:class:`ChildProcesses` stops every child it started when its ``with`` block ends, however it ends (an
error, Ctrl-C, or SIGTERM inside :func:`interrupt_on_sigterm`, which turns it into
:class:`KeyboardInterrupt`): SIGTERM to each child (a
trainer saves and ends its env workers), then SIGKILL to the process group of any child whose group still
has a live process after ``grace`` seconds (the env worker processes go with it). On Linux the kernel
also sends a child SIGTERM when the benchmark dies (``PR_SET_PDEATHSIG``), e.g. when it is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

POLL_SECONDS = 0.1
KILL_SECONDS = 30.0  # from SIGKILL to the group's last process gone (only an uninterruptible wait takes long)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _term_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when this process dies (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(1)

    return preexec


def group_members(pgid: int) -> list[int]:
    """The live processes (not zombies) of process group ``pgid``; on systems without ``/proc``, the group's
    leader if the group exists."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class ChildProcess:
    """One child: ``argv`` started in a session of its own, stdout and stderr to ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: dict[str, str], cwd: Path):
        self.name, self.log = name, Path(log)
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: its env workers can be ended with it
                preexec_fn=_term_with_parent(),
            )
        self._reader = open(self.log, encoding="utf-8", errors="replace")
        self._partial = ""
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.popen.pid

    def read(self) -> list[str]:
        """The complete lines written since the last call (also kept in :attr:`lines`)."""
        text = self._partial + self._reader.read()
        *new, self._partial = text.split("\n")
        self.lines += new
        return new

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.popen.poll()

    def tail(self, n: int = 15) -> str:
        self.read()
        return "\n".join(f"  {self.name}| {line}" for line in [*self.lines, self._partial][-n:] if line)

    def terminate(self) -> None:
        """SIGTERM to the child itself (not its group: a trainer ends its env workers in order)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """SIGKILL to every process of the child's group."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        self._reader.close()


class ChildProcesses:
    """The children started with :meth:`start`, all stopped when the ``with`` block ends (see the module)."""

    def __init__(self, directory: Path, env: dict[str, str], grace: float):
        self.directory, self.env, self.grace = Path(directory), env, grace
        self.children: list[ChildProcess] = []

    def start(self, name: str, argv: Sequence[str]) -> ChildProcess:
        """Start ``argv`` in :attr:`directory`, its output to ``<name>.log`` there."""
        self.directory.mkdir(parents=True, exist_ok=True)
        child = ChildProcess(name, argv, self.directory / f"{name}.log", self.env, self.directory)
        self.children.append(child)
        return child

    def __enter__(self) -> ChildProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_until_gone(self, seconds: float) -> None:
        """Poll until no child's group has a live process, at most ``seconds``."""
        deadline = time.monotonic() + seconds
        while any(group_members(c.pid) for c in self.children) and time.monotonic() < deadline:
            for c in self.children:
                c.exit_code()  # reap the child once it ends: a zombie leader is not a live member
            time.sleep(POLL_SECONDS)

    def stop(self) -> list[str]:
        """Stop every child (SIGTERM, then SIGKILL to its group after ``grace`` s); the names of those
        that had to be killed. Ctrl-C and SIGTERM are ignored meanwhile, so that the stop is not cut short."""
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for child in reversed(self.children):
                child.terminate()
            self._wait_until_gone(self.grace)
            killed = [c.name for c in self.children if group_members(c.pid)]
            for child in self.children:
                if child.name in killed:
                    child.kill_group()
            self._wait_until_gone(KILL_SECONDS)
            left = {c.name: members for c in self.children if (members := group_members(c.pid))}
            for child in self.children:
                if child.exit_code() is None:
                    child.popen.wait(timeout=KILL_SECONDS)
                child.close()
            if left:
                raise RuntimeError(f"processes left after SIGKILL: {left}")
            self.children = []
            return killed
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`KeyboardInterrupt` in the block, as Ctrl-C does, so that ``finally`` clauses and
    ``with`` exits run (Python's default for SIGTERM ends the process without them)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
