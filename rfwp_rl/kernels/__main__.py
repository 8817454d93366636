"""``python -m rfwp_rl.kernels``: build (or load from the cache) the fused kernels and print
which backend is active and why. Exit code 1 when the kernels are unavailable."""

from __future__ import annotations

import argparse
import sys

from rfwp_rl import kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rfwp_rl.kernels", description=__doc__)
    parser.parse_args(argv)
    backend, why = kernels.status()
    print(f"{backend}: {why}")
    return 0 if backend == "kernel" else 1


if __name__ == "__main__":
    sys.exit(main())
