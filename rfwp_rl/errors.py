"""User-facing errors: one line naming the bad value and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
