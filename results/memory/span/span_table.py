"""How far back each core's memory reaches, from saved agents: `rfwp-rl probe --span` over every run of one env.

    python results/memory/span/span_table.py RUNS_ENV_DIR LAGS [EPISODES] [OUT_DIR]

RUNS_ENV_DIR holds run directories `<core>_s<seed>` of one env (as `launch/memory_suite.sh` writes them). For each
run, `rfwp_rl.impala.probe.probe(run, episodes=EPISODES, span=LAGS)` (sampled actions, env seeds 12345 on);
writes OUT_DIR/<env>.csv (one row per run and lag: the R² from the core output, the core state and the present
features) and prints a markdown table of the R² from the core output by lag, with the run's final return.
"""

import sys
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.impala.probe import probe
from rfwp_rl.memory.results import core_rank


def main(runs_env: Path, lags: int, episodes: int, out_dir: Path) -> None:
    runs = sorted(
        (p for p in runs_env.iterdir() if p.is_dir() and (p / "config.json").is_file()),
        key=lambda p: (core_rank(p.name.rsplit("_s", 1)[0]), p.name),
    )
    rows, table = [], []
    for run in runs:
        core, seed = run.name.rsplit("_s", 1)
        record = probe(run, episodes=episodes, span=lags)
        mean_return = sum(record["returns"]) / len(record["returns"])
        for r in record["span"]:
            rows.append({"env": record["env"], "core": core, "seed": seed, "step": record["step"], **r})
        output = {r["lag"]: r["r2_output"] for r in record["span"]}
        table.append(
            f"| {core} | {seed} | {mean_return:.2f} | "
            + " | ".join(f"{output[k]:.2f}" for k in range(1, lags + 1))
            + " |"
        )
        print(f"{core} seed {seed}: return {mean_return:.2f}", file=sys.stderr, flush=True)
    env = rows[0]["env"]
    atomic_write_csv(out_dir / f"{env.replace('/', '-')}.csv", rows, float_format=".4f")
    print(
        f"| core | seed | return ({episodes} episodes) | " + " | ".join(f"lag {k}" for k in range(1, lags + 1)) + " |"
    )
    print("|---|---|---|" + "---|" * lags)
    print("\n".join(table))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]),
        int(args[1]),
        int(args[2]) if len(args) > 2 else 100,
        Path(args[3]) if len(args) > 3 else Path(__file__).parent,
    )
