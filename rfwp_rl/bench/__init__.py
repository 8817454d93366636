"""``rfwp-rl bench WHICH``: benchmarks that print a table and write ``results/bench/*.csv``
(``kernels --device cuda``: ``results/gpu/kernels_cuda.csv``; ``meta_rl``: ``results/meta_rl/update_time.csv``;
``memory-health``: ``results/memory/health.*``).

Each benchmark is a module with ``add_arguments(parser)`` and ``run(args)``. Ratios are measured side by side
in one run (the machine may be shared).
"""

from __future__ import annotations

import argparse
import importlib

from rfwp_rl import flags

BENCHMARKS = {  # name -> (module, what it measures)
    "kernels": ("rfwp_rl.bench.kernels", "fused step kernels vs the PyTorch reference, forward and forward+backward"),
    "impala": (
        "rfwp_rl.bench.impala",
        "IMPALA env steps/s end to end and learner-only, per core; --topologies: one learner, remote actors "
        "and a learner group side by side",
    ),
    "seq": ("rfwp_rl.bench.seq", "sequence-trainer tokens/s per core"),
    "meta_rl": ("rfwp_rl.meta_rl.bench", "CPU and wall seconds of one A2C meta-RL update per agent"),
    "memory-health": (
        "rfwp_rl.memory.health",
        "every agent core on DelayedRecall-easy and AssociativeRecall-easy "
        "at a fixed budget; flags a core below 0.5 normalised on both (results/memory/health.*)",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "which", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v}" for k, (_, v) in BENCHMARKS.items())
    )
    parser.add_argument(
        "options", nargs=argparse.REMAINDER, help="options of that benchmark (see rfwp-rl bench WHICH --help)"
    )


def run(args: argparse.Namespace) -> int | None:
    module_name, description = BENCHMARKS[args.which]
    module = importlib.import_module(module_name)
    parser = flags.CommandParser(prog=f"rfwp-rl bench {args.which}", description=description)
    module.add_arguments(parser)
    return module.run(parser.parse_args(args.options))
