"""Does a MiniGrid-MemoryS7 agent look at the cue, and does it choose by it?

    python results/envs/memorys7_episodes.py RUN_DIR [EPISODES]

Plays EPISODES (default 300) sampled episodes of the saved agent (env seeds 10000 on, torch seed 0) and sorts
them by whether the cue (the start room's object) was in view at reset, came into view later (the agent turned
round to see it), or never; prints the share of episodes, the success rate and the mean length of each.
"""

import sys

import gymnasium as gym
import minigrid  # noqa: F401 - registers MiniGrid-MemoryS7-v0
import torch
from memorys7_decode import CUE, act  # this folder's script: the cue's cell and the agent's step

from rfwp_rl.impala.evaluate import load_agent


def main() -> None:
    agent, _, _, _ = load_agent(sys.argv[1], env="minigrid:MiniGrid-MemoryS7-v0")
    episodes = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    env = gym.make("MiniGrid-MemoryS7-v0")
    torch.manual_seed(0)
    kinds: dict[str, list[tuple[bool, int]]] = {"in view at reset": [], "turned round to see it": [], "never seen": []}
    for seed in range(10000, 10000 + episodes):
        obs, _ = env.reset(seed=seed)
        game = env.unwrapped
        at_reset, seen = game.in_view(*CUE), game.in_view(*CUE)
        state, reward, done, steps = agent.initial_state(1), 0.0, True, 0
        prev = torch.zeros(1, 1, dtype=torch.long)
        while True:
            out, state = act(agent, obs, reward, done, state, prev)
            prev = out["action"]
            obs, reward, terminated, truncated, _ = env.step(int(prev[0, 0]))
            done, steps = False, steps + 1
            if terminated or truncated:
                break
            seen = seen or game.in_view(*CUE)
        kind = "in view at reset" if at_reset else "turned round to see it" if seen else "never seen"
        kinds[kind].append((reward > 0, steps))
    print(f"{episodes} episodes, success {sum(w for v in kinds.values() for w, _ in v) / episodes:.2f}")
    for kind, games in kinds.items():
        if games:
            wins = sum(w for w, _ in games) / len(games)
            length = sum(n for _, n in games) / len(games)
            print(f"cue {kind}: {len(games) / episodes:.2f} of episodes, success {wins:.2f}, {length:.1f} steps")


if __name__ == "__main__":
    main()
