"""``rfwp-rl broker``: the moolib Broker at which groups of IMPALA learners meet.

Learners started with ``rfwp-rl train ... --broker HOST:PORT --group NAME`` register here; the
broker tells the members of each group who the others are, and starts a new membership round
(moolib "sync") when a learner joins or has been silent for the group timeout (10 s). It holds no
model and no data: gradients and the model travel between the learners directly
(:mod:`rfwp_rl.impala.multi_learner`). One broker serves any number of groups.

Every learner proves the shared key (``--auth-key-file``, ``$RFWP_AUTH_KEY`` or the default key
file, which the broker creates when there is none: :func:`rfwp_rl.impala.wire.resolve_key`) in
each connection's handshake; a peer without it is dropped before any of its calls is handled.
The broker listens on loopback unless ``--address`` names another interface.

Examples::

    rfwp-rl broker --address 10.0.0.1:4432
    rfwp-rl train --env Pong --core rdn --broker broker-host:4432 --group pong-rdn --seed 1   # on host 1
    rfwp-rl train --env Pong --core rdn --broker broker-host:4432 --group pong-rdn --seed 2   # on host 2

It prints moolib's group events (peers joining, timing out, membership rounds) and a heartbeat line
every ``--log-every`` seconds; Ctrl-C / SIGTERM stop it (exit 0). Restarting the broker is safe: the
learners reconnect and form their groups again.
"""

from __future__ import annotations

import argparse
import signal
import time

from rfwp_rl.errors import UserError
from rfwp_rl.impala.net import resolve_address
from rfwp_rl.impala.wire import resolve_key, secure_moolib
from rfwp_rl.runlog import format_duration

UPDATE_SECONDS = 0.25  # how often the broker checks timeouts and membership rounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default="127.0.0.1:4432",
        metavar="HOST:PORT",
        help="where to listen for learners (default %(default)s: this machine only; give the "
        "address of a private network's interface for learners on other machines)",
    )
    parser.add_argument(
        "--auth-key-file",
        default="",
        metavar="PATH",
        help="the key every learner must prove (mode 600); default: $RFWP_AUTH_KEY, else "
        "~/.config/rfwp_rl/auth.key (made if missing)",
    )
    parser.add_argument(
        "--log-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="seconds between heartbeat lines (default %(default)g)",
    )
    parser.add_argument("--quiet", action="store_true", help="no moolib group events, only heartbeat lines")


def run(args: argparse.Namespace) -> int:
    address = resolve_address(args.address, "--address")
    if not args.log_every > 0:
        raise UserError(f"--log-every {args.log_every:g} is invalid; allowed: seconds > 0")
    moolib = secure_moolib(resolve_key(args.auth_key_file, create=True, role="the broker"), listen=[address])
    if not args.quiet:
        moolib.set_log_level("info")  # moolib's broker logs joins, timeouts and membership rounds at info
    rpc = moolib.Rpc()
    rpc.set_name("broker")  # the name learners' groups look for
    broker = moolib.Broker(rpc)
    try:
        rpc.listen(address)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"--address {address}: cannot listen there ({str(e).splitlines()[0]})") from None
    start = last_log = time.monotonic()
    _say(f"broker listening on {address}; learners join with --broker HOST:{address.rpartition(':')[2]} --group NAME")
    stop: list[str] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: stop.append(signal.Signals(signum).name))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        while not stop:
            broker.update()
            time.sleep(UPDATE_SECONDS)
            now = time.monotonic()
            if now - last_log >= args.log_every:
                last_log = now
                _say(f"broker on {address} up {format_duration(now - start)}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _say(f"{stop[0]} received: broker stopped after {format_duration(time.monotonic() - start)}")
    return 0


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)
