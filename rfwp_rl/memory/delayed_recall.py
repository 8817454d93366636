"""DelayedRecall: name a cue seen at the first step after a delay of distractors (T-maze-like)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rfwp_rl.memory.base import Episode, SequenceTask, check_int


class DelayedRecall(SequenceTask):
    """A cue shown once; after ``delay`` distractor steps, the answer is the cue.

    Dynamics (``n = n_symbols``, ``m = n_distractors``, ``T = delay + 2`` steps):

    * step 0: the cue ``c``, uniform in ``0..n-1``, in the cue channel;
    * steps ``1..delay``: a distractor, uniform in ``0..m-1`` each step, in its own channel
      (the cue channel is empty; actions do nothing and score nothing);
    * step ``delay + 1``: the query flag; the action there is the answer: reward 1 if it
      equals ``c``, else 0. The episode terminates after it.

    Observation ``float32 [n + m + 1]``: ``[0:n]`` cue one-hot (step 0 only),
    ``[n:n+m]`` distractor one-hot (steps 1..delay), ``[n+m]`` query flag (last step).
    Action ``Discrete(n)``: the symbol named (scored at the query step only).

    Levels: easy ``n=4, m=4, delay=8`` (10 steps); medium ``n=8, m=8, delay=32`` (34 steps);
    hard ``n=16, m=16, delay=128`` (130 steps). Keyword arguments ``n_symbols`` (>= 2),
    ``n_distractors`` (>= 0; 0 leaves the delay steps blank) and ``delay`` (>= 1) override.

    Returns: optimal 1; random ``1/n`` (0.25, 0.125, 0.0625); memory horizon ``delay + 1``.
    """

    task = "DelayedRecall"

    def __init__(self, level: str = "easy", **options: int) -> None:
        super().__init__(level, options)
        p = self.params
        self.n_symbols = check_int(self.task, "n_symbols", p["n_symbols"], 2)
        self.n_distractors = check_int(self.task, "n_distractors", p["n_distractors"], 0)
        self.delay = check_int(self.task, "delay", p["delay"], 1)
        n, m = self.n_symbols, self.n_distractors
        self.layout = {"cue": slice(0, n), "distractor": slice(n, n + m), "query": n + m}
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n + m + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(n)

    @property
    def episode_length(self) -> int:
        return self.delay + 2

    @property
    def memory_horizon(self) -> int:
        return self.delay + 1

    def _generate(self) -> Episode:
        n, m, delay = self.n_symbols, self.n_distractors, self.delay
        ep = Episode.empty(self.episode_length, n + m + 1)
        cue = int(self.np_random.integers(n))
        ep.obs[0, cue] = 1.0
        if m:
            ep.obs[np.arange(1, delay + 1), n + self.np_random.integers(m, size=delay)] = 1.0
        ep.obs[delay + 1, n + m] = 1.0
        ep.target[delay + 1] = cue
        ep.reward[delay + 1] = 1.0
        return ep
