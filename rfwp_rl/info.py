"""``rfwp-rl info``: cores and their options, Atari preset sizes, active kernel backend.

``rfwp-rl info --check`` also runs every op's fused kernels against the PyTorch reference
on this machine (:mod:`rfwp_rl.ops.selftest`) and exits non-zero if any disagrees."""

from __future__ import annotations

import argparse

from rfwp_rl import __version__, cores, kernels
from rfwp_rl.agent import atari_param_counts
from rfwp_rl.errors import UserError
from rfwp_rl.ops import selftest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-actions",
        type=int,
        default=6,
        help="action count for the Atari preset parameter counts (default %(default)s: Pong)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run every op's fused kernels (CPU, each GPU, and the CUDA sources "
        "emulated on the host) against the PyTorch reference: values and "
        "gradients, a table with timings; exit code 1 if any disagrees",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    if args.num_actions < 1:
        raise UserError(f"--num-actions {args.num_actions} is invalid; allowed: an integer >= 1")

    print(
        f"rfwp_rl {__version__} | torch {torch.__version__} | "
        f"cuda {'available' if torch.cuda.is_available() else 'not available'}"
    )
    backend, why = kernels.status()
    print(f"\nkernel backend: {backend} ({why})")

    print("\ncores (rfwp-rl train --core NAME --set core_config.OPTION=VALUE):")
    for name, spec in sorted(cores.available().items()):
        print(f"  {name:<12} {spec.description}" + (f"  [{spec.equations}]" if spec.equations else ""))
        if spec.defaults:
            opts = ", ".join(f"{k}={v!r}" for k, v in spec.defaults.items())
            print(f"  {'':<12} options: {opts}")

    print(f"\nAtari preset parameter counts ({args.num_actions} actions):")
    for name, count in atari_param_counts(args.num_actions).items():
        print(f"  {name:<12} {count:>12,}")
    if args.check:
        print()
        return selftest.main()
    return 0
