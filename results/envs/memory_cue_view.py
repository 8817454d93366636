"""Can a MiniGrid Memory agent see the cue from the junction, where it must choose?

    python results/envs/memory_cue_view.py [EPISODES]

For every registered MiniGrid-Memory env (EPISODES resets each, default 100): the agent is put at the junction at the
end of the hallway, facing back towards the start room, and its observation is read where the cue (the
start room's object) would be. Where the cue is in view there, a policy without memory can look back
from the junction and turn towards the matching end: its heading, not a memory, carries the choice.
"""

import re
import sys

import gymnasium as gym
import minigrid  # noqa: F401 - registers the MiniGrid ids
import numpy as np
from minigrid.core.constants import OBJECT_TO_IDX

WEST = 2  # minigrid's agent_dir: 0 east, 1 south, 2 west, 3 north


def cue_in_view_from_junction(env_id: str, seed: int) -> bool:
    env = gym.make(env_id)
    env.reset(seed=seed)
    game = env.unwrapped
    middle = game.height // 2
    cue_cell = (1, middle - 1)  # where MemoryEnv puts the start room's object
    junction = (game.success_pos[0], middle)  # the vertical hallway's cell in the middle row
    game.agent_pos, game.agent_dir = np.array(junction), WEST
    view = game.get_view_coords(*cue_cell)
    image = game.gen_obs()["image"]
    in_range = view is not None and 0 <= view[0] < image.shape[0] and 0 <= view[1] < image.shape[1]
    return in_range and image[view[0], view[1], 0] == OBJECT_TO_IDX[game.grid.get(*cue_cell).type]


def main() -> None:
    episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print("| env | cue seen from the junction, facing the start room |")
    print("|---|---|")
    ids = [i for i in gym.registry if i.startswith("MiniGrid-MemoryS")]
    for env_id in sorted(ids, key=lambda i: (int(re.search(r"S(\d+)", i).group(1)), i)):
        seen = sum(cue_in_view_from_junction(env_id, seed) for seed in range(episodes))
        print(f"| {env_id} | {seen} of {episodes} |")


if __name__ == "__main__":
    main()
