"""CountRecall: after a stream of symbols, say how often each queried symbol was shown."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rfwp_rl.errors import UserError
from rfwp_rl.memory.base import Episode, SequenceTask, check_int


class CountRecall(SequenceTask):
    """A stream of ``n_show`` symbols, then ``n_queries`` symbols to answer with their count.

    Dynamics (``n = n_symbols``, ``M = max_count``, ``S = n_show``, ``Q = n_queries``,
    ``T = S + Q`` steps): ``Q`` distinct query symbols are drawn, each with a count
    ``c_j`` uniform in ``0..M``; the stream (steps ``0..S-1``) shows each query symbol
    exactly ``c_j`` times and fills the other ``S - sum(c_j)`` steps with the ``n - Q``
    other symbols (uniform), in a random order. Steps ``S..S+Q-1`` ask the query symbols
    (random order) with the query flag: the action scores ``1 / Q`` if it is the count
    ``c_j``, else 0. Actions during the stream score nothing.

    The counts are drawn first, so every answer is uniform in ``0..M`` whatever the query:
    no answer is a better guess than another without counting (drawing the stream first
    makes small counts rare late in an episode, and a frequent count a good blind guess).
    Filler symbols may be shown any number of times; they are never asked.

    Observation ``float32 [n + 1]``: ``[0:n]`` one-hot symbol (shown on stream steps, asked
    on query steps: the same input, so a query looks like the symbol it asks about);
    ``[n]`` query flag.
    Action ``Discrete(M + 1)``: the count 0..M.

    Levels: easy ``n=4, M=3, S=10, Q=2`` (12 steps); medium ``n=6, M=5, S=30, Q=4``
    (34 steps); hard ``n=10, M=8, S=80, Q=8`` (88 steps). Keyword arguments ``n_symbols``
    (>= 2), ``max_count`` (>= 1), ``n_queries`` (1..n-1: at least one filler symbol) and
    ``n_show`` (>= Q * M, so that every count fits) override.

    Returns: optimal 1; random ``1 / (M + 1)`` (0.25, 1/6, 1/9); memory horizon ``T - 1``
    (a symbol shown at step 0 counts at the last query).
    """

    task = "CountRecall"

    def __init__(self, level: str = "easy", **options: int) -> None:
        super().__init__(level, options)
        p = self.params
        self.n_symbols = check_int(self.task, "n_symbols", p["n_symbols"], 2)
        self.max_count = check_int(self.task, "max_count", p["max_count"], 1)
        self.n_queries = check_int(self.task, "n_queries", p["n_queries"], 1, self.n_symbols - 1)
        self.n_show = check_int(self.task, "n_show", p["n_show"], 1)
        if self.n_show < self.n_queries * self.max_count:
            raise UserError(
                f"{self.task}: n_show {self.n_show} cannot hold {self.n_queries} counts up to "
                f"max_count {self.max_count}; allowed: n_show >= n_queries * max_count "
                f"= {self.n_queries * self.max_count}"
            )
        n = self.n_symbols
        self.layout = {"symbol": slice(0, n), "query": n}
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.max_count + 1)

    @property
    def episode_length(self) -> int:
        return self.n_show + self.n_queries

    @property
    def memory_horizon(self) -> int:
        return self.episode_length - 1

    def _generate(self) -> Episode:
        n, S, Q, rng = self.n_symbols, self.n_show, self.n_queries, self.np_random
        ep = Episode.empty(S + Q, n + 1)
        order = rng.permutation(n)
        asked, fillers = order[:Q], order[Q:]
        counts = rng.integers(self.max_count + 1, size=Q)
        stream = np.concatenate([np.repeat(asked, counts), rng.choice(fillers, size=S - int(counts.sum()))])
        stream = rng.permutation(stream)
        ep.obs[np.arange(S), stream] = 1.0
        ep.obs[np.arange(S, S + Q), asked] = 1.0
        ep.obs[S:, n] = 1.0
        ep.target[S:] = counts
        ep.reward[S:] = 1.0 / Q
        return ep
