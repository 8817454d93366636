"""``rfwp-rl keygen``: a new shared key for the peers of a training (learners, remote actors, the broker).

Every moolib connection proves this key (:mod:`rfwp_rl.impala.wire`). The key is
:data:`rfwp_rl.impala.wire.NEW_KEY_BYTES` random bytes from the OS, as hex. Without options it is printed
on stdout (only there: never on stderr or in a log); ``--auth-key-file PATH`` writes it to a new file
of mode 600 instead (never through a symbolic link, never over an existing file) and prints the path.

Examples::

    rfwp-rl keygen --auth-key-file ~/.config/rfwp_rl/auth.key   # the default key file of every command
    scp -p ~/.config/rfwp_rl/auth.key host1:.config/rfwp_rl/    # the same key on each machine
    RFWP_AUTH_KEY=$(rfwp-rl keygen) rfwp-rl broker               # or through the environment
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rfwp_rl.errors import UserError
from rfwp_rl.impala.wire import create_key_file, new_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:" + __doc__.split("Examples::", 1)[1]
    parser.add_argument(
        "--auth-key-file",
        default="",
        metavar="PATH",
        help="write the key to this new file (mode 600) instead of printing it; an existing file is never replaced",
    )


def run(args: argparse.Namespace) -> int:
    if not args.auth_key_file:
        print(new_key(), flush=True)
        return 0
    path = Path(args.auth_key_file).expanduser()
    try:
        create_key_file(path)
    except FileExistsError:
        raise UserError(
            f"--auth-key-file {path} exists; allowed: a path where nothing is (a key file is never replaced: "
            "remove it first, then copy the new key to every machine)"
        ) from None
    except OSError as e:
        raise UserError(f"--auth-key-file {path}: cannot create it ({e.strerror or e})") from None
    print(f"wrote a new auth key to {path} (mode 600); copy it to the same path on every machine of the training")
    return 0
