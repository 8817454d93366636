"""The uniformly random policy's mean episode length on PositionOnlyCartPole (the cart-pole's dynamics).

    python results/memory/random_cartpole/measure.py [EPISODES]

Plays EPISODES (default 200,000) episodes of ``rfwp/PositionOnlyCartPole-easy-v0`` (env seeds 0 on, actions from
``numpy.random.default_rng(0)``) and prints the mean length, its standard error and the longest episode. The
suite's random reference for the task (``RANDOM_CARTPOLE_STEPS`` in ``rfwp_rl/memory/suite.py``) is this mean.
"""

import sys

import numpy as np

from rfwp_rl.memory.position_cartpole import PositionOnlyCartPole


def main() -> None:
    episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    env, rng = PositionOnlyCartPole("easy"), np.random.default_rng(0)
    lengths = np.empty(episodes)
    for i in range(episodes):
        env.reset(seed=i)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            steps, done = steps + 1, terminated or truncated
        lengths[i] = steps
    sem = lengths.std(ddof=1) / np.sqrt(episodes)
    print(
        f"{episodes} episodes: mean length {lengths.mean():.2f} steps, standard error {sem:.3f}, "
        f"longest {int(lengths.max())} (step limit {env.max_episode_steps})"
    )


if __name__ == "__main__":
    main()
