"""Where a Pendulum-v1 agent fails: greedy episodes split by the start angle.

    python scripts/pendulum_upright.py RUN [RUN ...] [--episodes 40]

For each run's newest checkpoint, plays ``--episodes`` greedy episodes (env i seeded 1000 + i) and
prints the mean return and, separately for the episodes that start with the pole below and above
the horizontal, how many end upright (cos(theta) > 0.95 in at least 90% of the last 100 steps).
A policy that balances from above but stays upright rarely from below has not learned the swing-up.
Also prints in how many of the states met the policy's mean lies past the action bounds, and past
twice them (normalised units, where the bounds are -1 and 1): a mean far past a bound acts
deterministically there.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from rfwp_rl.envs import make_env
from rfwp_rl.impala.evaluate import load_agent, play


def upright_counts(run: str, episodes: int) -> str:
    agent, meta, step, _ = load_agent(run, env="Pendulum-v1")
    envs = [make_env("Pendulum-v1", seed=1000 + i) for i in range(episodes)]
    cosines: dict[int, list[float]] = {}
    excess: list[np.ndarray] = []  # per state, how far the mean lies past the bound (Pendulum's 1 action dim)

    def observe(active, steps, inputs, out, state):  # obs = (cos theta, sin theta, theta dot)
        for j, i in enumerate(active):
            cosines.setdefault(i, []).append(float(inputs["x"][0, j, 0]))
        excess.append(agent.action_dist.out_of_bounds(out["policy_params"][0]).sqrt().numpy())

    played = play(agent, envs, [1] * episodes, greedy=True, observer=observe)
    past = np.concatenate(excess)
    upright = {e.env: np.mean(np.array(cosines[e.env][-100:]) > 0.95) >= 0.9 for e in played}
    below = [e.env for e in played if cosines[e.env][0] < 0]
    above = [e.env for e in played if cosines[e.env][0] >= 0]
    return (
        f"{run} (step {step:,}): greedy mean return {np.mean([e.score for e in played]):.0f}; upright at the "
        f"end: started below {sum(upright[i] for i in below)} of {len(below)}, "
        f"above {sum(upright[i] for i in above)} of {len(above)}; mean past the bound in "
        f"{np.mean(past > 0):.0%} of states, past twice it in {np.mean(past > 1):.0%}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories of Pendulum-v1 runs")
    parser.add_argument("--episodes", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for run in args.runs:
        print(upright_counts(run, args.episodes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
