"""User-facing errors: one line naming the bad value and what is allowed."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path


class UserError(Exception):
    """Bad input from the user (unknown name, malformed config, mismatched checkpoint).

    The CLI prints ``error: <message>`` on one line and exits with code 2, without a
    traceback. Library callers get an ordinary exception.
    """


def choices_hint(value: str, allowed: Iterable[str], n: int = 3) -> str:
    """``"did you mean 'x'? allowed: a, b, c"`` for an unknown ``value``."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(str(value), allowed, n=n, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return f"{hint}allowed: {', '.join(allowed)}"


def check_choice(what: str, value: str, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is in ``allowed``, else raise a one-line UserError."""
    allowed = list(allowed)
    if value not in allowed:
        raise UserError(f"unknown {what} {value!r}; {choices_hint(value, allowed)}")
    return value


def read_text_file(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of the file ``path`` that a user gave (a table, a config, an eval record); a one-line
    :class:`UserError` naming ``what`` and the file where it is missing, not a file, unreadable or not text."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} {str(path)!r} does not exist")
    if not path.is_file():
        raise UserError(f"{what} {str(path)!r} is not a file")
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"{what} {str(path)!r} cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {str(path)!r} is not a text file (not UTF-8)") from None
