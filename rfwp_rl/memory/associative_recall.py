"""AssociativeRecall: (key, value) pairs, then queries for keys; optionally with re-assignment."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rfwp_rl.errors import UserError
from rfwp_rl.memory.base import Episode, SequenceTask, check_int


class AssociativeRecall(SequenceTask):
    """``N`` (key, value) pairs, one per step, then ``Q`` keys to answer with their value.

    Dynamics (``K = n_keys``, ``V = n_values``, ``N = n_pairs``, ``Q = n_queries``,
    ``T = N + Q`` steps):

    * write steps ``0..N-1``: ``N`` distinct keys (uniform without replacement from
      ``0..K-1``), each with a value uniform in ``0..V-1``; actions score nothing;
    * query steps ``N..N+Q-1``: ``Q`` distinct keys of those written (uniform without
      replacement, random order), shown with the query flag and no value; the action scores
      ``1 / Q`` if it is the key's value, else 0. The episode terminates after the last query.

    Observation ``float32 [K + V + 1]``: ``[0:K]`` one-hot key (every step); ``[K:K+V]``
    one-hot value (write steps only); ``[K+V]`` query flag (query steps).
    Action ``Discrete(V)``: the value named.

    Levels: easy ``K=8, V=4, N=4, Q=4`` (8 steps); medium ``K=32, V=8, N=16, Q=8``
    (24 steps); hard ``K=48, V=16, N=48, Q=16`` (64 steps). Keyword arguments ``n_keys``
    (>= 1), ``n_values`` (>= 2), ``n_pairs`` (1..K) and ``n_queries`` (1..N) override.

    Returns: optimal 1; random ``1/V`` (0.25, 0.125, 0.0625); memory horizon ``N + Q - 1``
    (the first pair may be asked at the last step).
    """

    task = "AssociativeRecall"

    def __init__(self, level: str = "easy", **options: int) -> None:
        super().__init__(level, options)
        self._check_params()
        k, v = self.n_keys, self.n_values
        self.layout = {"key": slice(0, k), "value": slice(k, k + v), "query": k + v}
        self.observation_space = spaces.Box(0.0, 1.0, shape=(k + v + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(v)

    def _check_params(self) -> None:
        p = self.params
        self.n_keys = check_int(self.task, "n_keys", p["n_keys"], 1)
        self.n_values = check_int(self.task, "n_values", p["n_values"], 2)
        self.n_pairs = check_int(self.task, "n_pairs", p["n_pairs"], 1)
        self.n_queries = check_int(self.task, "n_queries", p["n_queries"], 1)
        if self.n_pairs > self.n_keys:
            raise UserError(
                f"{self.task}: n_pairs {self.n_pairs} is too large for n_keys {self.n_keys} "
                f"(each key is written once); allowed: n_pairs <= n_keys"
            )
        if self.n_queries > self.n_pairs:
            raise UserError(
                f"{self.task}: n_queries {self.n_queries} is more than the {self.n_pairs} keys "
                f"written (queries ask distinct keys); allowed: n_queries <= n_pairs"
            )

    @property
    def episode_length(self) -> int:
        return self.n_pairs + self.n_queries

    @property
    def memory_horizon(self) -> int:
        return self.episode_length - 1

    def _fill(self, keys: np.ndarray, values: np.ndarray, query_keys: np.ndarray, answers: np.ndarray) -> Episode:
        k, v = self.n_keys, self.n_values
        nw, nq = len(keys), len(query_keys)
        ep = Episode.empty(nw + nq, k + v + 1)
        ep.obs[np.arange(nw), keys] = 1.0
        ep.obs[np.arange(nw), k + values] = 1.0
        ep.obs[np.arange(nw, nw + nq), query_keys] = 1.0
        ep.obs[nw:, k + v] = 1.0
        ep.target[nw:] = answers
        ep.reward[nw:] = 1.0 / nq
        return ep

    def _generate(self) -> Episode:
        rng = self.np_random
        keys = rng.choice(self.n_keys, size=self.n_pairs, replace=False)
        values = rng.integers(self.n_values, size=self.n_pairs)
        asked = rng.choice(self.n_pairs, size=self.n_queries, replace=False)
        return self._fill(keys, values, keys[asked], values[asked])


class AssociativeRecallReassign(AssociativeRecall):
    """Associative recall where some keys get a new value later in the write phase; only
    the most recent value of a key scores. A sum of outer products (``lt``) keeps the old
    value mixed in; the delta rule replaces it.

    Dynamics (``K = n_keys``, ``V = n_values``, ``N = n_pairs`` writes, ``R = n_reassign``
    re-writes, ``Q = n_queries``, ``D = N - R`` distinct keys, ``T = N + Q`` steps):

    * write steps ``0..N-1``: ``D`` distinct keys (uniform from ``0..K-1``) plus ``R``
      re-writes of them, shuffled together; the re-writes go to the ``D`` keys in a random
      order, each key at most once until all have one (so ``min(R, D)`` keys are
      re-assigned). A key's first value is uniform in ``0..V-1``; every re-write gives a value
      *different* from the key's current one (uniform among the other ``V - 1``), so the
      most recent value (one write per step) is never the same as an older one;
    * query steps ``N..N+Q-1``: ``Q`` distinct written keys, re-assigned keys first (all of
      them when ``Q >= min(R, D)``, else a random subset), the rest from the other keys, in
      random order; shown with the query flag and no value. The action scores ``1 / Q`` if
      it is the key's most recent value, else 0.

    Every value, the most recent included, is uniform in ``0..V-1`` by itself, so neither
    the query nor the order of the queries tells the answer.

    Observation ``float32 [K + V + 1]`` and actions as in :class:`AssociativeRecall`.

    Levels: easy ``K=4, V=4, N=6, R=2, Q=3`` (4 keys, 9 steps); medium
    ``K=8, V=8, N=12, R=4, Q=4`` (8 keys, 16 steps); hard ``K=48, V=16, N=64, R=16, Q=16``
    (48 keys, 80 steps). Keyword arguments ``n_keys`` (>= 1), ``n_values`` (>= 2),
    ``n_pairs``, ``n_reassign`` (1..N-1, with ``N - R <= K``) and ``n_queries``
    (1..N-R) override.

    Returns: optimal 1; random ``1/V`` (0.25, 0.125, 0.0625); memory horizon ``N + Q - 1``.
    """

    task = "AssociativeRecallReassign"

    def _check_params(self) -> None:
        p = self.params
        self.n_keys = check_int(self.task, "n_keys", p["n_keys"], 1)
        self.n_values = check_int(self.task, "n_values", p["n_values"], 2)
        self.n_pairs = check_int(self.task, "n_pairs", p["n_pairs"], 2)
        self.n_reassign = check_int(self.task, "n_reassign", p["n_reassign"], 1, self.n_pairs - 1)
        self.n_queries = check_int(self.task, "n_queries", p["n_queries"], 1)
        distinct = self.n_pairs - self.n_reassign
        if distinct > self.n_keys:
            raise UserError(
                f"{self.task}: n_pairs {self.n_pairs} with n_reassign {self.n_reassign} needs "
                f"{distinct} distinct keys, more than n_keys {self.n_keys}; "
                f"allowed: n_pairs - n_reassign <= n_keys"
            )
        if self.n_queries > distinct:
            raise UserError(
                f"{self.task}: n_queries {self.n_queries} is more than the {distinct} distinct keys "
                f"written (queries ask distinct keys); allowed: n_queries <= n_pairs - n_reassign"
            )

    @property
    def n_distinct(self) -> int:
        return self.n_pairs - self.n_reassign

    def _generate(self) -> Episode:
        rng, V = self.np_random, self.n_values
        distinct = rng.choice(self.n_keys, size=self.n_distinct, replace=False)
        # re-writes cycle through the keys in a random order: every key is re-assigned once
        # before any key twice
        rewrites = np.resize(rng.permutation(distinct), self.n_reassign)
        keys = rng.permutation(np.concatenate([distinct, rewrites]))
        values = np.empty(self.n_pairs, np.int64)
        current: dict[int, int] = {}
        for i, key in enumerate(keys.tolist()):
            if key in current:  # a new value, never the current one
                values[i] = (current[key] + rng.integers(1, V)) % V
            else:
                values[i] = rng.integers(V)
            current[key] = int(values[i])
        reassigned = np.unique(rewrites)
        others = np.setdiff1d(distinct, reassigned)
        candidates = np.concatenate([rng.permutation(reassigned), rng.permutation(others)])
        query_keys = rng.permutation(candidates[: self.n_queries])
        answers = np.array([current[int(k)] for k in query_keys], np.int64)
        return self._fill(keys, values, query_keys, answers)
