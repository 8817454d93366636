"""Does a MiniGrid-MemoryS7 agent's memory still hold the cue when it chooses?

    python results/envs/memorys7_decode.py RUN_DIR [EPISODES]

Plays sampled episodes (env seeds 20000 on, torch seed 0) of the saved agent and keeps those whose cue
(a key or a ball in the start room) is in view at reset. For each it records the core state after each
of the first steps and at the last step before the choice, and the core's output there (what the policy
and value heads read), and fits a logistic regression (standardised
state, L2 1e-3) on the first half of the episodes that predicts which cue it was; prints the success rate
and the accuracy on the second half (0.5: the state holds nothing of the cue; 1: it holds it linearly),
then the same after step k = 1..STEPS with the share of episodes that still see the cue at that step (state,
then output).
"""

import sys

import gymnasium as gym
import minigrid  # noqa: F401 - registers MiniGrid-MemoryS7-v0
import numpy as np
import torch
from minigrid.core.world_object import Key

from rfwp_rl.impala.evaluate import load_agent

CUE = (1, 2)  # the start room's object in the 7x7 layout
STEPS = 10


def act(agent, obs: dict, reward: float, done: bool, state, prev: torch.Tensor, **kwargs) -> tuple[dict, tuple]:
    """One step of the agent on MemoryS7's Dict observation (batch 1, one step): its outputs and next state."""
    x = {"direction": torch.tensor([[obs["direction"]]]), "image": torch.from_numpy(obs["image"])[None, None]}
    with torch.no_grad():
        return agent(x, torch.tensor([[reward]]), torch.tensor([[done]]), state, prev, **kwargs)


def flat(state) -> np.ndarray:
    return torch.cat([s.reshape(-1).float() for s in state]).numpy()


def held_out_accuracy(states: list[np.ndarray], cues: np.ndarray) -> float:
    x = np.array(states)
    x = torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-6))
    y = torch.tensor(cues)
    n = len(x) // 2
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.01)
    for _ in range(2000):
        opt.zero_grad()
        logits = x[:n] @ w + b
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[:n]) + 1e-3 * (w * w).sum()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((((x[n:] @ w + b) > 0).float() == y[n:]).float().mean())


def main() -> None:
    agent, _, _, _ = load_agent(sys.argv[1], env="minigrid:MiniGrid-MemoryS7-v0")
    wanted = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    env = gym.make("MiniGrid-MemoryS7-v0")
    torch.manual_seed(0)
    by_step: list[list] = [[] for _ in range(STEPS)]  # (state, output, cue, cue in view) after step k + 1
    last, last_out, cues, wins = [], [], [], []
    seed = 20000
    while len(cues) < wanted:
        obs, _ = env.reset(seed=seed)
        seed += 1
        game = env.unwrapped
        if not game.in_view(*CUE):
            continue
        cues.append(float(isinstance(game.grid.get(*CUE), Key)))
        state, reward, done = agent.initial_state(1), 0.0, True
        prev = torch.zeros(1, 1, dtype=torch.long)
        seen = []
        while True:
            out, state = act(agent, obs, reward, done, state, prev, with_features=True)
            output = out["core_output"].reshape(-1).numpy()
            if len(seen) < STEPS:
                by_step[len(seen)].append((flat(state), output, cues[-1], game.in_view(*CUE)))
            seen.append((flat(state), output))
            prev = out["action"]
            obs, reward, terminated, truncated, _ = env.step(int(prev[0, 0]))
            done = False
            if terminated or truncated:
                break
        last.append(seen[-1][0])
        last_out.append(seen[-1][1])
        wins.append(reward > 0)
    y = np.array(cues, dtype=np.float32)
    first = [state for state, _, _, _ in by_step[0]]
    print(
        f"{len(cues)} episodes with the cue in view at reset, success {np.mean(wins):.2f}; the cue decoded "
        f"(held out) from the core state after the first step {held_out_accuracy(first, y):.2f}, "
        f"before the choice {held_out_accuracy(last, y):.2f} "
        f"(from the core output {held_out_accuracy(last_out, y):.2f})"
    )
    for k, rows in enumerate(by_step):
        if len(rows) >= 100:  # enough episodes last that long for the held-out half
            states, outputs, ys, views = zip(*rows)
            labels = np.array(ys, dtype=np.float32)
            print(
                f"after step {k + 1}: {len(rows)} episodes, cue in view {np.mean(views):.2f}, decoded "
                f"{held_out_accuracy(list(states), labels):.2f} (output {held_out_accuracy(list(outputs), labels):.2f})"
            )


if __name__ == "__main__":
    main()
