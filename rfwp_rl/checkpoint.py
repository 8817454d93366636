"""Atomic checkpoints shared by every trainer (IMPALA, A2C meta-RL, sequence tasks).

A run directory holds ``ckpt_<step>.pt`` files (the newest ``keep`` are kept),
``snapshot_<step>.pt`` files (extra copies at chosen step counts, never pruned) and ``best.pt``
(the state of the best training score so far, replaced by a better one, never pruned). Every file
is written to a temporary file in the same directory, flushed, fsync'ed and renamed, so a
kill at any moment leaves either the old or the new file, never a partial one; the previous
checkpoint is deleted only after the new one is complete.

Each file stores ``{"format", "meta", "step", "state"}``. ``meta`` describes what the
checkpoint is compatible with (trainer, core, action count, model config); loading into a
run whose ``meta`` differs raises a one-line :class:`UserError` naming the difference, and so
does a file of another ``format``: a checkpoint is read only by the layout that wrote it.

Files hold tensors and plain data only (the RNG states too) and are read with
``torch.load(weights_only=True)``: a file that holds anything else (a pickled object, whose
loading could run code) is refused in one line, :class:`UnsafeCheckpoint`; ``trust=True``
(``--trust-checkpoint``) reads such a file all the same, for a file whose origin is known.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import pickle
import random
import re
import stat
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rfwp_rl.errors import UserError
from rfwp_rl.safety import TrainingAborted

FORMAT = 1
_CKPT_RE = re.compile(r"^ckpt_(\d+)\.pt$")
BEST_FILE = "best.pt"  # not a ckpt_<step>.pt name: pruning never sees it


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process umask (which can only be read by setting it,
    so it is read once, at import)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


NEW_FILE_MODE = _new_file_mode()


def _write_problem(path: Path, error: OSError) -> str:
    """What stops a write to ``path``, in words: a file where a folder must be, or the system's reason."""
    for parent in (path.parent, *path.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is a file, not a folder"
            break
    if path.is_dir():
        return "it is a folder"
    return error.strerror or str(error)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same dir, fsync, rename), with the permissions
    of a file made by ``open()`` (a temp file is made private to its owner)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    except OSError as e:
        raise UserError(f"cannot write {path}: {_write_problem(path, e)}") from None
    try:
        os.chmod(tmp, NEW_FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):  # a folder in the way, a full disk: one line, and no file half-written
            raise UserError(f"cannot write {path}: {_write_problem(path, e)}") from None
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def atomic_write_figure(path: str | os.PathLike, fig, dpi: float | None = None) -> None:
    """Render the matplotlib figure ``fig`` as a png to ``path`` atomically, then close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Atomic text write (JSON/CSV results, configs)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, float_format: str = ".6g") -> str:
    """``rows`` as CSV text: the header ``columns`` (default: every row's keys, in the order first seen), then a
    line per row; floats as ``float_format``, a missing key or ``None`` empty, keys outside ``columns`` left out,
    a field holding a comma or a quote quoted. No rows and no columns: the empty string."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    if not columns:
        return ""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_field(row.get(c), float_format) for c in columns])
    return buf.getvalue()


def _csv_field(value: Any, float_format: str) -> Any:
    if value is None:
        return ""
    return format(value, float_format) if isinstance(value, (float, np.floating)) else value


def atomic_write_csv(
    path: str | os.PathLike,
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    float_format: str = ".6g",
) -> None:
    """:func:`csv_text` of ``rows``, written atomically to ``path``."""
    atomic_write_text(path, csv_text(rows, columns, float_format))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` that never leaves a partial file behind."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def rng_state() -> dict:
    """Python, NumPy and torch RNG states, to store in a checkpoint (tensors and plain data)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    """Inverse of :func:`rng_state`."""
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])


# Keys of a meta (at any depth) that choose an implementation, not the numbers: a run may resume
# on another kernel backend. The cores' initialisation options are among them: a checkpoint's
# weights replace the init.
IMPLEMENTATION_KEYS = frozenset({"backend", "forget_bias", "recurrent_init"})


def meta_differences(saved: dict, expected: dict, prefix: str = "") -> list[str]:
    """Human-readable differences between two (nested) meta dicts, e.g. ``core: 'lstm' != 'rdn'``
    (keys in :data:`IMPLEMENTATION_KEYS` are not compared). A level's own values come before its nested
    dicts' differences: a different ``core`` is named before the ``agent.*`` options that follow from it."""
    values, nested = [], []
    for key in sorted((set(saved) | set(expected)) - IMPLEMENTATION_KEYS):
        name = f"{prefix}{key}"
        a, b = saved.get(key, "<missing>"), expected.get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            nested.extend(meta_differences(a, b, prefix=f"{name}."))
        elif a != b:
            values.append(f"{name}: checkpoint has {a!r}, this run has {b!r}")
    return values + nested


class UnsafeCheckpoint(UserError):
    """A checkpoint holds Python objects that loading it would have to execute; it is not loaded."""


_GLOBAL_RE = re.compile(r"GLOBAL (\S+)")


def read_checkpoint(path: str | os.PathLike, trust: bool = False) -> dict:
    """Load one checkpoint file (on CPU) with ``torch.load(weights_only=True)``: tensors and plain
    data, nothing that runs code. Raises ``ValueError`` if the file is damaged or not ours (a
    truncated or garbage file: corrupt), :class:`UnsafeCheckpoint` if it holds other Python objects
    (never loaded unless ``trust``: a file of known origin), and a one-line :class:`UserError` for a
    file of another ``format`` or any other failure (no permission, out of memory), which is not a
    damaged file."""
    path = Path(path)
    try:
        if not zipfile.is_zipfile(path):  # torch.save writes zip archives; anything else is not ours
            raise ValueError("not a zip archive (truncated, damaged or not written by torch.save)")
        obj = torch.load(path, map_location="cpu", weights_only=not trust)
    except ValueError:
        raise
    except pickle.UnpicklingError as e:
        found = _GLOBAL_RE.search(str(e))
        if found is None:
            raise ValueError(f"damaged pickle data ({_first_line(e)})") from None
        raise UnsafeCheckpoint(
            f"checkpoint {path} holds a Python object ({found.group(1)}) that loading would have to execute; "
            "refusing it (a file of unknown origin can run any code); if you know where the file comes from, "
            "pass --trust-checkpoint"
        ) from None
    except (RuntimeError, EOFError, KeyError, zipfile.BadZipFile) as e:  # damaged archive or records
        raise ValueError(f"{type(e).__name__}: {_first_line(e)}") from None
    except (OSError, MemoryError) as e:
        raise UserError(
            f"cannot load checkpoint {path}: {type(e).__name__}: {_first_line(e)} (the file may be "
            "fine; it is left as it is)"
        ) from None
    if not isinstance(obj, dict) or not {"format", "meta", "step", "state"} <= set(obj):
        raise ValueError("not an rfwp_rl checkpoint")
    if obj["format"] != FORMAT:
        raise UserError(
            f"checkpoint {path} has format {obj['format']!r}; this version of rfwp_rl reads format {FORMAT} only"
        )
    return obj


def add_trust_argument(parser: Any) -> None:
    """The ``--trust-checkpoint`` flag of the commands that load checkpoints."""
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="also load a checkpoint that holds Python objects, whose loading can run any code: "
        "only for files whose origin you know",
    )


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else ""


def find_checkpoint_file(path: str | os.PathLike) -> Path:
    """A checkpoint file, or the newest readable ``ckpt_*.pt`` inside a run directory."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        files = list_checkpoints(path)
        if files:
            return files[0]
        raise UserError(f"no checkpoint (ckpt_*.pt) in {path}")
    raise UserError(f"checkpoint or run directory {str(path)!r} does not exist")


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``ckpt_<step>.pt`` files of a run directory, newest step first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def newest_checkpoint_step(run_dir: str | os.PathLike) -> int | None:
    """The step in the name of the newest ``ckpt_<step>.pt`` of a run directory, or None if it has none."""
    newest = list_checkpoints(run_dir)
    return int(_CKPT_RE.match(newest[0].name).group(1)) if newest else None


class NonFiniteState(TrainingAborted):
    """A state to be checkpointed holds NaN/inf values (it is not written)."""


def non_finite_entries(state: Any, prefix: str = "") -> list[str]:
    """Paths (e.g. ``agent.core.w``) of floating-point tensors in a nested dict/list/tuple
    ``state`` that hold NaN or inf values."""
    bad = []
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() or state.is_complex():
            if not bool(torch.isfinite(state).all()):
                bad.append(prefix or "<tensor>")
    elif isinstance(state, dict):
        for k, v in state.items():
            bad += non_finite_entries(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            bad += non_finite_entries(v, f"{prefix}[{i}]")
    return bad


def check_finite(state: Any) -> None:
    """Raise :class:`NonFiniteState` (one line) if any float tensor of ``state`` is not finite."""
    bad = non_finite_entries(state)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise NonFiniteState(
            f"refusing to write a checkpoint: {bad[0]}{more} holds NaN/inf values; the previous checkpoint is kept"
        )


class Checkpointer:
    """Saves and restores a run's checkpoints.

    Args:
        run_dir: the run directory.
        meta: what a checkpoint must match to be loaded into this run (trainer, core,
            number of actions, model config...). Plain, comparable Python values.
        keep: how many periodic checkpoints to keep (>= 2, so that a broken newest one
            still leaves a good previous one).
        upgrade: maps a saved meta to this version's form before the comparison (e.g. an option
            added since the checkpoint was written, filled in with its default).
    """

    def __init__(
        self, run_dir: str | os.PathLike, meta: dict, keep: int = 2, upgrade: Callable[[dict], dict] | None = None
    ):
        self.run_dir = Path(run_dir)
        self.meta = meta
        self.keep = max(2, keep)
        self.upgrade = upgrade

    def save(self, state: dict, step: int) -> Path:
        """Write ``ckpt_<step>.pt`` atomically, then prune older ones beyond ``keep``.
        Raises :class:`NonFiniteState` (writing nothing) if a float tensor of ``state`` is not finite."""
        check_finite(state)
        path = self.run_dir / f"ckpt_{step:012d}.pt"
        atomic_torch_save({"format": FORMAT, "meta": self.meta, "step": step, "state": state}, path)
        # the file just written is the newest readable one, whatever the others' step numbers
        for old in [p for p in list_checkpoints(self.run_dir) if p != path][self.keep - 1 :]:
            old.unlink(missing_ok=True)
        for tmp in [*self.run_dir.glob(".tmp-ckpt_*"), *self.run_dir.glob(f".tmp-{BEST_FILE}-*")]:
            tmp.unlink(missing_ok=True)  # leftovers of a killed writer
        return path

    def save_best(self, state: dict, step: int, score: float) -> Path:
        """Write ``best.pt`` atomically (replacing the previous best), with ``score`` (the training
        score that made it the best) stored beside the state. Never pruned by :meth:`save`."""
        check_finite(state)
        path = self.run_dir / BEST_FILE
        atomic_torch_save(
            {"format": FORMAT, "meta": self.meta, "step": step, "state": state, "score": float(score)}, path
        )
        return path

    def snapshot(self, state: dict, step: int) -> Path:
        """An extra checkpoint at a chosen step count (e.g. 50M, 200M), never pruned."""
        check_finite(state)
        path = self.run_dir / f"snapshot_{step:012d}.pt"
        atomic_torch_save({"format": FORMAT, "meta": self.meta, "step": step, "state": state}, path)
        return path

    def load_latest(self, trust: bool = False) -> dict | None:
        """The newest usable checkpoint as ``{"step", "state", "meta", "path"}``, or None if the
        run has none. A damaged newest file is reported in one line, renamed to ``*.damaged`` (so
        that pruning counts only readable ones) and the previous one is used; a file holding
        Python objects (:class:`UnsafeCheckpoint`, unless ``trust``), a load failure that is not
        damage, or a readable one with different ``meta`` raises a one-line :class:`UserError`."""
        files = list_checkpoints(self.run_dir)
        if not files:
            return None
        for path in files:
            try:
                obj = read_checkpoint(path, trust=trust)
            except ValueError as e:
                aside = path.with_name(path.name + ".damaged")
                try:
                    path.rename(aside)
                except OSError:
                    aside = path
                print(
                    f"warning: checkpoint {path} is unreadable ({e}); kept as {aside.name}, trying the previous one",
                    file=sys.stderr,
                )
                continue
            saved = self.upgrade(obj["meta"]) if self.upgrade is not None else obj["meta"]
            check_meta(saved, self.meta, path)
            return {"step": int(obj["step"]), "state": obj["state"], "meta": saved, "path": path}
        raise UserError(
            "no usable checkpoint in "
            f"{self.run_dir}: {', '.join(p.name for p in files)} are all "
            "unreadable; move them away to start the run from scratch"
        )


def check_meta(saved: dict, expected: dict, path: str | os.PathLike) -> None:
    """Raise a one-line :class:`UserError` if a checkpoint's meta differs from this run's."""
    diffs = meta_differences(saved, expected)
    if diffs:
        more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise UserError(f"checkpoint {path} does not match this run: {'; '.join(diffs[:3])}{more}")


def open_no_follow(path: str | os.PathLike, flags: int, what: str, mode: int = 0o600) -> int:
    """``os.open(path, flags, mode)`` that never goes through a symbolic link at ``path`` (a link planted there
    could make a write land in, or a read come from, another file) and opens only a regular file (a FIFO
    does not block it). A link or another kind of file is a one-line :class:`UserError` naming ``what``;
    other errors (FileNotFoundError, FileExistsError with ``O_EXCL``) are raised as they are."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise UserError(f"{what} {path} is a symbolic link; allowed: a regular file (remove the link)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{what} {path} is not a regular file; allowed: a regular file (remove what is there)")
    return fd


def lock_run_dir(run_dir: str | os.PathLike):
    """Hold an exclusive lock on ``run_dir/.lock`` for the life of the process, so that two
    trainers never write the same run (e.g. a launch script re-run while a run is going).
    Returns the open lock file (keep a reference). One-line UserError if the run is in use, or if
    ``.lock`` is a symbolic link (never followed: the pid written into it would truncate its target)."""
    import fcntl

    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"run directory {run_dir} is a file, not a directory; pass another --run-dir") from None
    except OSError as e:
        raise UserError(f"run directory {run_dir} cannot be made ({e.strerror or e}); pass another --run-dir") from None
    f = os.fdopen(open_no_follow(run_dir / ".lock", os.O_RDWR | os.O_CREAT, "lock file"), "r+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise UserError(
            f"run directory {run_dir} is in use by pid {holder}; stop that run first or pass another --run-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
