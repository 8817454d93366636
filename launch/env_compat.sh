#!/usr/bin/env bash
# The environment compatibility table: each env below trained with the defaults of `rfwp-rl train`
# (core CORE, default rdn; the vector profile) for a fixed budget of STEPS env steps, then results/envs/compat.csv
# and the table in results/envs/README.md (both written atomically): the env's spaces as the agent
# sees them, whether it trained (exit 0), env steps per second, the mean return of the last 100
# episodes, and the mean return of a uniformly random policy over 100 episodes for comparison.
#
#   bash launch/env_compat.sh                               # all envs, 51,200 steps each: results/envs/
#   STEPS=50000 IDS="Pendulum-v1 CartPole-v1" bash launch/env_compat.sh
#
# Envs of optional packages (popgym, minigrid, box2d: `pip install rfwp_rl[envs]`) are listed as
# "not installed" when their module is missing. Run directories: runs/env_compat/<env> (resumable;
# re-running the script resumes unfinished runs and rewrites the table).
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-51200}
CORE=${CORE:-rdn}
RUNS=${RUNS:-runs/env_compat}
THREADS=${THREADS:-1}
OUT=${OUT:-results/envs}
export CORE IDS_GIVEN=${IDS:+1}  # the table's header says so when IDS picks the envs
IDS=${IDS:-"CartPole-v1 Acrobot-v1 Pendulum-v1 MountainCarContinuous-v0 LunarLander-v3 FrozenLake-v1 Blackjack-v1
popgym:popgym-RepeatPreviousEasy-v0 popgym:popgym-PositionOnlyPendulumEasy-v0 popgym:popgym-BattleshipEasy-v0
popgym:popgym-MineSweeperEasy-v0 minigrid:MiniGrid-MemoryS7-v0 minigrid:MiniGrid-Empty-5x5-v0"}
mkdir -p "$RUNS" "$OUT"

for id in $IDS; do
  dir="$RUNS/$(echo "$id" | tr -c 'A-Za-z0-9.+\n-' '-')"
  mkdir -p "$dir"
  if OMP_NUM_THREADS=$THREADS python3 -m rfwp_rl train --env "$id" --core "$CORE" --total-steps "$STEPS" \
      --run-dir "$dir" --num-env-processes 1 --torch-threads "$THREADS" --log-every 10 > "$dir.log" 2>&1; then
    code=0
  else
    code=$?
  fi
  echo "$code $id" > "$dir.exit"
  echo "exit $code  $id"
done

python3 - "$RUNS" "$OUT" "$STEPS" $IDS <<'PY'
import csv, io, json, os, sys
from pathlib import Path

import numpy as np

from rfwp_rl.checkpoint import atomic_write_text
from rfwp_rl.envs import env_spec, make_env
from rfwp_rl.errors import UserError
from rfwp_rl.runlog import read_scalars

runs, out, steps, ids = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]


def describe(d):
    if d["type"] == "Dict":
        return "Dict(" + ", ".join(f"{k}: {describe(v)}" for k, v in d["spaces"].items()) + ")"
    if d["type"] == "Box":
        return f"Box({d['dtype']} {d['shape']})"
    return f"{d['type']}({d.get('n', d.get('nvec'))})"


def random_return(env_id, episodes=100):
    env = make_env(env_id, seed=0)
    returns = []
    env.reset()
    while len(returns) < episodes:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            env.reset()
    env.close()
    return float(np.mean(returns))


rows = []
for env_id in ids:
    name = "".join(c if c.isalnum() or c in ".+-" else "-" for c in env_id)
    row = {"env": env_id, "observation": "", "action": "", "trains": "no", "env_sps": "", "steps": "",
           "return_last100": "", "random_return": "", "note": ""}
    try:
        spec = env_spec(env_id)
    except UserError as e:
        row["note"] = "not installed" if "cannot import" in str(e) or "No module" in str(e) else str(e)
        rows.append(row)
        continue
    row["observation"], row["action"] = describe(spec.obs_space), describe(spec.action_space)
    exit_file = runs / f"{name}.exit"
    code = exit_file.read_text().split()[0] if exit_file.is_file() else "not run"
    row["trains"] = "yes" if code == "0" else "no"
    if code != "0":
        log = runs / f"{name}.log"
        lines = [l for l in log.read_text().splitlines() if l.strip()] if log.is_file() else []
        errors = [l for l in lines if l.startswith("error:")]  # the cause, not the closing lines
        row["note"] = (errors[-1] if errors else lines[-1] if lines else code)[:200]
    sps = read_scalars(runs / name, "perf/env_sps")
    ret = read_scalars(runs / name, "episode/return_mean100")
    if sps:
        row["env_sps"] = round(float(np.mean([v for _, v in sps[len(sps) // 2:]])))
    if ret:
        row["steps"], row["return_last100"] = ret[-1][0], round(ret[-1][1], 3)
    try:
        row["random_return"] = round(random_return(env_id), 3)
    except Exception as e:  # an env that cannot reset here, e.g. for an optional dependency it lacks
        row["note"] = row["note"] or f"{type(e).__name__}: {e}"[:200]
    rows.append(row)

buf = io.StringIO()
writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
writer.writeheader()
writer.writerows(rows)
atomic_write_text(out / "compat.csv", buf.getvalue())
head = "| env | observation | action | trains | env SPS | steps | return (last 100) | random | note |\n" \
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
table = head + "".join(f"| {r['env']} | {r['observation']} | {r['action']} | {r['trains']} | {r['env_sps']} | "
                       f"{r['steps']} | {r['return_last100']} | {r['random_return']} | {r['note']} |\n" for r in rows)
atomic_write_text(out / "README.md", "# Environment compatibility\n\n"
                  f"Written by `{'' if os.environ['CORE'] == 'rdn' else 'CORE=' + os.environ['CORE'] + ' '}"
                  f"STEPS={steps} bash launch/env_compat.sh`"
                  f"{' with `IDS` set to the envs below' if os.environ.get('IDS_GIVEN') else ''}: every env trained "
                  "with the defaults of "
                  f"`rfwp-rl train` (core {os.environ['CORE']}) for a fixed budget, one run at a time with one env process and one "
                  "torch thread; `return (last 100)` is the mean return of the last 100 training episodes (sampled "
                  "actions), `random` that of a uniformly random policy; `env SPS` is the mean env steps per second "
                  f"of a run's second half, on {os.cpu_count()} CPU cores with a 1-minute load average of "
                  f"{os.getloadavg()[0]:.1f} when the table was written.\n\n" + table)
print(table)
PY
