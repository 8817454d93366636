"""How far back a saved agent's memory reaches: ``rfwp-rl probe RUN --span K``.

For each lag k = 0..K: how much of what the agent saw k steps back (the torso's features of step
t - k, i.e. the observation as the agent encodes it) a linear read-out recovers at step t, from

- the core's output (``output``): what the policy and value heads read;
- the core's state (``state``): what the memory holds (flattened; projected onto ``STATE_DIMS``
  fixed random directions where it is larger);
- the torso's features of step t itself (``present``): what the present observation alone implies
  about the past, the level a memoryless agent reaches.

A lag whose ``output`` or ``state`` stands above ``present`` is one the agent remembers. Each read-out is
ridge regression on standardised inputs and targets, fitted on the pairs (t, t - k) inside the even-numbered
episodes and scored on the odd-numbered ones: R² pooled over the feature dimensions (1: all recovered; 0:
no better than each dimension's mean; below 0: worse). A linear read-out gives a lower bound: a memory
may hold more than a linear map can take out of it.
"""

from __future__ import annotations

import numpy as np
import torch

STATE_DIMS = 512  # a core state larger than this is read through this many random directions
# ridge penalties per pair (on standardised inputs) tried: the one whose fit on the first half of the fitted pairs
# best predicts their second half is used (a state of hundreds of numbers against a few hundred pairs needs more)
RIDGES = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
MIN_PAIRS = 20  # fewer pairs than this on either side of the split: no score for that lag
MAX_PAIRS = 10_000  # more pairs than this on a side (long episodes): this many, evenly spaced, bound the time
SOURCES = ("output", "state", "present")


def _ridge_weights(x: np.ndarray, y: np.ndarray, ridges: tuple[float, ...]) -> list[np.ndarray]:
    """Ridge regression weights ``[D, F]`` of ``y`` on ``x`` for each penalty per pair in ``ridges``."""
    eigenvalues, vectors = np.linalg.eigh(x.T @ x)
    projected = vectors.T @ (x.T @ y)
    return [vectors @ (projected / (eigenvalues + r * len(x))[:, None]) for r in ridges]


def _r2(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> float:
    total = ((y - y.mean(0)) ** 2).sum()
    return float(1.0 - ((y - x @ weights) ** 2).sum() / total) if total > 0 else float("nan")


def ridge_r2(x_fit: np.ndarray, y_fit: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """R² on ``(x_test, y_test)`` of the ridge regression of ``y`` on ``x`` fitted on ``(x_fit, y_fit)``
    (``[N, D]`` and ``[N, F]``), both standardised with the fitted pairs' statistics, its penalty chosen among
    :data:`RIDGES` on the fitted pairs alone; target dimensions that are constant on the fitted pairs are left
    out. NaN with fewer than :data:`MIN_PAIRS` pairs on a side, no input (a core without state) or no varying
    target."""
    if len(x_fit) < MIN_PAIRS or len(x_test) < MIN_PAIRS or x_fit.shape[1] == 0:
        return float("nan")
    x_mean, x_std = x_fit.mean(0), x_fit.std(0)
    y_mean, y_std = y_fit.mean(0), y_fit.std(0)
    keep = y_std > 1e-6
    if not keep.any():
        return float("nan")
    x_std = np.where(x_std > 1e-6, x_std, 1.0)
    xf, xt = (x_fit - x_mean) / x_std, (x_test - x_mean) / x_std
    yf, yt = ((y_fit - y_mean) / y_std)[:, keep], ((y_test - y_mean) / y_std)[:, keep]
    half = len(xf) // 2  # the fitted pairs come episode by episode: the halves hold different episodes
    inner = [_r2(xf[half:], yf[half:], w) for w in _ridge_weights(xf[:half], yf[:half], RIDGES)]
    best = RIDGES[int(np.nanargmax(inner))] if not np.isnan(inner).all() else RIDGES[-1]
    return _r2(xt, yt, _ridge_weights(xf, yf, (best,))[0])


class MemorySpan:
    """Records, for every played step, the torso's features, the core's output and the (projected) core
    state, by episode, fed by :func:`rfwp_rl.impala.evaluate.play`'s observer (play with
    ``with_features=True``); :meth:`table` scores the read-outs."""

    def __init__(self, max_lag: int, seed: int = 0):
        self.max_lag = max_lag
        self.seed = seed
        self.projection: np.ndarray | None = None
        self.current: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}  # env -> its episode's steps
        self.episodes: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []  # in the order they began

    def _project(self, state: np.ndarray) -> np.ndarray:
        if state.shape[1] <= STATE_DIMS:
            return state
        if self.projection is None:
            rng = np.random.default_rng(self.seed)
            self.projection = rng.standard_normal((state.shape[1], STATE_DIMS)).astype(np.float32) / np.sqrt(STATE_DIMS)
        return state @ self.projection

    def __call__(self, envs: list[int], steps: list[int], inputs: dict, out: dict, state: tuple) -> None:
        features = out["features"][0].float().cpu().numpy()  # [n, F]
        output = out["core_output"][0].float().cpu().numpy()  # [n, H]
        parts = [s.float().flatten(1).cpu().numpy() for s in state]
        memory = self._project(np.concatenate(parts, axis=1) if parts else np.zeros((len(envs), 0), np.float32))
        for j, (env, t) in enumerate(zip(envs, steps)):
            if t == 0:  # an episode begins: it is the next one in order
                self.current[env] = []
                self.episodes.append(self.current[env])
            self.current[env].append((features[j], output[j], memory[j]))

    def _stacked(self) -> list[dict[str, np.ndarray]]:
        """Each episode's steps as arrays ``[L, ...]``: its features (``present``), core output and state."""
        return [dict(zip(("present", "output", "state"), map(np.stack, zip(*steps)))) for steps in self.episodes]

    def pairs(
        self, lag: int, fit: bool, stacked: list[dict[str, np.ndarray]] | None = None
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{source: (inputs at t, features at t - lag)}`` over the fitted (even) or scored (odd) episodes
        (``stacked``: :meth:`_stacked`, made once by :meth:`table` for every lag)."""
        rows: dict[str, list] = {s: [] for s in SOURCES}
        targets = []
        for number, episode in enumerate(self._stacked() if stacked is None else stacked):
            length = len(episode["present"])
            if (number % 2 == 0) != fit or length <= lag:
                continue
            targets.append(episode["present"][: length - lag])
            for source in SOURCES:
                rows[source].append(episode[source][lag:])
        if not targets:
            empty = np.zeros((0, 1), np.float32)
            return {s: (empty, empty) for s in SOURCES}
        y = np.concatenate(targets)
        keep = np.linspace(0, len(y) - 1, MAX_PAIRS).round().astype(int) if len(y) > MAX_PAIRS else slice(None)
        y = y[keep].astype(np.float64)
        return {s: (np.concatenate(rows[s])[keep].astype(np.float64), y) for s in SOURCES}

    def table(self) -> list[dict]:
        """One row per lag 0..``max_lag``: ``lag``, ``pairs_fit``, ``pairs_scored`` and the R² of each source."""
        rows, stacked = [], self._stacked()
        for lag in range(self.max_lag + 1):
            fit, scored = self.pairs(lag, True, stacked), self.pairs(lag, False, stacked)
            row: dict = {"lag": lag, "pairs_fit": len(fit["output"][1]), "pairs_scored": len(scored["output"][1])}
            for source in SOURCES:
                row[f"r2_{source}"] = ridge_r2(*fit[source], *scored[source])
            rows.append(row)
        return rows


def state_width(state: tuple[torch.Tensor, ...]) -> int:
    """How many numbers of the core state the ``state`` column reads (after the projection)."""
    return min(STATE_DIMS, sum(int(np.prod(s.shape[1:])) for s in state))
