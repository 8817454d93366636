"""``rfwp-rl bench WHICH``: benchmarks that print a table and write ``results/bench/*.csv``.

Each benchmark is a module ``rfwp_rl.bench.<which>`` with ``add_arguments(parser)`` and
``run(args)``. Ratios are measured side by side in one run (the machine may be shared).
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "kernels": "fused step kernels vs the PyTorch reference, forward and forward+backward",
    "impala": "IMPALA env steps/s end to end and learner-only, per core",
    "seq": "sequence-trainer tokens/s per core",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))
    parser.add_argument("options", nargs=argparse.REMAINDER, help="options of that benchmark (see rfwp-rl bench WHICH --help)")


def run(args: argparse.Namespace) -> int | None:
    module = importlib.import_module(f"rfwp_rl.bench.{args.which}")
    parser = argparse.ArgumentParser(prog=f"rfwp-rl bench {args.which}", description=BENCHMARKS[args.which])
    module.add_arguments(parser)
    return module.run(parser.parse_args(args.options))
