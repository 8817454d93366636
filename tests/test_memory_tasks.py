"""Memory-task suite (rfwp/<Task>-<level>-v0): API, hand-checked dynamics, reference returns."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rfwp_rl.envs import ensure_registered, env_spec, make_env
from rfwp_rl.errors import UserError
from rfwp_rl.memory import suite
from rfwp_rl.memory.base import MemoryEnv

REPO = Path(__file__).resolve().parent.parent
IDS = suite.suite_ids()


def raw(env_id: str, **options) -> MemoryEnv:
    """The unwrapped env of a suite id (fast stepping, access to the oracle)."""
    ensure_registered()
    env = gymnasium.make(env_id, **options).unwrapped
    assert isinstance(env, MemoryEnv)
    return env


def play(env: MemoryEnv, policy, seed: int) -> tuple[list[np.ndarray], list[float], bool, bool]:
    """One episode: (observations incl. the last one, rewards, terminated, truncated)."""
    obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], []
    while True:
        obs, reward, terminated, truncated, _ = env.step(policy(env))
        observations.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            return observations, rewards, terminated, truncated


def optimal(env: MemoryEnv) -> int:
    return env.optimal_action()


def assert_one_hot(x: np.ndarray) -> int:
    assert sorted(np.unique(x).tolist()) in ([0.0, 1.0], [1.0]) and x.sum() == 1, x
    return int(x.argmax())


# -- every id -------------------------------------------------------------------------------


def test_suite_ids_cover_every_task_and_level():
    tasks = sorted(suite.ENTRY_POINTS)
    assert IDS == [suite.env_id(t, lvl) for t in suite.ENTRY_POINTS for lvl in suite.LEVELS]
    for lvl in suite.LEVELS:
        assert suite.suite_ids(lvl) == [suite.env_id(t, lvl) for t in suite.ENTRY_POINTS]
    assert all(i.startswith("rfwp/") and i.endswith("-v0") for i in IDS)
    assert sorted({suite.SUITE[i].task for i in IDS}) == tasks
    with pytest.raises(UserError, match="unknown level 'extreme'.*allowed: easy, hard, medium"):
        suite.suite_ids("extreme")


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_passes(env_id):
    ensure_registered()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gymnasium.make(env_id).unwrapped)
        check_env(make_env(env_id))
    # the only warning: check_env's note that make_env's env is wrapped
    messages = [str(w.message) for w in caught]
    assert [m for m in messages if "different from the unwrapped version" not in m] == []


@pytest.mark.parametrize("env_id", IDS)
def test_suite_numbers_are_the_envs_numbers(env_id):
    e, env = suite.SUITE[env_id], raw(env_id)
    assert env.params == e.params
    assert env.random_return == pytest.approx(e.random_return, abs=1e-12)
    assert env.optimal_return == e.optimal_return
    assert env.max_episode_steps == e.max_episode_steps
    assert env.memory_horizon == e.memory_horizon
    # random is clearly below optimal on every level
    assert e.optimal_return - e.random_return >= 0.5
    assert e.memory_horizon < e.max_episode_steps
    assert suite.normalized_return(env_id, e.random_return) == pytest.approx(0.0, abs=1e-12)
    assert suite.normalized_return(env_id, e.optimal_return) == pytest.approx(1.0)


@pytest.mark.parametrize("env_id", IDS)
def test_optimal_policy_gets_the_optimal_return(env_id):
    env, e = raw(env_id), suite.SUITE[env_id]
    for seed in range(5):
        _, rewards, terminated, truncated = play(env, optimal, seed)
        assert sum(rewards) == pytest.approx(e.optimal_return, abs=1e-9)
        assert terminated and not truncated
        assert len(rewards) <= e.max_episode_steps


@pytest.mark.parametrize("env_id", IDS)
def test_random_policy_gets_the_random_return(env_id):
    env, e = raw(env_id), suite.SUITE[env_id]
    rng = np.random.default_rng(0)
    n = int(env.action_space.n)
    episodes = max(300, 30_000 // e.max_episode_steps)
    returns = np.array([sum(play(env, lambda _: int(rng.integers(n)), 1000 + i)[1]) for i in range(episodes)])
    sem = returns.std() / np.sqrt(episodes)
    assert sem > 0  # the returns vary, so the tolerance below is not zero by accident
    assert abs(returns.mean() - e.random_return) < 4.5 * sem + 1e-12, (returns.mean(), e.random_return, sem)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_episode(env_id):
    env, other = raw(env_id), raw(env_id)
    rng = np.random.default_rng(3)
    actions = rng.integers(int(env.action_space.n), size=env.max_episode_steps)

    def episode(e):
        it = iter(actions)
        obs, rewards, _, _ = play(e, lambda _: int(next(it)), 7)
        return np.stack(obs), rewards

    a, b, c = episode(env), episode(other), episode(env)
    for x in (b, c):
        np.testing.assert_array_equal(a[0], x[0])
        assert a[1] == x[1]
    obs_other_seed, _, _, _ = play(env, lambda _: 0, 8)
    assert not (len(obs_other_seed) == len(a[0]) and np.array_equal(np.stack(obs_other_seed), a[0]))


@pytest.mark.parametrize("env_id", IDS)
def test_env_spec_reports_shape_actions_and_step_limit(env_id):
    env, e = raw(env_id), suite.SUITE[env_id]
    info = env_spec(env_id)
    assert info.kind == "vector" and info.obs_dtype == "float32"
    assert info.obs_shape == env.observation_space.shape and len(info.obs_shape) == 1
    assert 4 <= info.obs_shape[0] <= 96
    assert info.num_actions == env.action_space.n
    assert info.max_episode_steps == e.max_episode_steps


def test_make_env_in_a_fresh_process_registers_the_suite():
    code = (
        "from rfwp_rl.envs import make_env, env_spec\n"
        "from rfwp_rl.memory import suite_ids, SUITE\n"
        "for i in suite_ids():\n"
        "    env = make_env(i, seed=0)\n"
        "    obs, _ = env.reset()\n"
        "    assert obs.shape == env.observation_space.shape, i\n"
        "    assert env_spec(i).max_episode_steps == SUITE[i].max_episode_steps, i\n"
        "print('ok', len(suite_ids()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", str(len(IDS))]


def test_unknown_level_and_option_are_one_line_errors():
    for env_id in (suite.env_id(t, "easy") for t in suite.ENTRY_POINTS):
        task = suite.SUITE[env_id].task
        with pytest.raises(UserError, match=rf"^unknown {task} level 'hardest'; did you mean 'hard'\? "
                                            r"allowed: easy, hard, medium$"):
            raw(env_id, level="hardest")
        name = next(iter(suite.LEVEL_PARAMS[task]["easy"]))
        with pytest.raises(UserError, match=rf"^unknown {task} option '{name}x'; did you mean '{name}'.*allowed: "):
            raw(env_id, **{name + "x": 3})
        with pytest.raises(UserError, match=rf"^{task}: {name} 2.5 is invalid; allowed: an integer"):
            raw(env_id, **{name: 2.5})


def test_bad_values_reach_the_user_through_make_env():
    with pytest.raises(UserError, match=r"^DelayedRecall: delay 0 is invalid; allowed: an integer >= 1$"):
        make_env("rfwp/DelayedRecall-easy-v0", delay=0)


def test_normalized_return_of_an_unknown_id_is_a_one_line_error():
    with pytest.raises(UserError, match="unknown memory-suite id 'rfwp/DelayedRecall-v0'"):
        suite.normalized_return("rfwp/DelayedRecall-v0", 1.0)
    assert suite.normalized_return("rfwp/DelayedRecall-easy-v0", 0.625) == pytest.approx(0.5)


def test_stepping_a_finished_episode_or_a_bad_action_raises():
    env = raw("rfwp/DelayedRecall-easy-v0", delay=1)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(4)
    for _ in range(3):  # delay 1: cue, distractor, query
        env.step(0)
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(0)


# -- DelayedRecall --------------------------------------------------------------------------


def test_delayed_recall_episode_by_hand():
    # n=3 cues, m=2 distractors, delay 3: steps 0 (cue), 1-3 (distractors), 4 (query)
    env = raw("rfwp/DelayedRecall-easy-v0", n_symbols=3, n_distractors=2, delay=3)
    assert env.observation_space.shape == (6,) and env.action_space.n == 3
    assert env.layout == {"cue": slice(0, 3), "distractor": slice(3, 5), "query": 5}
    assert (env.max_episode_steps, env.memory_horizon, env.random_return) == (5, 4, 1 / 3)
    cues = set()
    for seed in range(12):
        for answer_right in (True, False):
            obs, _ = env.reset(seed=seed)
            cue = assert_one_hot(obs[0:3])
            assert obs[3:].sum() == 0  # only the cue at step 0
            cues.add(cue)
            for t in (1, 2, 3):  # distractor steps: every action scores 0 and changes nothing
                obs, r, term, trunc, _ = env.step(cue if t == 2 else (cue + 1) % 3)
                assert (r, term, trunc) == (0.0, False, False)
                assert obs[0:3].sum() == 0 and obs[5] == 0  # the cue never comes back
                assert_one_hot(obs[3:5])
                assert env.optimal_action() == 0
            obs, r, term, trunc, _ = env.step(cue)  # the answer one step early scores nothing
            assert (r, term, trunc) == (0.0, False, False)
            assert obs[5] == 1 and obs[:5].sum() == 0  # query step: the flag alone
            assert env.optimal_action() == cue
            obs, r, term, trunc, _ = env.step(cue if answer_right else (cue + 1) % 3)
            assert (r, term, trunc) == ((1.0 if answer_right else 0.0), True, False)
            assert not obs.any()
    assert cues == {0, 1, 2}


def test_delayed_recall_without_distractors_and_overrides():
    env = raw("rfwp/DelayedRecall-hard-v0", n_distractors=0, delay=2)
    assert env.params == {"n_symbols": 16, "n_distractors": 0, "delay": 2}
    obs, rewards, _, _ = play(env, optimal, 0)
    assert len(rewards) == 4 and rewards == [0.0, 0.0, 0.0, 1.0]
    assert [o.sum() for o in obs] == [1, 0, 0, 1, 0]
    with pytest.raises(UserError, match=r"^DelayedRecall: n_symbols 1 is invalid; allowed: an integer >= 2$"):
        raw("rfwp/DelayedRecall-easy-v0", n_symbols=1)
    with pytest.raises(UserError, match=r"^DelayedRecall: n_distractors -1 is invalid; allowed: an integer >= 0$"):
        raw("rfwp/DelayedRecall-easy-v0", n_distractors=-1)
    with pytest.raises(UserError, match=r"^DelayedRecall: delay True is invalid"):
        raw("rfwp/DelayedRecall-easy-v0", delay=True)
