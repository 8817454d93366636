#!/usr/bin/env bash
# Classic control with the defaults: each env of IDS with each core of CORES and each seed of SEEDS for STEPS env
# steps (`rfwp-rl train` with nothing else but EXTRA), then 100 greedy episodes of each final checkpoint (`rfwp-rl
# eval`), then the table of final returns (the mean return of the last 100 training episodes, and the greedy
# episodes' mean, per seed, with their mean and 95% Student t interval) in OUT/README.md between its markers, and
# OUT/TABLE.csv (both written atomically). Resumable: re-running resumes unfinished runs from their newest
# checkpoint, finished runs return at once.
#
#   bash launch/classic_control.sh                                   # runs/classic/defaults -> results/envs/classic_control
#   EXTRA="--no-normalize-returns" RUNS=runs/classic/no_return_scaling TABLE=no_return_scaling \
#     bash launch/classic_control.sh                                 # an ablation: its own table in the same README
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-500000}
IDS=${IDS:-"CartPole-v1 Acrobot-v1"}
CORES=${CORES:-"rdn lstm gru ff"}
SEEDS=${SEEDS:-"1 2 3"}
EXTRA=${EXTRA:-}
RUNS=${RUNS:-runs/classic/defaults}
OUT=${OUT:-results/envs/classic_control}
TABLE=${TABLE:-defaults}
mkdir -p "$RUNS" "$OUT"

for seed in $SEEDS; do
  for id in $IDS; do
    for core in $CORES; do
      dir="$RUNS/$(echo "$id" | tr -c 'A-Za-z0-9.+\n-' '-')/${core}_s$seed"
      mkdir -p "$dir"
      echo "$id $core seed $seed: $dir"
      python3 -m rfwp_rl train --env "$id" --core "$core" --seed "$seed" --total-steps "$STEPS" --run-dir "$dir" \
        $EXTRA >> "$dir.log" 2>&1 || { echo "FAILED $id $core seed $seed (exit $?; log $dir.log)"; continue; }
      newest=$(ls "$dir"/ckpt_*.pt | sort | tail -1)
      [ -f "$dir/eval_$(basename "$newest" .pt | sed 's/^ckpt_//')_greedy.json" ] \
        || python3 -m rfwp_rl eval "$dir" --episodes 20 --repeats 5 >> "$dir.log" 2>&1 || echo "eval FAILED: $dir"
    done
  done
done

python3 - "$RUNS" "$OUT" "$TABLE" "$STEPS" "$EXTRA" <<'PY'
import json
import sys
from pathlib import Path

from rfwp_rl.checkpoint import atomic_write_text, csv_text
from rfwp_rl.memory.results import mean_sd_ci, update_readme
from rfwp_rl.runlog import read_scalars

runs, out, table, steps, extra = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
rows = []
for env_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
    for run in sorted(p for p in env_dir.iterdir() if p.is_dir()):
        curve = read_scalars(run, "episode/return_mean100")
        if curve and curve[-1][0] >= steps:
            core, seed = run.name.rsplit("_s", 1)
            greedy = run / f"eval_{curve[-1][0]:012d}_greedy.json"
            rows.append(
                {
                    "env": env_dir.name,
                    "core": core,
                    "seed": int(seed),
                    "steps": curve[-1][0],
                    "return_100": round(curve[-1][1], 1),
                    "greedy_100": round(json.loads(greedy.read_text())["mean"], 1) if greedy.exists() else None,
                }
            )
atomic_write_text(out / f"{table}.csv", csv_text(rows, ["env", "core", "seed", "steps", "return_100", "greedy_100"]))


def cells(values):
    """Per-seed values, then their mean and 95% interval (empty where a seed has none)."""
    if not values or None in values:
        return ["", ""]
    mean, _, half = mean_sd_ci(values)
    ci = f" [{mean - half:.0f}, {mean + half:.0f}]" if half == half else ""
    return [", ".join(f"{v:.0f}" for v in values), f"{mean:.0f}{ci}"]


lines = [
    "| env | core | seeds | return (last 100 training episodes) per seed | mean [95% CI] | greedy (100 episodes) per seed | mean [95% CI] |",
    "|---|---|---|---|---|---|---|",
]
for env in dict.fromkeys(r["env"] for r in rows):
    for core in dict.fromkeys(r["core"] for r in rows if r["env"] == env):
        mine = [r for r in rows if r["env"] == env and r["core"] == core]
        row = [env, core, str(len(mine)), *cells([r["return_100"] for r in mine]), *cells([r["greedy_100"] for r in mine])]
        lines.append("| " + " | ".join(row) + " |")
given = f' with EXTRA="{extra}"' if extra else ""
head = f"`bash launch/classic_control.sh`{given}, {steps:,} env steps per run ({table}.csv):"
update_readme(
    out / "README.md", f"{head}\n\n" + "\n".join(lines), f"<!-- {table} -->", f"<!-- /{table} -->", "Classic control with the defaults"
)
print("\n".join(lines))
PY
