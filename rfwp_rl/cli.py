"""rfwp-rl: RL with Recurrent Fast Weight Programmers (rfwp-rl COMMAND --help for each command).

Each subcommand lives in its own module, which defines ``add_arguments(parser)`` and
``run(args) -> int | None``. Modules are imported lazily so that ``rfwp-rl info`` does not
pay for gymnasium or moolib. A :class:`rfwp_rl.errors.UserError` is printed as one line.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

from rfwp_rl import flags
from rfwp_rl.errors import UserError

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("rfwp_rl.info", "list cores, their options, Atari preset sizes and the kernel backend"),
    "train": ("rfwp_rl.impala.train", "train an agent with IMPALA/V-trace (Atari or any gymnasium env)"),
    "eval": ("rfwp_rl.impala.evaluate", "evaluate a saved agent (30 episodes x 5 repeats)"),
    "probe": (
        "rfwp_rl.impala.probe",
        "what a saved agent's memory does over an episode: entropy, value, state norms by step",
    ),
    "actor": ("rfwp_rl.impala.remote", "run remote actors that feed a learner over moolib RPC"),
    "broker": ("rfwp_rl.impala.broker", "run the moolib broker at which groups of learners (train --broker) meet"),
    "keygen": ("rfwp_rl.impala.keygen", "make a new shared auth key for learners, remote actors and the broker"),
    "memory-probe": (
        "rfwp_rl.memory.probe",
        "can a core store what a memory task asks? supervised training on its episodes beside the RL result",
    ),
    "memory-results": (
        "rfwp_rl.memory.results",
        "memory-suite runs (or the extended comparison's: --bench comparison) -> tables (default "
        "results/memory/easy_suite)",
    ),
    "minatar-results": ("rfwp_rl.minatar_results", "MinAtar runs -> tables, IQM and profile (default results/minatar)"),
    "compare": ("rfwp_rl.compare", "compare cores per game: tables and relative-improvement charts"),
    "meta-rl": ("rfwp_rl.meta_rl.train", "A2C meta-RL on random POMDP graphs (FWM paper, Sec. 4.2)"),
    "seq": ("rfwp_rl.seq.train", "language modelling and algorithmic sequence tasks"),
    "bench": (
        "rfwp_rl.bench",
        "benchmarks: kernels, impala, seq, meta_rl, memory-health (tables + CSV under results/)",
    ),
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; ``argv=None`` means this process is the ``rfwp-rl`` program itself."""
    own_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    parser = flags.CommandParser(prog="rfwp-rl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen, command_parser = argv[0] if argv else None, parser
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
            command_parser = p
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's own parser, so that its --help is the one pointed to
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code = args._module.run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    code = int(code or 0)
    if own_process:
        # The command's work is done (trainers have saved their checkpoint): a SIGTERM/SIGINT
        # during interpreter teardown ends the process with the command's own status.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: os._exit(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
