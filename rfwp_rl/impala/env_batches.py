"""Env-pool supervision: making the pool, stepping its batches, and watching over its processes.

Environments run in ``moolib.EnvPool`` worker processes (``--env-backend moolib``, the
default) or in this process (``--env-backend local``, :class:`LocalEnvPool`: for debugging,
profiling and machines without moolib; same semantics, no overlap of env stepping with
inference). :class:`EnvBatches` steps the pool's batches and turns what goes wrong into
exceptions the trainers handle; :mod:`rfwp_rl.impala.actors` runs the model on the results.

Faults:

- An env that raises (in ``step``, ``reset`` or its constructor) is replaced inside its worker
  (:class:`rfwp_rl.envs.pool_env.PoolEnv`), which reports the failures in ``env_error``;
  :class:`EnvBatches` reports them (env index) and counts them in ``env_failures``; more than
  ``max_env_failures`` raise :class:`TrainingAborted`.
- An env slot whose new envs fail ``MAX_FAILED_CONSTRUCTIONS`` times in a row before their first
  observation (a broken env, not a flaky one) reports ``env_fatal``: :class:`EnvBatches` raises
  :class:`TrainingAborted` with its one-line message (env id, slot, last exception).
- A dead moolib worker process (killed, out of memory) makes moolib's ``result()`` block for
  30 minutes, and a hung env blocks it for ever. :class:`EnvBatches` therefore waits for moolib
  results in a helper thread, polling every 0.25 s for a stop request (SIGINT/SIGTERM, so
  signals are honoured while waiting on envs: the wait is abandoned), for dead pool processes
  (a zombie child of the EnvPool server) and for a timeout (``env_timeout``), and raises
  :class:`EnvPoolBroken`: a hung env is handled like a dead worker. moolib cannot make a second
  EnvPool in a process, so the trainer saves a checkpoint, ends the old pool's processes
  (:func:`shutdown_env_pool`) and re-executes itself (:func:`reexec_argv`), which resumes.
- Before a trainer exits otherwise, :meth:`EnvBatches.release` gives pending env steps
  ``STOP_GRACE`` seconds and ends the pool's processes if one does not finish (a hung worker
  would otherwise outlive the trainer).
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rfwp_rl.envs.ale_vector_pool import AleVectorPool
from rfwp_rl.envs.pool_env import ActionTable, PoolEnvFactory, decode_fatal, pool_step, seeded_pool_env
from rfwp_rl.envs.process_pool import ProcessEnvPool, process_cpu_seconds
from rfwp_rl.errors import UserError
from rfwp_rl.impala.config import DEFAULTS
from rfwp_rl.safety import TrainingAborted

_moolib_pool_made = False  # moolib aborts the process if a second EnvPool forks
ENV_TIMEOUT = DEFAULTS.env_timeout  # seconds without a result from an env batch before the pool counts as broken
STOP_GRACE = 2.0  # seconds pending env steps get to finish when the trainer exits, before the workers are ended


class EnvPoolBroken(RuntimeError):
    """The env pool cannot go on (a worker process died or stopped answering)."""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _proc_state(pid: int) -> str:
    """One-letter process state from /proc (``Z`` zombie), or ``"gone"``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


class PoolProcesses:
    """The processes of one ``moolib.EnvPool``: its server (a child of this process, forked when
    the pool is made) and the worker processes forked by the server. Linux ``/proc`` only;
    elsewhere nothing is ever reported dead (the ``ENV_TIMEOUT`` still applies)."""

    def __init__(self, server_pids: list[int]):
        self.server_pids = server_pids

    def dead(self) -> str | None:
        """A description of a dead pool process, or None if all are alive."""
        for server in self.server_pids:
            state = _proc_state(server)
            if state in ("Z", "X", "gone"):
                return f"env pool server process {server} died"
            for worker in _children(server):
                if _proc_state(worker) in ("Z", "X", "gone"):
                    return f"env worker process {worker} died"
        return None

    def kill(self) -> None:
        """SIGKILL the pool's workers and server and reap the server."""
        for server in self.server_pids:
            for worker in _children(server):
                try:
                    os.kill(worker, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.kill(server, signal.SIGKILL)
                os.waitpid(server, 0)
            except OSError:
                pass

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the server and worker processes (those alive now)."""
        pids = [*self.server_pids, *(w for s in self.server_pids for w in _children(s))]
        return sum(process_cpu_seconds(pid) for pid in pids)


def shutdown_env_pool(pool: Any) -> None:
    """Close a local pool, or end a moolib pool's processes (e.g. before re-executing)."""
    if hasattr(pool, "close"):
        pool.close()
    procs = getattr(pool, "processes", None) or _moolib_processes.get(id(pool))
    if procs is not None:
        procs.kill()


_moolib_processes: dict[int, PoolProcesses] = {}


def reexec_argv() -> list[str] | None:
    """The command line that started this process if it is the ``rfwp-rl``/``python -m rfwp_rl``
    CLI (so that it can re-execute itself), else None (e.g. called from a test process)."""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    parent = os.path.basename(os.path.dirname(sys.argv[0])) if sys.argv else ""
    if argv0 == "rfwp-rl" or (argv0 == "__main__.py" and parent == "rfwp_rl"):
        return list(sys.orig_argv)
    return None


class _Waiter:
    """Calls ``future.result()`` in a helper thread so that the caller can wait with a timeout
    (moolib's ``result()`` releases the GIL but cannot be interrupted)."""

    def __init__(self) -> None:
        self._in: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._out: tuple[bool, Any] = (True, None)
        self.stuck = False  # a wait was abandoned: the thread may still block on it
        self.future: Any = None  # the future of the latest wait
        threading.Thread(target=self._run, name="env-result", daemon=True).start()

    def _run(self) -> None:
        while True:
            future = self._in.get()
            try:
                self._out = (True, future.result())
            except BaseException as e:  # handed to the caller
                self._out = (False, e)
            self._done.set()

    def wait(self, future: Any, poll: Callable[[float], bool]) -> Any:
        """``future.result()``; every 0.25 s ``poll(seconds waited)`` may return True (give up:
        returns None) or raise."""
        if self.stuck:
            raise EnvPoolBroken("an earlier env step never finished")
        self._done.clear()
        self.future = future
        self._in.put(future)
        t0 = time.monotonic()
        while not self._done.wait(0.25):
            try:
                give_up = poll(time.monotonic() - t0)
            except BaseException:
                self.stuck = True
                raise
            if give_up:
                self.stuck = True
                return None
        ok, value = self._out
        if not ok:
            raise EnvPoolBroken(f"env pool step failed: {value}") from value
        return value

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for an abandoned wait to finish (its result is dropped).
        True: nothing is stuck any more."""
        if self.stuck and self._done.wait(max(0.0, timeout)):
            self.stuck = False
        return not self.stuck


def import_moolib():
    """``moolib``, or a one-line UserError telling how to get it."""
    try:
        import moolib
    except ImportError as e:
        raise UserError(
            f"moolib is not installed ({e}); run 'bash scripts/setup.sh' to build it, "
            "or pass --env-backend local to step the environments in this process"
        ) from None
    return moolib


class _Ready:
    """A step of in-process envs with the ``.result()`` of a moolib future: the envs step when the
    result is asked for (as a pool's workers would step meanwhile), so a step still pending when the
    trainer stops never runs, and its env failures are neither printed nor counted."""

    def __init__(self, run: Callable[[], dict[str, torch.Tensor]]):
        self._run = run
        self._value: dict[str, torch.Tensor] | None = None

    def result(self) -> dict[str, torch.Tensor]:
        if self._value is None:
            self._value = self._run()
        return self._value


class LocalEnvPool:
    """In-process stand-in for ``moolib.EnvPool`` with the same ``step(batch_index, action)``:
    the first call on a batch resets its envs (the action is ignored), an env whose episode
    ended is reset and reports ``done`` with the new episode's first observation. Steps in this
    process when the result is asked for (no overlap with inference). Env ``i`` is seeded with ``seed * 100_003 + i``,
    so runs with this backend are reproducible."""

    def __init__(
        self, env_id: str, env_options: dict, seed: int, batch_size: int, num_batches: int, blank_obs: Any = None
    ):
        self.envs = [
            [seeded_pool_env(env_id, env_options, seed, b * batch_size + i, blank_obs) for i in range(batch_size)]
            for b in range(num_batches)
        ]
        self.started = [False] * num_batches

    def step(self, batch_index: int, action: torch.Tensor) -> _Ready:
        action = action.clone()
        return _Ready(functools.partial(self._step, batch_index, action))

    def _step(self, batch_index: int, action: torch.Tensor) -> dict[str, torch.Tensor]:
        envs = self.envs[batch_index]
        outs, rewards, dones = [], [], []
        for env, a in zip(envs, action.numpy()):
            try:  # PoolEnv replaces failing envs; this is raised only if no new one can be made
                obs, reward, done = pool_step(env, not self.started[batch_index], a)
            except Exception as e:
                raise TrainingAborted(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
            outs.append(obs)
            rewards.append(reward)
            dones.append(done)
        self.started[batch_index] = True
        result = {k: torch.from_numpy(np.stack([o[k] for o in outs])) for k in outs[0]}
        result["reward"] = torch.tensor(rewards, dtype=torch.float32)
        result["done"] = torch.tensor(dones, dtype=torch.bool)
        return result

    def close(self) -> None:
        for batch in self.envs:
            for env in batch:
                env.close()


def make_env_pool(
    backend: str,
    env_id: str,
    env_options: dict,
    seed: int,
    num_envs: int,
    num_batches: int,
    num_processes: int,
    blank_obs: Any = None,
    action_row: tuple | None = None,
):
    """An env pool of ``num_batches`` batches of ``num_envs // num_batches`` envs (``moolib.EnvPool``,
    :class:`ProcessEnvPool`, :class:`AleVectorPool` or :class:`LocalEnvPool`, by ``backend``). Create it before
    any moolib Rpc/Group and before other threads: moolib forks its worker processes here. moolib workers seed their
    envs from OS entropy (runs with moolib are not bit-reproducible anyway: worker timing
    decides which model version acts). ``blank_obs`` (one observation's shape and dtype, e.g.
    ``np.zeros(spec.obs_shape, spec.obs_dtype)``) lets an env slot whose envs can never be made
    report that as ``env_fatal`` (see :mod:`rfwp_rl.envs.pool_env`). ``action_row`` (``(shape, numpy dtype)`` of
    one env action, for actions that are not one integer) makes the moolib pool's
    :class:`rfwp_rl.envs.pool_env.ActionTable`; the in-process pool takes such actions as they are."""
    if num_envs % num_batches:
        raise UserError(f"--num-actors {num_envs} must be a multiple of --num-env-batches {num_batches}")
    if not 1 <= num_batches <= 4:
        raise UserError(f"--num-env-batches {num_batches} is invalid; allowed: 1 to 4")
    batch_size = num_envs // num_batches
    if backend == "local":
        return LocalEnvPool(env_id, env_options, seed, batch_size, num_batches, blank_obs)
    if backend == "ale":
        return AleVectorPool(env_id, env_options, seed, batch_size, num_batches, num_processes)
    if backend == "process":
        return ProcessEnvPool(env_id, env_options, seed, batch_size, num_batches, num_processes, blank_obs, action_row)
    global _moolib_pool_made
    if _moolib_pool_made:
        raise UserError(
            "moolib allows one EnvPool per process (it forks its workers once and aborts a second "
            "fork); run each training in its own process, reuse the pool, or use --env-backend local"
        )
    moolib = import_moolib()
    _moolib_pool_made = True
    before = set(_children(os.getpid()))
    factory = PoolEnvFactory(env_id, **env_options)
    factory.blank_obs = blank_obs
    if action_row is not None:  # made before the fork, so that the workers share it
        factory.action_table = ActionTable(num_envs, *action_row)
    pool = moolib.EnvPool(
        factory, num_processes=min(num_processes, num_envs), batch_size=batch_size, num_batches=num_batches
    )
    _moolib_processes[id(pool)] = PoolProcesses(sorted(set(_children(os.getpid())) - before))
    if factory.action_table is not None:
        _action_tables[id(pool)] = factory.action_table
    return pool


_action_tables: dict[int, Any] = {}  # id(moolib pool) -> its ActionTable


class EnvBatches:
    """Steps the batches of an env pool and watches over it (see the module docstring).

    ``send(i, action)`` starts batch i's next step (the workers step while the caller goes
    on); ``receive(i)`` waits for its result: a dict of ``[b, ...]`` tensors (the pool reuses
    them once the batch is stepped again), or None if ``should_stop()`` became true while
    waiting. ``env_failures`` counts replaced envs (start value ``env_failures``, e.g. from a
    checkpoint); ``batch_size`` is b.
    """

    def __init__(
        self,
        pool: Any,
        num_batches: int,
        batch_size: int,
        max_env_failures: int | None = None,
        env_failures: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
        env_timeout: float = ENV_TIMEOUT,
    ):
        self.pool = pool
        self.batch_size = batch_size
        self.max_env_failures = max_env_failures
        self.env_failures = env_failures
        self.env_timeout = env_timeout
        self.should_stop = should_stop
        self._processes = getattr(pool, "processes", None) or _moolib_processes.get(id(pool))
        self._action_table = _action_tables.get(id(pool))
        self._waiter = _Waiter() if self._processes is not None else None
        self.futures: list[Any] = [None] * num_batches

    def send(self, index: int, action: torch.Tensor) -> None:
        """Start batch ``index``'s next step with ``action [b, ...]`` (the env's actions, CPU; ignored by a
        batch's first step). Actions that are not one integer go through the pool's action table."""
        if self._action_table is not None:
            action = self._action_table.write(index * self.batch_size, action)
        self.futures[index] = self.pool.step(index, action)

    def receive(self, index: int) -> dict[str, torch.Tensor] | None:
        """Batch ``index``'s pending step's result, checked for env failures; None on a stop request."""
        out = self._result(index, self.futures[index])
        if out is None:  # stop requested while waiting
            return None
        self.futures[index] = None
        if "env_fatal" in out and bool(out["env_fatal"].any()):  # uint8 [b, FATAL_MESSAGE_BYTES]
            self._env_fatal(index, out["env_fatal"])
        if "env_error" in out and bool(out["env_error"].any()):  # int32 [b]
            errors = out["env_error"]
            self._env_failed(index, torch.nonzero(errors).flatten().tolist(), int(errors.sum()))
        return out

    def _result(self, index: int, future: Any) -> dict[str, torch.Tensor] | None:
        if self._waiter is None or isinstance(future, _Ready):
            return future.result()

        def poll(waited: float) -> bool:
            if self.should_stop():
                return True
            dead = self._processes.dead()
            if dead is not None:
                raise EnvPoolBroken(dead)
            if waited > self.env_timeout:
                raise EnvPoolBroken(
                    f"no result from env batch {index} for {waited:.0f} s "
                    f"(env timeout {self.env_timeout:g} s): an env is hung"
                )
            return False

        return self._waiter.wait(future, poll)

    def _env_fatal(self, index: int, fatal: torch.Tensor) -> None:
        row = int(torch.nonzero(fatal.any(dim=1)).flatten()[0])
        message = decode_fatal(fatal[row]) or "an env cannot be made to work"
        raise TrainingAborted(f"{message} (actor env {index * self.batch_size + row})")

    def _env_failed(self, index: int, rows: list[int], count: int | None = None) -> None:
        self.env_failures += len(rows) if count is None else count
        envs = ", ".join(str(index * self.batch_size + i) for i in rows)
        limit = f" (limit --max-env-failures {self.max_env_failures})" if self.max_env_failures is not None else ""
        print(
            f"warning: env {envs} failed and was replaced; {self.env_failures} env failures so far{limit}",
            file=sys.stderr,
            flush=True,
        )
        if self.max_env_failures is not None and self.env_failures > self.max_env_failures:
            raise TrainingAborted(f"{self.env_failures} environment failures{limit}")

    def release(self, grace: float = STOP_GRACE) -> None:
        """Before the trainer exits without restarting: give the pending env steps ``grace``
        seconds in all; if one does not finish (a hung env, or a wait abandoned on a stop request
        that never finishes), end the moolib pool's processes, which would otherwise outlive
        this process. No-op for in-process pools."""
        if self._waiter is None:
            return
        deadline = time.monotonic() + grace
        if self._waiter.settle(deadline - time.monotonic()):
            for i, future in enumerate(self.futures):
                if future is None:
                    continue
                if future is self._waiter.future:  # its abandoned wait has just finished
                    self.futures[i] = None
                    continue
                try:
                    self._waiter.wait(future, lambda waited: time.monotonic() > deadline)
                except EnvPoolBroken:
                    pass
                if self._waiter.stuck:
                    break
                self.futures[i] = None
        if self._waiter.stuck:
            print(
                f"warning: env steps did not finish within {grace:g} s; ending the env worker processes",
                file=sys.stderr,
                flush=True,
            )
            self._processes.kill()

    def drain(self) -> None:
        """Wait for the pending env steps (so that other :class:`EnvBatches` can use the pool)."""
        for i, future in enumerate(self.futures):
            if future is not None:
                self._result(i, future)
                self.futures[i] = None

    def worker_cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) the pool's processes used so far; None for in-process pools."""
        if self._processes is None:
            return None
        return self._processes.cpu_seconds()
