"""What each core's decisions draw on, from saved agents: `rfwp-rl probe --saliency` over every run of one env.

    python results/memory/saliency/saliency_table.py RUNS_ENV_DIR LAGS [EPISODES] [FIRST_STEP] [OUT_DIR]

RUNS_ENV_DIR holds run directories `<core>_s<seed>` of one env (as `launch/memory_suite.sh` writes them). For each
run, `rfwp_rl.impala.probe.probe(run, episodes=EPISODES, saliency=LAGS, bin_steps=FIRST_STEP)` (sampled actions,
env seeds 12345 on); writes OUT_DIR/<env>.csv (one row per run and lag: the policy's and the value's share) and
prints a markdown table of the policy's share by lag and of its share from memory (lags above 0) at the steps
from FIRST_STEP on (the steps that score), with the run's return over the played episodes.
"""

import math
import sys
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.impala.probe import probe
from rfwp_rl.memory.results import core_rank


def main(runs_env: Path, lags: int, episodes: int, first_step: int, out_dir: Path) -> None:
    runs = sorted(
        (p for p in runs_env.iterdir() if p.is_dir() and (p / "config.json").is_file()),
        key=lambda p: (core_rank(p.name.rsplit("_s", 1)[0]), p.name),
    )
    rows, table = [], []
    for run in runs:
        core, seed = run.name.rsplit("_s", 1)
        record = probe(run, episodes=episodes, saliency=lags, bin_steps=first_step)
        mean_return = sum(record["returns"]) / len(record["returns"])
        for r in record["saliency"]:
            rows.append({"env": record["env"], "core": core, "seed": seed, "step": record["step"], **r})
        # bins of FIRST_STEP steps: every bin but the first holds scoring steps only; weighted by its samples
        later = [(r["samples"], r["policy_past_share"]) for r in record["rows"][1:]]
        later = [(n, v) for n, v in later if not math.isnan(v)]
        memory = sum(n * v for n, v in later) / sum(n for n, _ in later) if later else float("nan")
        share = {r["lag"]: r["policy_share"] for r in record["saliency"]}
        table.append(
            f"| {core} | {seed} | {mean_return:.2f} | "
            + " | ".join(f"{share[k]:.2f}" for k in range(lags + 1))
            + f" | {memory:.2f} |"
        )
        print(f"{core} seed {seed}: return {mean_return:.2f}", file=sys.stderr, flush=True)
    env = rows[0]["env"]
    atomic_write_csv(out_dir / f"{env.replace('/', '-')}.csv", rows, float_format=".4f")
    print(
        f"| core | seed | return ({episodes} episodes) | "
        + " | ".join(f"lag {k}" for k in range(lags + 1))
        + f" | from memory, steps {first_step} on |"
    )
    print("|---|---|---|" + "---|" * (lags + 2))
    print("\n".join(table))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]),
        int(args[1]),
        int(args[2]) if len(args) > 2 else 100,
        int(args[3]) if len(args) > 3 else 1,
        Path(args[4]) if len(args) > 4 else Path(__file__).parent,
    )
