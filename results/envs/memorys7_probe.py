"""Can the agent learn MiniGrid-MemoryS7's choice by supervised training, and what does it need?

    python results/envs/memorys7_probe.py RUN_DIR LABEL AT AUX [UPDATES]

A fresh agent of the run's architecture (``RUN_DIR``: any MemoryS7 run of the core and agent options to
probe; its weights are not used) plus a linear head is trained by Adam (lr 1e-3, global norm clip 1,
batches of 32 episodes, torch seed 0) on scripted walks: the agent starts facing the start room (the cue
in view), turns round and walks to the junction (5 to 7 observations). The head reads the core's
output at step ``AT`` (``first`` or ``last``) and predicts ``LABEL``:

- ``cue``: key or ball (perception at the first step, memory at the last);
- ``turn``: whether the matching object is up, i.e. whether the remembered cue equals the object seen
  up at the junction (an exclusive-or of memory and view: what the policy must compute).

``AUX``: ``none``; ``cue`` (a second linear head also predicts the cue at the last step: an oracle
that makes the memory keep it); ``symbols`` (a two-layer head predicts, from the last step's output and a
lag k uniform over the episode, the object index of every cell of the view k steps back: recall of
the observation itself, no oracle); ``rare`` (the same, each cell's loss weighted by one over how often
its object is a target in the batch, so that walls and floor count as much as a key or a ball).
Prints the accuracy on 256 held-out episodes every 50 updates.

Importing this file also registers ``MemoryS7Facing-v0`` (the env of the walks) for RL runs.
"""

import sys

import gymnasium
import torch
import torch.nn.functional as F
from minigrid.core.world_object import Key
from minigrid.envs import MemoryEnv

from rfwp_rl.impala.evaluate import RunSpec, load_agent

LEFT, FORWARD = 0, 2
CUE = (1, 2)  # the start room's object in the 7x7 layout
JUNCTION = (5, 3)
OBJECTS = 11  # MiniGrid's object indices
MAX_LAG = 16


class MemoryFacing(MemoryEnv):
    """MemoryS7 with the agent facing west at reset: the cue is in view in every episode."""

    def _gen_grid(self, width, height):
        super()._gen_grid(width, height)
        self.agent_dir = 2


# the RL diagnostic: rfwp-rl train --env results/envs/memorys7_probe.py:MemoryS7Facing-v0 ...
gymnasium.register("MemoryS7Facing-v0", entry_point=MemoryFacing, kwargs={"size": 7})


def episode(env: MemoryFacing, seed: int) -> tuple[list, list[int], float, float]:
    obs, _ = env.reset(seed=seed)
    actions = [LEFT, LEFT] + [FORWARD] * (JUNCTION[0] - int(env.agent_pos[0]))
    frames = [obs]
    for a in actions:
        frames.append(env.step(a)[0])
    assert tuple(int(v) for v in env.agent_pos) == JUNCTION
    return frames, [0] + actions, float(env.success_pos[1] < JUNCTION[1]), float(isinstance(env.grid.get(*CUE), Key))


def batch(episodes: list) -> tuple:
    T, B = max(len(e[0]) for e in episodes), len(episodes)
    image = torch.zeros(T, B, 7, 7, 3, dtype=torch.uint8)
    direction, prev = torch.zeros(T, B, dtype=torch.long), torch.zeros(T, B, dtype=torch.long)
    done = torch.zeros(T, B, dtype=torch.bool)
    done[0] = True
    last, turn, cue = torch.zeros(B, dtype=torch.long), torch.zeros(B), torch.zeros(B)
    for b, (frames, actions, turn_b, cue_b) in enumerate(episodes):
        for t, o in enumerate(frames):
            image[t, b], direction[t, b], prev[t, b] = torch.from_numpy(o["image"]), int(o["direction"]), actions[t]
        last[b], turn[b], cue[b] = len(frames) - 1, turn_b, cue_b
    return {"image": image, "direction": direction}, prev, done, last, turn, cue


def main() -> None:
    run_dir, label, at, aux = sys.argv[1:5]
    updates = int(sys.argv[5]) if len(sys.argv) > 5 else 800
    _, meta, _, _ = load_agent(run_dir, env="minigrid:MiniGrid-MemoryS7-v0")
    torch.manual_seed(0)
    agent = RunSpec.from_meta(meta).build_agent()
    H = agent.core.output_size
    head, cue_head = torch.nn.Linear(H, 1), torch.nn.Linear(H, 1)
    recall = torch.nn.Sequential(torch.nn.Linear(H + MAX_LAG, 256), torch.nn.ReLU(), torch.nn.Linear(256, 49 * OBJECTS))
    params = [p for m in (agent, head, cue_head, recall) for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    env = MemoryFacing(size=7)

    def forward(data: tuple) -> tuple:
        obs, prev, done, last, turn, cue = data
        B = len(last)
        state = agent.initial_state(B)
        out, _ = agent(obs, torch.zeros(done.shape), done, state, prev, greedy=True, with_features=True)
        step = last if at == "last" else torch.zeros_like(last)
        h = out["core_output"][step, torch.arange(B)]
        return h, out["core_output"][last, torch.arange(B)], (turn if label == "turn" else cue)

    test = batch([episode(env, 10**6 + i) for i in range(256)])
    for u in range(updates + 1):
        if u % 50 == 0:
            with torch.no_grad():
                h, _, y = forward(test)
                accuracy = float(((head(h).squeeze(-1) > 0).float() == y).float().mean())
                print(f"update {u}: held-out accuracy {accuracy:.3f}", flush=True)
        data = batch([episode(env, u * 32 + i) for i in range(32)])
        h, h_last, y = forward(data)
        loss = F.binary_cross_entropy_with_logits(head(h).squeeze(-1), y)
        if aux == "cue":
            loss = loss + F.binary_cross_entropy_with_logits(cue_head(h_last).squeeze(-1), data[5])
        elif aux in ("symbols", "rare"):
            last, B = data[3], len(data[3])
            k = (torch.rand(B) * (last.float() + 1)).long().clamp(max=last)  # lag 0..last
            target = data[0]["image"][last - k, torch.arange(B), :, :, 0].long().reshape(B * 49)
            logits = recall(torch.cat([h_last, F.one_hot(k, MAX_LAG).float()], -1)).reshape(B * 49, OBJECTS)
            if aux == "symbols":
                loss = loss + F.cross_entropy(logits, target)
            else:
                weight = 1.0 / torch.bincount(target, minlength=OBJECTS).clamp(min=1).float()[target]
                loss = loss + (weight * F.cross_entropy(logits, target, reduction="none")).sum() / weight.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


if __name__ == "__main__":
    main()
