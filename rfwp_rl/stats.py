"""Aggregate scores over runs and tasks with their uncertainty (Agarwal et al., "Deep RL at the
edge of the statistical precipice", NeurIPS 2021; the `rliable` package implements the same).

- :func:`iqm`: interquartile mean, the mean of the middle half of all scores (runs x tasks pooled);
- :func:`stratified_bootstrap`: a percentile confidence interval of any such aggregate, resampling
  runs with replacement within each task (stratified by task), so that every resample keeps each
  task's number of runs;
- :func:`score_profile`: the performance profile, the fraction of runs whose score exceeds each
  threshold tau (the paper's "score distribution", Sec. 4.3).

Statistics take ``[..., N]`` arrays (N pooled runs) and reduce the last axis, so that one call
evaluates every bootstrap resample at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

#: rliable's default numbers of resamples: interval estimates, performance profiles
INTERVAL_REPS = 50_000
PROFILE_REPS = 2_000


def iqm(scores: np.ndarray | Sequence[float]) -> np.ndarray | float:
    """Interquartile mean over the last axis: sort, drop ``floor(N / 4)`` values at each end, average
    the rest. This is ``scipy.stats.trim_mean(x, 0.25)`` (which cuts ``int(0.25 * N)`` from each end,
    less than a quarter when N is not a multiple of 4), the function rliable's ``aggregate_iqm``
    calls. ``scores [..., N]`` -> ``[...]`` (a float for a 1-d input)."""
    x = np.sort(np.asarray(scores, dtype=np.float64), axis=-1)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("iqm of no scores")
    cut = int(0.25 * n)
    out = x[..., cut : n - cut].mean(axis=-1)
    return float(out) if out.ndim == 0 else out


def score_profile(scores: np.ndarray | Sequence[float], taus: np.ndarray | Sequence[float]) -> np.ndarray:
    """Performance profile: the fraction of scores strictly above each ``tau`` (Agarwal et al.
    Sec. 4.3, rliable's ``score_distributions``). ``scores [..., N]``, ``taus [K]`` -> ``[..., K]``."""
    x = np.asarray(scores, dtype=np.float64)
    return (x[..., :, None] > np.asarray(taus, dtype=np.float64)).mean(axis=-2)


@dataclass
class Interval:
    """A point estimate with its percentile bootstrap interval (arrays for a vector statistic)."""

    point: np.ndarray | float
    low: np.ndarray | float
    high: np.ndarray | float


def stratified_resamples(per_task: Sequence[Sequence[float]], reps: int, rng: np.random.Generator) -> np.ndarray:
    """``[reps, N]``: each row draws, for every task t, ``n_t`` of its runs with replacement and
    concatenates the tasks in order (N = sum of n_t; each task keeps its count in every row)."""
    parts = []
    for scores in per_task:
        x = np.asarray(scores, dtype=np.float64).ravel()
        if x.size == 0:
            raise ValueError("a task with no runs")
        parts.append(x[rng.integers(0, x.size, size=(reps, x.size))])
    return np.concatenate(parts, axis=1)


def stratified_bootstrap(
    per_task: Sequence[Sequence[float]],
    statistic: Callable[[np.ndarray], np.ndarray],
    reps: int = INTERVAL_REPS,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """``statistic`` of all runs pooled, with its percentile interval over ``reps`` stratified
    bootstrap resamples (Agarwal et al. Sec. 3 / App. A; Efron & Tibshirani 1993, percentile
    method: the (1 - c)/2 and (1 + c)/2 quantiles of the resampled statistic).

    ``per_task``: one sequence of run scores per task (counts may differ). ``statistic`` maps
    ``[..., N] -> [...]`` or ``[..., N] -> [..., K]`` (e.g. :func:`iqm`, or :func:`score_profile`
    with fixed taus). With one run in every task the interval collapses to the point: the runs
    carry no information on their own spread. Same ``seed`` -> same interval."""
    if not per_task:
        raise ValueError("no tasks")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} must be in (0, 1)")
    pooled = np.concatenate([np.asarray(s, dtype=np.float64).ravel() for s in per_task])
    point = statistic(pooled)
    samples = statistic(stratified_resamples(per_task, reps, np.random.default_rng(seed)))
    alpha = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(samples, [alpha, 100.0 - alpha], axis=0)
    if np.ndim(point) == 0:
        return Interval(float(point), float(low), float(high))
    return Interval(np.asarray(point), low, high)
