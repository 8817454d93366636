"""Aggregate statistics (rfwp_rl.stats) against hand-computed cases: the interquartile mean with
scipy's trimming rule, the stratified bootstrap's resamples and intervals, performance profiles."""

import numpy as np
import pytest

from rfwp_rl.stats import iqm, score_profile, stratified_bootstrap, stratified_resamples


def test_iqm_by_hand_including_the_fractional_trim():
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)  # N = 8: drop 2 each end, mean(3, 4, 5, 6)
    # N = 5: int(1.25) = 1 dropped each end (less than a quarter): mean(2, 3, 10)
    assert iqm([10, 1, 3, 2, 100]) == pytest.approx(5.0)
    # N = 10: int(2.5) = 2 each end: mean(2..7) of 0..9 plus an outlier replacing 9
    assert iqm([0, 1, 2, 3, 4, 5, 6, 7, 8, 1e9]) == pytest.approx(4.5)
    assert iqm([3, -1, 2]) == pytest.approx(4 / 3)  # N = 3: nothing dropped
    assert np.allclose(iqm(np.array([[1, 2, 3, 4], [4, 4, 0, 100]])), [2.5, 4.0])  # last axis, batched
    with pytest.raises(ValueError):
        iqm([])


def test_iqm_equals_scipy_trim_mean():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in range(1, 23):
        x = rng.normal(size=n)
        assert iqm(x) == pytest.approx(stats.trim_mean(x, 0.25))


def test_stratified_resamples_keep_each_task_and_its_count():
    tasks = [[0.0, 1.0, 2.0], [10.0, 11.0]]
    rows = stratified_resamples(tasks, 500, np.random.default_rng(0))
    assert rows.shape == (500, 5)
    assert np.isin(rows[:, :3], tasks[0]).all() and np.isin(rows[:, 3:], tasks[1]).all()
    assert len(np.unique(rows[:, :3])) == 3 and len(np.unique(rows[:, 3:])) == 2  # with replacement, all drawn


def test_bootstrap_interval_by_hand_reproducible_and_around_the_point():
    # one task, runs (0, 1, 1, 1): the resampled mean is Binomial(4, 3/4) / 4, P(0) = 1/256,
    # P(<= 1/4) = 13/256 > 2.5 %, P(1) = 81/256 > 2.5 %: the 95 % percentile interval is [1/4, 1]
    ci = stratified_bootstrap([[0, 1, 1, 1]], lambda x: x.mean(-1), reps=20_000, seed=1)
    assert (ci.point, ci.low, ci.high) == (0.75, 0.25, 1.0)
    tasks = [[0.1, 0.9, 0.5], [0.0, 0.2, 1.0], [0.95, 1.0, 0.7]]
    a = stratified_bootstrap(tasks, iqm, reps=5000, seed=7)
    b = stratified_bootstrap(tasks, iqm, reps=5000, seed=7)
    assert (a.point, a.low, a.high) == (b.point, b.low, b.high)
    assert a.point == pytest.approx(iqm(sum(tasks, [])))
    assert a.low < a.point < a.high and 0.0 <= a.low and a.high <= 1.0
    draw = lambda seed: stratified_resamples(tasks, 50, np.random.default_rng(seed))
    assert (draw(7) == draw(7)).all() and not (draw(7) == draw(8)).all()
    # one run per task: resamples equal the data, the interval is the point
    one = stratified_bootstrap([[0.2], [0.4], [0.9]], iqm, reps=100)
    assert one.low == one.high == one.point == pytest.approx(0.5)  # N = 3: the plain mean


def test_score_profile_by_hand_and_with_bands():
    taus = [-0.1, 0.0, 0.5, 0.99, 1.0]
    assert score_profile([0.0, 0.5, 1.0, 1.0], taus).tolist() == [1.0, 0.75, 0.5, 0.5, 0.0]
    ci = stratified_bootstrap([[0.0, 1.0], [0.5, 1.0]], lambda x: score_profile(x, taus), reps=2000, seed=0)
    assert ci.point.tolist() == [1.0, 0.75, 0.5, 0.5, 0.0]
    assert (ci.low <= ci.point).all() and (ci.point <= ci.high).all()
    assert ci.low[0] == ci.high[0] == 1.0 and ci.high[-1] == 0.0
    # task 1 resamples (0, 0) a quarter of the time: at tau = 0 the fraction goes from 0.5 to 1.0
    assert (ci.low[1], ci.high[1]) == (0.5, 1.0)
