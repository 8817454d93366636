"""CountRecall: say how often a queried symbol has been seen so far in the episode."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rfwp_rl.errors import UserError
from rfwp_rl.memory.base import Episode, SequenceTask, check_int


class CountRecall(SequenceTask):
    """A stream of symbols with queries: how many times has this symbol been shown so far?

    Dynamics (``n = n_symbols``, ``M = max_count``, ``T = length``, ``E = query_every``):
    step ``t`` is a query step when ``(t + 1) % E == 0`` (steps ``E-1, 2E-1, ...``), so an
    episode has ``Q = T // E`` queries; every other step shows a symbol uniform in
    ``0..n-1``. At a query step the observation shows a query symbol ``q`` (in its own
    channel; a query is not a sighting) and the answer is ``min(count of q so far, M)``:
    the action scores ``1 / Q`` if it equals the answer, else 0. Actions at show steps score
    nothing. The episode terminates after ``T`` steps.

    The query symbol is drawn so that answers are spread out: first an answer ``c`` uniform
    among the distinct clipped counts of the symbols at that moment, then ``q`` uniform
    among the symbols whose clipped count is ``c``. (Drawing ``q`` uniformly would make the
    most common count a good guess without any counting.)

    Observation ``float32 [2n + 1]``: ``[0:n]`` one-hot shown symbol (show steps);
    ``[n:2n]`` one-hot query symbol (query steps); ``[2n]`` query flag.
    Action ``Discrete(M + 1)``: the count 0..M (M means "M or more").

    Levels: easy ``n=2, M=3, length=12, E=3`` (4 queries, 8 shown symbols); medium
    ``n=4, M=5, length=36, E=4`` (9 queries); hard ``n=8, M=8, length=96, E=6``
    (16 queries). Keyword arguments ``n_symbols`` (>= 1), ``max_count`` (>= 1),
    ``length`` (>= query_every) and ``query_every`` (>= 2) override.

    Returns: optimal 1; random ``1 / (M + 1)`` (0.25, 1/6, 1/9); memory horizon
    ``Q * E - 1``, the last query step (a symbol shown at step 0 counts there).
    """

    task = "CountRecall"

    def __init__(self, level: str = "easy", **options: int) -> None:
        super().__init__(level, options)
        p = self.params
        self.n_symbols = check_int(self.task, "n_symbols", p["n_symbols"], 1)
        self.max_count = check_int(self.task, "max_count", p["max_count"], 1)
        self.query_every = check_int(self.task, "query_every", p["query_every"], 2)
        self.length = check_int(self.task, "length", p["length"], 2)
        if self.length < self.query_every:
            raise UserError(f"{self.task}: length {self.length} has no query step with query_every "
                            f"{self.query_every}; allowed: length >= query_every")
        n = self.n_symbols
        self.layout = {"symbol": slice(0, n), "query_symbol": slice(n, 2 * n), "query": 2 * n}
        self.observation_space = spaces.Box(0.0, 1.0, shape=(2 * n + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.max_count + 1)

    @property
    def episode_length(self) -> int:
        return self.length

    @property
    def num_queries(self) -> int:
        return self.length // self.query_every

    @property
    def memory_horizon(self) -> int:
        return self.num_queries * self.query_every - 1  # from step 0 to the last query

    def _generate(self) -> Episode:
        n, rng = self.n_symbols, self.np_random
        ep = Episode.empty(self.length, 2 * n + 1)
        counts = np.zeros(n, np.int64)
        for t in range(self.length):
            if (t + 1) % self.query_every:
                s = int(rng.integers(n))
                ep.obs[t, s] = 1.0
                counts[s] += 1
                continue
            clipped = np.minimum(counts, self.max_count)
            answer = int(rng.choice(np.unique(clipped)))
            q = int(rng.choice(np.flatnonzero(clipped == answer)))
            ep.obs[t, n + q] = 1.0
            ep.obs[t, 2 * n] = 1.0
            ep.target[t] = answer
            ep.reward[t] = 1.0 / self.num_queries
        return ep
