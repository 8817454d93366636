"""Network helpers of the actor-learner: ``HOST:PORT`` addresses and settings comparison.

moolib 0.0.9b0 takes only IP addresses (a host name such as ``localhost:4431`` is read as a
URL scheme and aborts the process), so every address a user gives is checked and resolved
here first. Learners and remote actors compare their settings on connect; the first
difference is named in a one-line error.
"""

from __future__ import annotations

import socket
from typing import Any

from rfwp_rl.errors import UserError


def parse_address(text: str, flag: str) -> str:
    """``HOST:PORT`` with a port in 1..65535, else a one-line UserError."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {text!r} is invalid; allowed: HOST:PORT, e.g. 127.0.0.1:4431 or 0.0.0.0:4431")
    return text


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_address(text: str, flag: str) -> str:
    """``HOST:PORT`` with HOST resolved to an IP address (``[v6]:PORT`` for IPv6), as moolib needs it:
    moolib 0.0.9b0 aborts the process on a host name (``localhost:4431`` is read as a URL scheme).
    A name that does not resolve is a one-line UserError."""
    import ipaddress

    host, _, port = parse_address(text, flag).rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        try:
            infos = socket.getaddrinfo(bare, int(port), type=socket.SOCK_STREAM)
        except OSError as e:
            raise UserError(f"{flag} {text}: cannot resolve host {bare!r} ({e.strerror or e})") from None
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first
        ip = ipaddress.ip_address(infos[0][4][0])
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def first_difference(ours: dict, theirs: dict, prefix: str = "") -> tuple[str, Any, Any] | None:
    """``(dotted key, our value, their value)`` of the first key (sorted, nested dicts compared key
    by key) where two settings dicts differ, else None; a missing key has the value "<missing>".
    Plain values come before nested tables: a different core is named rather than the agent
    options that follow from it."""
    keys = sorted(set(ours) | set(theirs), key=lambda k: (isinstance(ours.get(k), dict), k))
    for key in keys:
        a, b = ours.get(key, "<missing>"), theirs.get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            inner = first_difference(a, b, f"{prefix}{key}.")
            if inner:
                return inner
        elif a != b:
            return f"{prefix}{key}", a, b
    return None


def first_mismatch(learner: dict, actor: dict) -> str | None:
    """One line naming the first key where ``actor`` differs from ``learner``, else None."""
    diff = first_difference(learner, actor)
    if diff is None:
        return None
    key, ours, theirs = diff
    return (
        f"actor {key} {theirs!r} does not match the learner's {ours!r}; start the actor with the "
        f"learner's --env/--core/--preset/--set/--env-option"
    )


def settings_mismatch(mine: dict, theirs: dict) -> str | None:
    """``"key: theirs != mine"`` for the first setting that differs, else None (nested dicts compared key by key)."""
    diff = first_difference(mine, theirs)
    if diff is None:
        return None
    key, a, b = diff
    return f"{key} {b!r} there, {a!r} here"
