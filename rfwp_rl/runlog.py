"""TensorBoard logging and the console progress line, shared by every trainer.

One run directory per run; TensorBoard events go to ``<run_dir>/tb``. On resume the writer
is opened with ``purge_step`` so that curves continue without duplicated or rewound points.
The run's config goes to the hparams tab (so runs of different cores compare side by side)
and to ``<run_dir>/config.json``.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rfwp_rl.checkpoint import atomic_write_text


def run_name(*parts: object) -> str:
    """A filesystem-safe run directory name, e.g. ``run_name('ALE/Pong-v5', 'rdn', 's1')``
    -> ``'ALE-Pong-v5_rdn_s1'``."""
    return "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", str(p)).strip("-") for p in parts)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _hparam_value(v: object) -> int | float | str | bool:
    return v if isinstance(v, (int, float, str, bool)) else json.dumps(v)


# a record longer than this is not one the writers here make (a torn or foreign file): reading stops there
_MAX_RECORD_BYTES = 64 << 20


def _events(path: Path) -> Iterator[Any]:
    """The ``Event`` protos of one TensorBoard event file, in order (TFRecord framing: a little-endian uint64
    length, its CRC, the record, its CRC). Reading stops at a torn tail (a record still being written or cut
    by a crash) or a record that does not decode. The CRCs are not checked (TensorBoard's CRC-32C is pure
    Python, the slowest part of its reader); a torn record is caught by its length."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto.event_pb2 import Event

    with open(path, "rb") as f:
        while len(header := f.read(12)) == 12:
            (length,) = struct.unpack("<Q", header[:8])
            if length > _MAX_RECORD_BYTES or len(record := f.read(length)) < length or len(f.read(4)) < 4:
                return
            try:
                yield Event.FromString(record)
            except DecodeError:
                return


def _file_version(text: str) -> float:
    """``"brain.Event:2"`` -> 2.0; -1 where the version is not a number (as TensorBoard reads it)."""
    try:
        return float(text.split(":")[-1])
    except ValueError:
        return -1.0


def scalar_events(run_dir: str | Path) -> dict[str, list[tuple[int, float, float]]]:
    """``{tag: [(step, wall_time, value)]}`` of every scalar point of a run's ``tb/`` events, in the order
    written (a step may hold several points: one per episode that ended in it). The same points as
    TensorBoard's ``EventAccumulator`` (its default ``purge_orphaned_data``) at a fraction of its time: event
    files in name order; a session start at step s (a writer opened with ``purge_step=s``) drops every point
    logged at s or later; in files without a format version, a summary at a step below the latest drops its
    own tags' points from there on."""
    from tensorboard.compat.proto.event_pb2 import SessionLog

    series: dict[str, list[tuple[int, float, float]]] = {}
    file_version, latest = -1.0, -1

    def drop_from(step: int, tags: Iterable[str]) -> None:
        for tag in tags:
            series[tag] = [point for point in series[tag] if point[0] < step]

    for path in sorted((Path(run_dir) / "tb").glob("events.out.tfevents.*")):
        for event in _events(path):
            if event.HasField("file_version"):
                file_version = _file_version(event.file_version)
            if file_version >= 2:
                if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                    drop_from(event.step, list(series))
            elif event.step < latest and event.HasField("summary"):
                drop_from(event.step, {v.tag for v in event.summary.value if v.tag in series})
            else:
                latest = event.step
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    series.setdefault(value.tag, []).append((event.step, event.wall_time, value.simple_value))
    return series


def read_all_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value)]}`` of every scalar of a run's ``tb/`` events (:func:`scalar_events`), by step (a
    resumed run that logged a step twice keeps the later value)."""
    return {
        tag: sorted({step: value for step, _, value in points}.items())
        for tag, points in scalar_events(run_dir).items()
    }


def read_scalars(run_dir: str | Path, tag: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one scalar of a run's ``tb/`` events (empty if it was never logged)."""
    return read_all_scalars(run_dir).get(tag, [])


def _after_newest_event_file(tb_dir: Path) -> bool:
    """Wait until the clock's second is past that of the newest event file in ``tb_dir``. TensorBoard reads a
    run's event files in name order, and a name starts with the second it was made in, then the host and
    the pid: a run resumed within the second of its crash could otherwise sort before it, and its purge of
    the crashed run's last points would be read first and undone. True if there are earlier event files."""
    names = (p.name.split(".")[3] for p in tb_dir.glob("events.out.tfevents.*"))
    seconds = [int(n) for n in names if n.isdigit()]
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(0.01)
    return bool(seconds)


class RunLogger:
    """Scalars to TensorBoard plus a throttled progress line with rate and ETA.

    Args:
        run_dir: the run directory (created).
        config: the run's full config; written to ``config.json`` and the hparams tab.
        total: the step target (for percentages and ETA).
        start: the step of the checkpoint a resumed run starts from. Trainers log a step's
            scalars before they checkpoint it, so events up to ``start`` are kept and events
            after it (written by the crashed run after its last checkpoint) are purged.
        unit: what a step counts, for the progress line ("env steps", "episodes", "tokens").
        metrics: scalar tags shown as metrics in the hparams tab.
        log_every: seconds between progress lines.
    """

    def __init__(
        self,
        run_dir: str | Path,
        config: Mapping,
        total: int,
        start: int = 0,
        unit: str = "steps",
        metrics: tuple[str, ...] = (),
        log_every: float = 5.0,
        stream=None,
    ):
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.run_dir / "config.json", json.dumps(dict(config), indent=2, default=str) + "\n")
        earlier = _after_newest_event_file(self.run_dir / "tb")
        # a resumed run (also one resumed from its step-0 checkpoint) drops what the crashed run logged past it
        purge = start + 1 if start > 0 or earlier else None
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge)
        self._summary = Summary
        if start == 0:
            flat = {k: _hparam_value(v) for k, v in config.items()}
            exp, ssi, sei = hparams(flat, {m: float("nan") for m in metrics})
            for summary in (exp, ssi, sei):
                self.writer.file_writer.add_summary(summary)
        self.total, self.unit, self.stream = total, unit, stream
        self.log_every = log_every
        self._t0, self._s0 = time.monotonic(), start
        self._last_print = 0.0
        self._rate_t, self._rate_s, self.rate = time.monotonic(), start, 0.0

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Write ``{tag: value}`` at ``step`` (non-finite values are written as they are), as one event: what
        ``SummaryWriter.add_scalar`` writes per tag, at a fraction of its cost per episode of a short-episode env."""
        values = [self._summary.Value(tag=tag, simple_value=float(value)) for tag, value in scalars.items()]
        if values:
            self.writer.file_writer.add_summary(self._summary(value=values), step)

    def progress(self, step: int, force: bool = False, **extra: object) -> None:
        """Print ``step/total (pct) | rate | ETA | extra...`` at most every ``log_every`` s."""
        now = time.monotonic()
        if now - self._rate_t >= 1.0:
            self.rate = (step - self._rate_s) / (now - self._rate_t)
            self._rate_t, self._rate_s = now, step
        if not force and now - self._last_print < self.log_every:
            return
        self._last_print = now
        avg = (step - self._s0) / max(now - self._t0, 1e-9)
        eta = max(self.total - step, 0) / avg if avg > 0 else float("inf")  # the last batch may pass the target
        pct = 100.0 * step / max(self.total, 1)
        parts = [
            f"{step:,}/{self.total:,} {self.unit} ({pct:.1f}%)",
            f"{self.rate:,.0f}/s",
            f"ETA {format_duration(eta)}",
        ]
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items()]
        print(" | ".join(parts), file=self.stream or sys.stdout, flush=True)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
