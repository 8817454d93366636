"""Env worker processes of our own: the ``process`` env backend.

The same ``step(batch_index, action) -> future`` as ``moolib.EnvPool`` (and the same semantics as the
in-process pool: a batch's first step resets its envs and ignores the action; an env whose episode
ended is reset and reports ``done`` with the new episode's first observation), with no moolib needed:
the envs of each batch are split in contiguous slices over ``num_processes`` forked workers, which
write their outputs into memory shared with the trainer and answer over a pipe. Every env is a
:class:`rfwp_rl.envs.pool_env.PoolEnv` (so failures are handled as with moolib), seeded
``seed * 100_003 + index`` like the in-process pool.

Layout of the shared buffers: one tensor per output key of shape ``[num_batches, batch_size, ...]``
(the keys and shapes of :meth:`PoolEnv._pack` on the blank observation, plus ``reward`` and ``done``),
and one action tensor ``[num_batches, batch_size, ...]``. A batch's rows are written by the workers
only while the batch is being stepped, and read by the trainer only after all its workers answered,
so no lock is needed; the trainer copies what it keeps before stepping the batch again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from rfwp_rl.envs.pool_env import PoolEnv, close_all, pool_step, seeded_pool_env
from rfwp_rl.perf import single_thread_blas
from rfwp_rl.safety import TrainingAborted

_STOP = b"stop"


def _slices(batch_size: int, workers: int) -> list[tuple[int, int]]:
    """``workers`` contiguous, near-equal ``(start, stop)`` slices of ``range(batch_size)``."""
    bounds = np.linspace(0, batch_size, workers + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def output_layout(blank_obs: Any) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` of one env's step output: what :class:`PoolEnv` reports, plus reward and done."""
    probe = PoolEnv(None, make=lambda failures: None, name="layout probe", blank_obs=blank_obs)
    packed = probe._pack(blank_obs, 0.0, 0, False)
    probe.env = None  # nothing to close
    layout = {k: (np.asarray(v).dtype, np.asarray(v).shape) for k, v in packed.items()}
    layout["reward"] = (np.dtype(np.float32), ())
    layout["done"] = (np.dtype(np.bool_), ())
    return layout


class PendingStep:
    """The pending step of one batch of a pool: ``result()`` waits for it (the pool's ``_collect(batch_index)``),
    once."""

    def __init__(self, pool: Any, batch_index: int):
        self.pool, self.batch_index = pool, batch_index
        self._value: dict[str, torch.Tensor] | None = None

    def result(self) -> dict[str, torch.Tensor]:
        if self._value is None:
            self._value = self.pool._collect(self.batch_index)
        return self._value


class ProcessEnvPool:
    """``num_batches`` batches of ``batch_size`` envs stepped by ``num_processes`` forked workers.

    Make it before the trainer starts threads or touches CUDA (the workers are forked). ``processes``
    has the ``dead()``, ``kill()`` and ``cpu_seconds()`` of :class:`rfwp_rl.impala.env_batches.PoolProcesses`,
    so the trainer watches over these workers as over moolib's.
    """

    def __init__(
        self,
        env_id: str,
        env_options: dict,
        seed: int,
        batch_size: int,
        num_batches: int,
        num_processes: int,
        blank_obs: Any,
        action_row: tuple | None = None,
    ):
        if blank_obs is None:
            raise ValueError("ProcessEnvPool needs blank_obs (the layout of one observation)")
        workers = max(1, min(num_processes, batch_size))
        self.batch_size, self.num_batches = batch_size, num_batches
        self.slices = _slices(batch_size, workers)
        self.outputs = {
            k: torch.from_numpy(np.zeros((num_batches, batch_size, *shape), dtype)).share_memory_()
            for k, (dtype, shape) in output_layout(blank_obs).items()
        }
        shape, dtype = action_row if action_row is not None else ((), np.dtype(np.int64))
        self.actions = torch.from_numpy(np.zeros((num_batches, batch_size, *shape), dtype)).share_memory_()
        self.pending = [False] * num_batches  # a step of the batch is under way
        self.answers: list[list[bytes | None]] = [[None] * workers for _ in range(num_batches)]
        ctx = multiprocessing.get_context("fork")
        self.conns: list[Connection] = []
        self.workers: list[multiprocessing.process.BaseProcess] = []
        for w, (start, stop) in enumerate(self.slices):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                name=f"rfwp-env-{w}",
                daemon=True,
                args=(
                    theirs,
                    env_id,
                    env_options,
                    seed,
                    start,
                    stop,
                    batch_size,
                    self.outputs,
                    self.actions,
                    blank_obs,
                ),
            )
            proc.start()
            theirs.close()
            self.conns.append(ours)
            self.workers.append(proc)
        self.processes = WorkerProcesses(self.workers)

    def step(self, batch_index: int, action: torch.Tensor) -> PendingStep:
        """Start stepping batch ``batch_index`` with ``action [batch_size, ...]`` (ignored by its first step)."""
        if self.pending[batch_index]:
            raise RuntimeError(f"env batch {batch_index} is stepped again before its result was taken")
        self.actions[batch_index].copy_(action.reshape(self.actions[batch_index].shape))
        message = batch_index.to_bytes(1, "little")
        for conn in self.conns:
            try:
                conn.send_bytes(message)
            except OSError:  # a dead worker: its result() reports it (the trainer restarts the pool)
                pass
        self.pending[batch_index] = True
        return PendingStep(self, batch_index)

    def _collect(self, batch_index: int) -> dict[str, torch.Tensor]:
        # A worker answers its requests in order, but the trainer may ask for batch 1's result after
        # it has already sent batch 0's next step: answers for other batches are kept until asked for.
        for w, conn in enumerate(self.conns):
            while self.answers[batch_index][w] is None:
                try:
                    answer = conn.recv_bytes()
                except (EOFError, OSError) as e:
                    raise RuntimeError(f"env worker process ended ({type(e).__name__})") from None
                b = answer[0]
                if b >= self.num_batches or self.answers[b][w] is not None:
                    raise RuntimeError(f"env worker {w} answered for batch {b}, which it was not stepping")
                self.answers[b][w] = answer[1:]
        errors = [a.decode("utf-8", "replace") for a in self.answers[batch_index] if a]
        self.answers[batch_index] = [None] * len(self.conns)
        self.pending[batch_index] = False
        if errors:
            raise TrainingAborted(errors[0])
        return {k: v[batch_index] for k, v in self.outputs.items()}

    def close(self) -> None:
        """Stop the workers (they close their envs); end those that do not stop within a few seconds."""
        for conn in self.conns:
            try:
                conn.send_bytes(_STOP)
            except OSError:
                pass
        for proc in self.workers:
            proc.join(timeout=5.0)
        self.processes.kill()
        for conn in self.conns:
            conn.close()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux ``/proc``), 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


class WorkerProcesses:
    """The worker processes of a :class:`ProcessEnvPool`, watched like moolib's (see ``PoolProcesses``)."""

    def __init__(self, workers: list):
        self.workers = workers

    def dead(self) -> str | None:
        for proc in self.workers:
            if not proc.is_alive():
                return f"env worker process {proc.pid} died (exit code {proc.exitcode})"
        return None

    def kill(self) -> None:
        for proc in self.workers:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5.0)

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(proc.pid) for proc in self.workers)


def _worker(
    conn: Connection,
    env_id: str,
    env_options: dict,
    seed: int,
    start: int,
    stop: int,
    batch_size: int,
    outputs: dict[str, torch.Tensor],
    actions: torch.Tensor,
    blank_obs: Any,
) -> None:
    """Steps envs ``start:stop`` of every batch on request (one byte: the batch index) until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer decides when to stop (Ctrl-C reaches the group)
    torch.set_num_threads(1)
    single_thread_blas()
    num_batches = actions.shape[0]
    out = {k: v.numpy() for k, v in outputs.items()}
    act = actions.numpy()

    envs = [
        [seeded_pool_env(env_id, env_options, seed, b * batch_size + i, blank_obs) for i in range(start, stop)]
        for b in range(num_batches)
    ]
    started = [False] * num_batches
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the trainer is gone
            if message == _STOP:
                return
            b = message[0]
            error = b""
            try:
                for j, env in enumerate(envs[b]):
                    row = start + j
                    obs, reward, done = pool_step(env, not started[b], act[b, row])
                    for k, v in obs.items():
                        out[k][b, row] = v
                    out["reward"][b, row] = reward
                    out["done"][b, row] = done
                started[b] = True
            except Exception as e:  # PoolEnv replaces failing envs; this is only a slot that cannot go on
                text = str(e).splitlines()[0] if str(e) else type(e).__name__
                error = f"{env_id}: {text}".encode()[:1000]
            conn.send_bytes(message[:1] + error)
    finally:
        close_all()
        sys.stderr.flush()
        os._exit(0)  # no atexit handlers of the forked parent (its moolib, its TensorBoard writers)
