"""The popgym table: per env, each core's mean return of the last 100 training episodes at the end of its
run and the best such mean along the way, beside a uniformly random policy's (from the runs' compat.csv).

    python results/envs/popgym_easy/table.py RUNS CORE [CORE ...] > table.md

RUNS holds, per core, the run directories ``RUNS/<core>/<env>`` and the table ``RUNS/tables_<core>/compat.csv``
that ``CORE=<core> RUNS=RUNS/<core> OUT=RUNS/tables_<core> bash launch/env_compat.sh`` writes.
"""

import csv
import sys
from pathlib import Path

from rfwp_rl.runlog import read_scalars


def main() -> None:
    runs, cores = Path(sys.argv[1]), sys.argv[2:]
    compat = {c: {r["env"]: r for r in csv.DictReader(open(runs / f"tables_{c}" / "compat.csv"))} for c in cores}
    envs = list(compat[cores[0]])
    print("| env | random | " + " | ".join(f"`{c}`: end (best)" for c in cores) + " |")
    print("|---" * (len(cores) + 2) + "|")
    for env in envs:
        name = "".join(ch if ch.isalnum() or ch in ".+-" else "-" for ch in env)  # env_compat.sh's run name
        cells = []
        for core in cores:
            curve = read_scalars(runs / core / name, "episode/return_mean100")
            cells.append(f"{curve[-1][1]:.2f} ({max(v for _, v in curve):.2f})" if curve else "-")
        random = compat[cores[0]][env]["random_return"]
        print(f"| {env.split(':')[-1]} | {float(random):.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
