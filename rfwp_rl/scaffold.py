"""The trainer scaffold every trainer runs in (IMPALA, A2C meta-RL, sequence tasks).

One order, for every trainer: lock the run directory -> load its newest checkpoint -> restore
the RNG state saved with it -> start the trainer's side processes (:meth:`Trainer.prepare`) ->
open the logger -> install the signal guard -> train -> final save -> close. A trainer
subclasses :class:`Trainer` and fills in its hooks; :func:`run_trainer` does the rest.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rfwp_rl.checkpoint import Checkpointer, NonFiniteState, lock_run_dir, rng_state, set_rng_state
from rfwp_rl.runlog import RunLogger
from rfwp_rl.safety import GracefulStop, TrainingAborted


class Trainer:
    """What :func:`run_trainer` runs. Set the attributes in ``__init__`` (after seeding and
    building the model) and implement the hooks.

    Attributes:
        run_dir: the run directory.
        meta: what a checkpoint must match to be loaded (see :class:`rfwp_rl.checkpoint.Checkpointer`).
        total: the step target (for the logger's ETA); unit, step_name: what a step counts.
        metrics: TensorBoard tags shown as metrics in the hparams tab; log_every: seconds between
            progress lines.
    """

    run_dir: Path
    meta: dict
    total: int
    unit: str = "steps"  # what the logger's step counts ("env steps", "optimizer steps")
    step_name: str = "step"  # one of them, in messages ("episode")
    metrics: tuple[str, ...] = ()
    log_every: float = 5.0
    logger: RunLogger | None = None
    checkpointer: Checkpointer | None = None
    trust_checkpoint: bool = False  # resume from a checkpoint holding Python objects (--trust-checkpoint)

    @property
    def step(self) -> int:
        """The step count checkpoints are named by."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Everything a resume needs (the RNG state is added by the scaffold)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict, path: Path, step: int) -> None:
        """Restore a checkpoint's state (``path``: its file, for the resume line; ``step``: its step)."""
        raise NotImplementedError

    def prepare(self) -> str | None:
        """After loading, before the logger starts threads (e.g. fork env workers). Return a
        line to print and stop with exit 0 (e.g. the target is already reached), else None."""
        return None

    def hparams(self) -> dict:
        """The run's config for ``config.json`` and the hparams tab."""
        raise NotImplementedError

    def upgrade_meta(self, saved: dict) -> dict:
        """A checkpoint's meta in this version's form, before it is compared with :attr:`meta`
        (options added since it was written read as their defaults)."""
        return saved

    def train(self, stop: GracefulStop) -> None:
        """The training loop, until the target or ``stop.requested``; may raise :class:`TrainingAborted`."""
        raise NotImplementedError

    def aborted(self, error: TrainingAborted, saved: Path | None) -> None:
        """Report an abort in one line (``saved``: the final checkpoint, None if not written)."""
        where = f"checkpoint at {self.step_name} {self.step:,} saved" if saved else "no checkpoint written"
        print(f"error: training aborted: {error}; {where}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """After the final save: end side processes, leave groups."""

    def finish(self, code: int, saved: Path | None) -> int:
        """After everything is closed: final report; returns the exit code."""
        return code

    # ---- for the trainer's loop
    def save(self, snapshot_step: int | None = None) -> Path:
        """A checkpoint now (``snapshot_step``: an extra, never pruned one). TensorBoard is flushed
        first, so that a resume purges nothing before the checkpoint."""
        if self.logger is not None:
            self.logger.flush()
        state = {**self.state_dict(), "rng": rng_state()}
        if snapshot_step is not None:
            return self.checkpointer.snapshot(state, snapshot_step)
        return self.checkpointer.save(state, self.step)

    def save_best(self, score: float) -> Path:
        """``best.pt`` now: the full state (as :meth:`save`) of a new best training ``score``."""
        if self.logger is not None:
            self.logger.flush()
        return self.checkpointer.save_best({**self.state_dict(), "rng": rng_state()}, self.step, score)


def run_trainer(trainer: Trainer) -> int:
    """Run ``trainer`` inside the scaffold (see the module docstring). Returns the exit code:
    0 finished or stopped by a signal, 1 aborted (non-finite updates, env failures)."""
    trainer.checkpointer = Checkpointer(trainer.run_dir, trainer.meta, upgrade=trainer.upgrade_meta)
    lock = lock_run_dir(trainer.run_dir)  # one trainer per run directory, until the end
    try:
        loaded = trainer.checkpointer.load_latest(trust=trainer.trust_checkpoint)
        if loaded is not None:
            trainer.load_state_dict(loaded["state"], loaded["path"], loaded["step"])
            set_rng_state(loaded["state"]["rng"])
        done = trainer.prepare()
        if done is not None:
            print(done, flush=True)
            trainer.close()
            return 0
        return _train_and_save(trainer)
    finally:
        lock.close()


def _train_and_save(trainer: Trainer) -> int:
    trainer.logger = RunLogger(
        trainer.run_dir,
        trainer.hparams(),
        total=trainer.total,
        start=trainer.step,
        unit=trainer.unit,
        metrics=trainer.metrics,
        log_every=trainer.log_every,
    )
    code, saved = 0, None
    try:
        with GracefulStop() as stop:  # held through the final save
            error = None
            try:
                trainer.train(stop)
            except TrainingAborted as e:
                code, error = 1, e
            finally:  # also before another exception goes on to the CLI
                saved = _final_save(trainer)
            if error is not None:
                trainer.aborted(error, saved)
            elif saved is None:
                code = 1
    finally:
        trainer.logger.close()
        trainer.close()
    return trainer.finish(code, saved)


def _final_save(trainer: Trainer) -> Path | None:
    """The final checkpoint; None (one line printed) if the state holds NaN/inf and was not written."""
    try:
        return trainer.save()
    except NonFiniteState as e:  # never written; the previous checkpoint stays the newest
        print(f"error: {e}", file=sys.stderr, flush=True)
        return None
