"""RepeatPrevious: name the symbol shown k steps earlier, at every step from step k on."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rfwp_rl.errors import UserError
from rfwp_rl.memory.base import Episode, SequenceTask, check_int


class RepeatPrevious(SequenceTask):
    """Every step shows a random symbol; from step ``k`` on, the action must repeat the
    symbol shown ``k`` steps earlier (a sliding window of ``k`` items to keep).

    Dynamics (``n = n_symbols``, ``T = length`` steps): step ``t`` shows ``s_t``, uniform in
    ``0..n-1``. The action at step ``t >= k`` scores ``1 / (T - k)`` if it equals
    ``s_{t-k}``, else 0; actions at steps ``t < k`` score nothing. The episode terminates
    after ``T`` steps.

    Observation ``float32 [n + 1]``: ``[0:n]`` one-hot ``s_t``; ``[n]`` flag "this step is
    scored" (``t >= k``). Action ``Discrete(n)``: the symbol named.

    Levels: easy ``n=4, k=2, length=16`` (14 scored steps); medium ``n=8, k=6, length=40``;
    hard ``n=16, k=24, length=96``. Keyword arguments ``n_symbols`` (>= 2), ``k`` (>= 1)
    and ``length`` (>= k + 1) override.

    Returns: optimal 1; random ``1/n`` (0.25, 0.125, 0.0625); memory horizon ``k``.
    """

    task = "RepeatPrevious"

    def __init__(self, level: str = "easy", **options: int) -> None:
        super().__init__(level, options)
        p = self.params
        self.n_symbols = check_int(self.task, "n_symbols", p["n_symbols"], 2)
        self.k = check_int(self.task, "k", p["k"], 1)
        self.length = check_int(self.task, "length", p["length"], 2)
        if self.length <= self.k:
            raise UserError(
                f"{self.task}: length {self.length} leaves no scored step with k {self.k}; "
                f"allowed: length >= k + 1 = {self.k + 1}"
            )
        n = self.n_symbols
        self.layout = {"symbol": slice(0, n), "scored": n}
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n + 1,), dtype=np.float32)
        self.action_space = spaces.Discrete(n)

    @property
    def episode_length(self) -> int:
        return self.length

    @property
    def memory_horizon(self) -> int:
        return self.k

    def _generate(self) -> Episode:
        n, k, T = self.n_symbols, self.k, self.length
        ep = Episode.empty(T, n + 1)
        symbols = self.np_random.integers(n, size=T)
        ep.obs[np.arange(T), symbols] = 1.0
        ep.obs[k:, n] = 1.0
        ep.target[k:] = symbols[: T - k]
        ep.reward[k:] = 1.0 / (T - k)
        return ep
