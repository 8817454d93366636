"""Run-safety helpers shared by every trainer: graceful signals and non-finite guards."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable

import torch


class TrainingAborted(RuntimeError):
    """Raised when a run must stop (too many non-finite updates, too many env failures).
    Trainers catch it, save the last good checkpoint and exit cleanly."""


class GracefulStop:
    """Context manager: the first SIGINT/SIGTERM sets ``requested`` so the loop can save a
    checkpoint and exit 0; a second signal exits at once (code 130). Checkpoints are written
    atomically, so an immediate exit never leaves a partial file."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._old: dict[int, object] = {}

    def is_requested(self) -> bool:
        """``requested``, as a callable (e.g. for waits that poll for a stop)."""
        return self.requested

    def _handle(self, signum, frame) -> None:
        if self.requested:
            print("second signal: exiting now", file=sys.stderr, flush=True)
            os._exit(130)
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        print(
            f"{self.signal_name} received: saving a checkpoint and stopping (send it again to exit at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> GracefulStop:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class NonFiniteGuard:
    """Skip updates whose loss or gradients are not finite.

    Usage, after ``loss.backward()``::

        if guard.ok(loss, model.parameters()):
            optimizer.step()
        optimizer.zero_grad()

    ``skipped`` counts skipped updates (log it); more than ``max_consecutive`` in a row
    raises :class:`TrainingAborted`.
    """

    def __init__(self, max_consecutive: int = 20) -> None:
        self.max_consecutive = max_consecutive
        self.skipped = 0
        self.consecutive = 0

    def ok(self, loss: torch.Tensor, parameters: Iterable[torch.nn.Parameter]) -> bool:
        # one check, so one wait for a GPU: the loss and every gradient's largest magnitude
        values = [loss.detach().float().reshape(())]
        values += [p.grad.detach().abs().max().float() for p in parameters if p.grad is not None]
        finite = bool(torch.isfinite(torch.stack(values)).all())
        if finite:
            self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        print(
            f"warning: non-finite loss or gradient, update skipped "
            f"({self.consecutive} in a row, {self.skipped} in total)",
            file=sys.stderr,
            flush=True,
        )
        if self.consecutive > self.max_consecutive:
            raise TrainingAborted(f"{self.consecutive} non-finite updates in a row (limit {self.max_consecutive})")
        return False
