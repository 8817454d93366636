"""The wire between IMPALA processes: who may connect, and what a message may hold.

Every moolib connection of this package (learner <-> remote actors, learner <-> learner of a group,
learner <-> broker) proves a shared key before anything else crosses it: rfwp_rl's moolib build
(``third_party/moolib``) runs an HMAC-SHA256 challenge-response in each connection's greeting and
drops a peer that fails it before any of its calls is dispatched; it never pickles nor unpickles
(only None, bool, int, float, str, list, tuple, dict and tensors travel). This module finds the
key (:func:`resolve_key`), hands it to moolib together with the interfaces moolib may listen on
by itself (:func:`secure_moolib`), and wraps every Rpc handler so that a malformed message is
refused with one logged line instead of ending the process (:func:`handler`).
"""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from rfwp_rl.checkpoint import open_no_follow
from rfwp_rl.errors import UserError
from rfwp_rl.impala.env_batches import import_moolib

KEY_ENV = "RFWP_AUTH_KEY"
KEY_FILE_ENV = "RFWP_AUTH_KEY_FILE"
MIN_KEY_BITS = 128  # a shared key must have at least this much entropy (see key_bits)
NEW_KEY_BYTES = 32  # a key made here: 256 random bits, as hex
# The alphabets a key is measured by, smallest first: (name, its characters, size).
KEY_ALPHABETS = (
    ("hex digits", frozenset("0123456789abcdefABCDEF"), 16),
    ("base64 characters", frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"), 64),
    ("printable ASCII characters", frozenset(chr(c) for c in range(0x20, 0x7F)), 95),
)
MAX_NAME_CHARS = 100
MAX_TEXT_CHARS = 64 * 1024  # one string in a message (e.g. a settings JSON)
MAX_ITEMS = 100_000  # containers and their items in one message, tensors not counted
MAX_DEPTH = 16
WARN_EVERY_SECONDS = 10.0  # refused messages: one line per this many seconds, with the count


def default_key_file() -> Path:
    """Where the key lives unless ``--auth-key-file`` or ``RFWP_AUTH_KEY`` say otherwise:
    ``$RFWP_AUTH_KEY_FILE``, else ``~/.config/rfwp_rl/auth.key``."""
    given = os.environ.get(KEY_FILE_ENV)
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "rfwp_rl" / "auth.key"


def read_key_file(path: Path) -> str:
    """The key in ``path`` (whitespace stripped). One-line UserError if it is missing, a symbolic link or
    not a regular file (never followed: see :func:`rfwp_rl.checkpoint.open_no_follow`), readable by
    other users (like ssh: the file is a password) or too weak (:func:`check_key`)."""
    try:
        fd = open_no_follow(path, os.O_RDONLY, "auth key file")
    except FileNotFoundError:
        raise UserError(f"auth key file {path} does not exist") from None
    except OSError as e:
        raise UserError(f"cannot read auth key file {path} ({e})") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(
                f"auth key file {path} is accessible by other users (mode {stat.S_IMODE(mode):o}); "
                f"run: chmod 600 {path}"
            )
        try:
            text = f.read(64 * 1024).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read auth key file {path} ({e})") from None
    return check_key(text, str(path))


def key_bits(key: str) -> tuple[float, str] | None:
    """The entropy a key can have, by the rule every key must pass: its length times log2 of the size of
    the smallest alphabet of :data:`KEY_ALPHABETS` it is written in (base64's ``=`` padding not counted),
    and that alphabet's name; None if it is not printable ASCII."""
    for name, characters, size in KEY_ALPHABETS:
        body = key.rstrip("=") if size == 64 else key
        if set(body) <= characters:
            return len(body) * math.log2(size), name
    return None


def key_rule() -> str:
    """The rule of :func:`key_bits` in words: the fewest characters of each alphabet."""
    least = ", ".join(f"{math.ceil(MIN_KEY_BITS / math.log2(size))}+ {name}" for name, _, size in KEY_ALPHABETS)
    return f"at least {MIN_KEY_BITS} bits of entropy ({least})"


def check_key(key: str, where: str) -> str:
    """``key`` if it passes :func:`key_bits` with at least :data:`MIN_KEY_BITS` bits, else a one-line
    UserError naming ``where`` it comes from (never the key itself) and the rule."""
    measured = key_bits(key)
    if measured is None or measured[0] < MIN_KEY_BITS:
        what = "is not printable ASCII" if measured is None else f"has {len(key)} {measured[1]}, {measured[0]:.0f} bits"
        raise UserError(f"the auth key in {where} {what}; allowed: {key_rule()}; make one with: rfwp-rl keygen")
    return key


def new_key() -> str:
    """A new random key: :data:`NEW_KEY_BYTES` bytes from the OS's CSPRNG, as hex."""
    return secrets.token_hex(NEW_KEY_BYTES)


def create_key_file(path: Path) -> str:
    """A new key (:func:`new_key`) in a new file ``path``, created with mode 0600 and never through a symbolic
    link (its folder made with mode 0700 if missing). FileExistsError if anything is at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = new_key()
    fd = open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "auth key file", 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def resolve_key(key_file: str | None, create: bool, role: str) -> str:
    """The shared key: ``--auth-key-file`` if given, else ``$RFWP_AUTH_KEY``, else the default key
    file (:func:`default_key_file`). ``create`` (a learner listening for actors, a broker): make the
    default file when nothing is there and say where it is (the key itself is never printed); else
    (an actor, a learner joining a group) a missing key is a one-line error."""
    if key_file:
        return read_key_file(Path(key_file).expanduser())
    if os.environ.get(KEY_ENV):
        return check_key(os.environ[KEY_ENV].strip(), f"${KEY_ENV}")
    path = default_key_file()
    if os.path.lexists(path):
        return read_key_file(path)
    if not create:
        raise UserError(
            f"{role} needs the shared auth key of its learner/broker: copy that machine's "
            f"{path} to {path} here (mode 600), or pass --auth-key-file PATH, or set ${KEY_ENV}"
        )
    try:
        key = create_key_file(path)
    except FileExistsError:  # made meanwhile by another process of this user
        return read_key_file(path)
    print(
        f"created a new auth key in {path} (mode 600): every actor, learner and broker of this training "
        f"needs it: copy the file to the same path on the other machines, or pass --auth-key-file PATH / "
        f"set ${KEY_ENV}",
        file=sys.stderr,
        flush=True,
    )
    return key


def _host(address: str) -> str:
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") else host


def local_address_towards(ip: str) -> str:
    """This machine's address on the interface that routes to ``ip`` (no packet is sent)."""
    family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
            return s.getsockname()[0]
        except OSError:
            return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def listen_hosts(listen: Iterable[str] = (), connect: Iterable[str] = ()) -> list[str]:
    """Interfaces moolib may listen on by itself (random ports, for peers that connect back, as the
    members of a learner group do): the hosts of this process's ``listen`` addresses and the local
    interfaces that route to its ``connect`` addresses; loopback if none. Resolved ``IP:PORT`` inputs."""
    hosts = [_host(a) for a in listen] + [local_address_towards(_host(a)) for a in connect]
    return list(dict.fromkeys(hosts)) or ["127.0.0.1"]


def secure_moolib(key: str, listen: Iterable[str] = (), connect: Iterable[str] = ()) -> Any:
    """moolib, with the shared key set for every connection this process makes or accepts from now
    on, and its own listeners restricted to :func:`listen_hosts`. Call before creating an Rpc."""
    moolib = import_moolib()
    if not hasattr(moolib, "set_auth_key"):
        raise UserError(
            "the installed moolib has no peer authentication (not rfwp_rl's build of it); "
            "run: bash scripts/build_moolib.sh"
        )
    moolib.set_auth_key(key)
    moolib.set_listen_hosts(listen_hosts(listen, connect))
    return moolib


def refused_connections() -> int:
    """Connections refused so far in this process before or at the key handshake: a missing or wrong proof, and
    (the patched moolib's limits) oversize or malformed packets; ``moolib.connection_refusals()`` splits them by
    reason."""
    return int(import_moolib().auth_refusals())


def refused_model_updates() -> dict[str, int]:
    """Model and buffer updates of a learner group that moolib refused so far in this process, by reason:
    ``not_leader``, ``not_requested``, ``mismatch`` (count, dtype or shape), ``not_finite``."""
    return {str(k): int(v) for k, v in import_moolib().accumulator_refusals().items()}


# ---------------------------------------------------------------- messages


class Refused(ValueError):
    """A message that does not have the expected form (the text says what is wrong, in one line)."""


def check_plain(value: Any, what: str = "message") -> None:
    """Raise :class:`Refused` unless ``value`` is plain data: None, bool, int, float, str (at most
    ``MAX_TEXT_CHARS``), tensors, and lists, tuples and dicts with str keys of these, at most
    ``MAX_DEPTH`` deep and ``MAX_ITEMS`` items. What moolib refuses anyway (pickles), this names
    before sending; what it lets through (huge or deeply nested containers), this bounds."""
    count = 0
    stack = [(value, what, 0)]
    while stack:
        v, path, depth = stack.pop()
        count += 1
        if count > MAX_ITEMS:
            raise Refused(f"{what} has more than {MAX_ITEMS} items")
        if depth > MAX_DEPTH:
            raise Refused(f"{path} is nested deeper than {MAX_DEPTH}")
        if v is None or isinstance(v, (bool, int, float, torch.Tensor)):
            continue
        if isinstance(v, str):
            if len(v) > MAX_TEXT_CHARS:
                raise Refused(f"{path} is a string of {len(v)} characters (at most {MAX_TEXT_CHARS})")
        elif isinstance(v, (list, tuple)):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v))
        elif isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise Refused(f"{path} has a key of type {type(k).__name__} (only str)")
                stack.append((item, f"{path}.{k}", depth + 1))
        else:
            raise Refused(
                f"{path} is a {type(v).__name__}; only None, bool, int, float, str, list, tuple, dict "
                "and tensors travel"
            )


def check_name(name: Any, what: str = "name") -> str:
    """A peer's name: a str of 1..MAX_NAME_CHARS printable characters."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise Refused(f"{what} must be 1-{MAX_NAME_CHARS} printable characters")
    return name


def check_int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refused(f"{what} must be an integer in [{low}, {high}], got {short(value)}")
    return value


def check_finite_number(value: Any, what: str, bound: float = 1e30) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or abs(value) > bound:
        raise Refused(f"{what} must be a finite number, got {short(value)}")
    return float(value)


def check_like(value: Any, template: Any, what: str) -> None:
    """Raise :class:`Refused` unless ``value`` has the form of ``template`` (e.g. this side's own state):
    dicts with the same keys, lists and tuples of the same length, then item by item: a bool, an int
    or a str where the template has one, a finite number where it has a float, None where it has None,
    and a tensor of its dtype and shape, with finite values if floating point."""
    if isinstance(template, dict):
        if not isinstance(value, dict) or set(value) != set(template):
            got = sorted(map(str, value)) if isinstance(value, dict) else short(value)
            raise Refused(f"{what} must hold {sorted(map(str, template))}, got {got}")
        for key, item in template.items():
            check_like(value[key], item, f"{what}.{key}")
    elif isinstance(template, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(template):
            raise Refused(f"{what} must be a list of {len(template)}, got {short(value)}")
        for i, (item, like) in enumerate(zip(value, template)):
            check_like(item, like, f"{what}[{i}]")
    elif isinstance(template, torch.Tensor):
        if not isinstance(value, torch.Tensor) or value.dtype != template.dtype or value.shape != template.shape:
            raise Refused(f"{what} must be a tensor {list(template.shape)} {template.dtype}, got {short(value)}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise Refused(f"{what} holds NaN or inf values")
    elif isinstance(template, float) and not isinstance(template, bool):
        check_finite_number(value, what)
    elif template is not None and not isinstance(template, (bool, int, str)):
        raise TypeError(f"check_like: no rule for a template {type(template).__name__} ({what})")
    elif type(value) is not type(template):
        raise Refused(f"{what} must be {type(template).__name__}, got {short(value)}")


def short(value: Any) -> str:
    text = repr(value) if not isinstance(value, torch.Tensor) else f"tensor {list(value.shape)} {value.dtype}"
    return text if len(text) <= 60 else text[:57] + "..."


class RefusalLog:
    """Counts refused messages and says so on stderr: the first one at once, then at most one line
    per ``WARN_EVERY_SECONDS`` with the count since (a flood of bad messages cannot flood the log)."""

    def __init__(self, who: str):
        self.who = who
        self.count = 0
        self._lock = threading.Lock()
        self._last_line = -math.inf
        self._unreported = 0

    def refuse(self, problem: str) -> None:
        with self._lock:
            self.count += 1
            self._unreported += 1
            now = time.monotonic()
            if now - self._last_line < WARN_EVERY_SECONDS:
                return
            more = f" ({self._unreported - 1} more refused since the last line)" if self._unreported > 1 else ""
            self._last_line, self._unreported = now, 0
        try:
            print(f"warning: {self.who} refused a message: {problem}{more}", file=sys.stderr, flush=True)
        except BaseException:  # noqa: BLE001 - never raise from a handler
            pass


def handler(fn: Callable[..., Any], refusals: RefusalLog) -> Callable[..., Any]:
    """``fn`` as an Rpc handler that never raises (an exception inside a moolib handler, or a reply
    moolib cannot send, aborts the whole process): a :class:`Refused` message is counted and answered
    ``{"error": ...}``; any other exception likewise (a call with the wrong arguments, or a bug of this
    side); the reply must be plain. Every ``Rpc.define`` of this package goes through it."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            reply = fn(*args, **kwargs)
        except Refused as e:
            refusals.refuse(f"{fn.__name__}: {e}")
            return {"error": f"refused: {e}"}
        except BaseException as e:  # noqa: BLE001
            message = f"could not handle {fn.__name__}: {type(e).__name__}: {str(e)[:200]}"
            refusals.refuse(message)
            return {"error": message}
        try:
            check_plain(reply, "the reply")
        except Refused as e:
            message = f"could not handle {fn.__name__}: {e}"
            refusals.refuse(message)
            return {"error": message}
        return reply

    wrapped.__name__ = fn.__name__
    return wrapped
