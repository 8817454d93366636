"""CueGrid: walk to the goal cell that a cue, shown only at the first step, pointed at."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from gymnasium import spaces

from rfwp_rl.errors import UserError
from rfwp_rl.memory.base import MemoryEnv, check_int

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (dx, dy) per action; y grows downwards


class CueGrid(MemoryEnv):
    """A ``size x size`` open grid; the agent starts in the centre, the goals are corners,
    and a cue shown only at step 0 says which goal pays.

    Dynamics (``S = size`` odd, ``G = n_goals``, ``L = max_steps``): goal cells in this
    order: top-left ``(0, 0)``, top-right ``(S-1, 0)``, bottom-left ``(0, S-1)``,
    bottom-right ``(S-1, S-1)`` (the first ``G`` of them; ``(x, y)``, ``y`` down). The agent
    starts at ``(S//2, S//2)``; the cued goal is uniform in ``0..G-1``. Step 0 is the cue
    step: the cue is shown and the action does not move the agent (as at a T-maze's cue
    cell), so the agent stands on the start cell, without the cue, at step 1 whatever the
    cue was. From then on each action moves one cell; a move into the outer wall leaves the
    agent where it is. Entering the cued goal gives +1, entering another goal
    ``-1 / (G - 1)``; either terminates the episode. After ``L`` steps without a goal the
    episode is truncated (``truncated=True``, ``terminated=False``, reward 0): a time limit,
    not a terminal state.

    Observation ``float32 [G + 2S + 4]``: ``[0:G]`` one-hot cue (step 0 only);
    ``[G:G+S]`` one-hot x; ``[G+S:G+2S]`` one-hot y; ``[G+2S:G+2S+4]`` wall flags next to
    the agent (up, right, down, left). Actions ``Discrete(4)``: 0 up, 1 right, 2 down, 3 left.

    Levels: easy ``S=5, G=2, L=20``; medium ``S=7, G=4, L=40``; hard ``S=11, G=4, L=80``.
    Every goal is ``S - 1`` moves from the start. Keyword arguments ``size`` (odd, >= 3),
    ``n_goals`` (2..4) and ``max_steps`` (>= S: the cue step and ``S - 1`` moves) override.

    Returns: optimal 1 (the shortest path to the cued goal never crosses another goal).
    Random 0, exactly, for every level, and for every policy without memory: from step 1 on
    its observations depend on the agent's cell only, and the cell at step 1 is the start
    whatever the cue, so it reaches each goal ``g`` with a probability ``h_g`` that does not
    depend on the cue; its expected return is ``sum_g h_g (1/G - (G-1)/G * 1/(G-1)) = 0``
    (the -1/(G-1) penalty is chosen for this: guessing a goal is worth exactly as much as
    never reaching one). Without the cue step, a memoryless agent would write the cue into
    its first move and read it back from its cell. Memory horizon ``L - 1`` (an agent may
    need the cue until its last step; an optimal one until step ``S - 1``).
    """

    task = "CueGrid"

    def __init__(self, level: str = "easy", **options: int) -> None:
        super().__init__(level, options)
        p = self.params
        self.size = check_int(self.task, "size", p["size"], 3)
        if self.size % 2 == 0:
            raise UserError(
                f"{self.task}: size {self.size} is invalid (the start is the centre cell); allowed: an odd integer >= 3"
            )
        self.n_goals = check_int(self.task, "n_goals", p["n_goals"], 2, 4)
        self.max_steps = check_int(self.task, "max_steps", p["max_steps"], self.size)
        s, g = self.size, self.n_goals
        self.goals = [(0, 0), (s - 1, 0), (0, s - 1), (s - 1, s - 1)][:g]
        self.start = (s // 2, s // 2)
        self.wrong_goal_reward = -1.0 / (g - 1)
        self.layout = {
            "cue": slice(0, g),
            "x": slice(g, g + s),
            "y": slice(g + s, g + 2 * s),
            "walls": slice(g + 2 * s, g + 2 * s + 4),
        }
        self.observation_space = spaces.Box(0.0, 1.0, shape=(g + 2 * s + 4,), dtype=np.float32)
        self.action_space = spaces.Discrete(4)
        self._distance = [self._distances_to(i) for i in range(g)]
        self._cue = -1
        self._pos = self.start
        self._t = 0
        self._done = True

    @property
    def max_episode_steps(self) -> int:
        return self.max_steps

    @property
    def memory_horizon(self) -> int:
        return self.max_steps - 1

    @property
    def optimal_return(self) -> float:
        return 1.0

    @property
    def random_return(self) -> float:
        return 0.0

    @property
    def position(self) -> tuple[int, int]:
        """The agent's cell ``(x, y)``."""
        return self._pos

    @property
    def cue(self) -> int:
        """Index of the rewarded goal in :attr:`goals` (hidden after step 0)."""
        return self._cue

    def _inside(self, x: int, y: int) -> bool:
        return 0 <= x < self.size and 0 <= y < self.size

    def _distances_to(self, goal: int) -> np.ndarray:
        """Moves from each cell ``[y, x]`` to ``goals[goal]`` without entering another goal
        (breadth-first search); -1 where it cannot be reached."""
        dist = np.full((self.size, self.size), -1, np.int64)
        gx, gy = self.goals[goal]
        dist[gy, gx] = 0
        blocked = set(self.goals) - {(gx, gy)}
        queue = deque([(gx, gy)])
        while queue:
            x, y = queue.popleft()
            for dx, dy in _MOVES:
                nx, ny = x + dx, y + dy
                if self._inside(nx, ny) and dist[ny, nx] < 0 and (nx, ny) not in blocked:
                    dist[ny, nx] = dist[y, x] + 1
                    queue.append((nx, ny))
        return dist

    def _obs(self) -> np.ndarray:
        g, s = self.n_goals, self.size
        x, y = self._pos
        obs = np.zeros(g + 2 * s + 4, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        obs[g + x] = 1.0
        obs[g + s + y] = 1.0
        for a, (dx, dy) in enumerate(_MOVES):
            obs[g + 2 * s + a] = float(not self._inside(x + dx, y + dy))
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(self.n_goals))
        self._pos = self.start
        self._t = 0
        self._done = False
        return self._obs(), {}

    def step(self, action: Any):
        action = self._check_action(action)
        if self._done:
            raise RuntimeError(f"{self.task}: the episode is over (or never started); call reset()")
        dx, dy = _MOVES[action] if self._t > 0 else (0, 0)  # the cue step does not move
        x, y = self._pos[0] + dx, self._pos[1] + dy
        if self._inside(x, y):
            self._pos = (x, y)
        self._t += 1
        reward, terminated = 0.0, False
        if self._pos in self.goals:
            terminated = True
            reward = 1.0 if self.goals.index(self._pos) == self._cue else self.wrong_goal_reward
        truncated = not terminated and self._t >= self.max_steps
        self._done = terminated or truncated
        return self._obs(), reward, terminated, truncated, {}

    def optimal_action(self) -> int:
        """A move along a shortest path to the cued goal that crosses no other goal."""
        if self._done:
            raise RuntimeError(f"{self.task}: the episode is over (or never started); call reset()")
        if self._t == 0:
            return 0  # the cue step: no action moves the agent
        dist = self._distance[self._cue]
        x, y = self._pos
        for a, (dx, dy) in enumerate(_MOVES):
            nx, ny = x + dx, y + dy
            if self._inside(nx, ny) and dist[ny, nx] == dist[y, x] - 1:
                return a
        raise AssertionError("no move gets closer to the cued goal")  # the grid is connected
