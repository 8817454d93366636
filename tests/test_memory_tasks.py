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
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", str(len(IDS))]


def test_unknown_level_and_option_are_one_line_errors():
    for env_id in (suite.env_id(t, "easy") for t in suite.ENTRY_POINTS):
        task = suite.SUITE[env_id].task
        with pytest.raises(
            UserError,
            match=rf"^unknown {task} level 'hardest'; did you mean 'hard'\? "
            r"allowed: easy, hard, medium$",
        ):
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


@pytest.mark.parametrize("env_id", [i for i in IDS if suite.SUITE[i].task != "CueGrid"])
def test_the_observation_at_a_scored_step_does_not_tell_the_answer(env_id):
    # the best policy that sees only the current observation, fitted on half the samples and
    # scored on the other half, is no better than guessing: the tasks need memory
    env, rng = raw(env_id), np.random.default_rng(0)
    n = int(env.action_space.n)
    contexts, answers = [], []
    seed = 0
    while len(answers) < 20_000:
        env.reset(seed=seed)
        seed += 1
        ep = env._episode
        for t in np.flatnonzero(ep.target >= 0):
            contexts.append(ep.obs[t].tobytes())
            answers.append(int(ep.target[t]))
    ids = {c: i for i, c in enumerate(dict.fromkeys(contexts))}
    ctx = np.array([ids[c] for c in contexts])
    ans = np.array(answers)
    fit = rng.random(len(ans)) < 0.5
    table = np.zeros((len(ids), n))
    np.add.at(table, (ctx[fit], ans[fit]), 1)
    correct = table.argmax(1)[ctx[~fit]] == ans[~fit]
    sem = np.sqrt((1 / n) * (1 - 1 / n) / correct.size)
    assert correct.mean() < 1 / n + 4.5 * sem, (correct.mean(), 1 / n)


# -- RepeatPrevious -------------------------------------------------------------------------


def test_repeat_previous_episode_by_hand():
    env = raw("rfwp/RepeatPrevious-easy-v0", n_symbols=3, k=2, length=5)
    assert env.observation_space.shape == (4,) and env.action_space.n == 3
    assert (env.max_episode_steps, env.memory_horizon) == (5, 2)
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        shown = []
        for t in range(5):
            shown.append(assert_one_hot(obs[0:3]))
            assert obs[3] == (1.0 if t >= 2 else 0.0)  # scored from step k = 2 on
            assert env.optimal_action() == (shown[t - 2] if t >= 2 else 0)
            right = t != 3  # a wrong answer at step 3
            action = shown[t - 2] if t >= 2 and right else ((shown[t - 2] + 1) % 3 if t >= 2 else shown[t])
            obs, r, term, trunc, _ = env.step(action)
            assert r == (1 / 3 if t >= 2 and right else 0.0)  # 1 / (length - k) per right answer
            assert (term, trunc) == (t == 4, False)
        assert not obs.any()
    with pytest.raises(
        UserError,
        match=r"^RepeatPrevious: length 3 leaves no scored step with k 3; "
        r"allowed: length >= k \+ 1 = 4$",
    ):
        raw("rfwp/RepeatPrevious-easy-v0", k=3, length=3)
    with pytest.raises(UserError, match=r"^RepeatPrevious: k 0 is invalid; allowed: an integer >= 1$"):
        raw("rfwp/RepeatPrevious-easy-v0", k=0)


# -- CountRecall ----------------------------------------------------------------------------


def test_count_recall_episode_by_hand():
    env = raw("rfwp/CountRecall-easy-v0", n_symbols=3, max_count=2, n_show=4, n_queries=2)
    assert env.observation_space.shape == (4,) and env.action_space.n == 3
    assert (env.max_episode_steps, env.memory_horizon, env.random_return) == (6, 5, 1 / 3)
    answers = []
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        stream = []
        for _ in range(4):  # the stream: one shown symbol, no query
            stream.append(assert_one_hot(obs[0:3]))
            assert obs[3] == 0
            obs, r, term, trunc, _ = env.step(0)
            assert (r, term, trunc) == (0.0, False, False)
        asked = []
        for j in range(2):
            assert obs[3] == 1  # the query flag, and the asked symbol in the symbol slots
            q = assert_one_hot(obs[0:3])
            asked.append(q)
            count = stream.count(q)  # counted by hand
            assert count <= 2 and env.optimal_action() == count
            answers.append(count)
            obs, r, term, trunc, _ = env.step(count if j == 0 else (count + 1) % 3)
            assert r == (0.5 if j == 0 else 0.0) and (term, trunc) == (j == 1, False)
        assert len(set(asked)) == 2
    assert set(answers) == {0, 1, 2}
    with pytest.raises(
        UserError,
        match=r"^CountRecall: n_show 5 cannot hold 2 counts up to max_count 3; "
        r"allowed: n_show >= n_queries \* max_count = 6$",
    ):
        raw("rfwp/CountRecall-easy-v0", n_show=5)
    with pytest.raises(UserError, match=r"^CountRecall: n_queries 4 is invalid; allowed: an integer in 1..3$"):
        raw("rfwp/CountRecall-easy-v0", n_queries=4)


# -- AssociativeRecall ----------------------------------------------------------------------


def test_associative_recall_episode_by_hand():
    env = raw("rfwp/AssociativeRecall-easy-v0", n_keys=4, n_values=3, n_pairs=3, n_queries=2)
    assert env.observation_space.shape == (8,) and env.action_space.n == 3
    assert (env.max_episode_steps, env.memory_horizon) == (5, 4)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        memory = {}
        for _ in range(3):  # writes: key and value, no query flag
            key, value = assert_one_hot(obs[0:4]), assert_one_hot(obs[4:7])
            assert obs[7] == 0 and key not in memory
            memory[key] = value
            obs, r, term, trunc, _ = env.step(value)  # answering during the writes scores nothing
            assert (r, term, trunc) == (0.0, False, False)
        asked = []
        for j in range(2):
            key = assert_one_hot(obs[0:4])
            assert not obs[4:7].any() and obs[7] == 1  # the value is not shown at the query
            asked.append(key)
            assert env.optimal_action() == memory[key]
            obs, r, term, trunc, _ = env.step(memory[key] if j == 1 else (memory[key] + 1) % 3)
            assert r == (0.5 if j == 1 else 0.0) and (term, trunc) == (j == 1, False)
        assert len(set(asked)) == 2
    with pytest.raises(
        UserError,
        match=r"^AssociativeRecall: n_pairs 9 is too large for n_keys 8 "
        r"\(each key is written once\); allowed: n_pairs <= n_keys$",
    ):
        raw("rfwp/AssociativeRecall-easy-v0", n_pairs=9)
    with pytest.raises(UserError, match=r"^AssociativeRecall: n_queries 5 is more than the 4 keys written"):
        raw("rfwp/AssociativeRecall-easy-v0", n_queries=5)
    with pytest.raises(UserError, match=r"^AssociativeRecall: n_values 1 is invalid; allowed: an integer >= 2$"):
        raw("rfwp/AssociativeRecall-easy-v0", n_values=1)


def test_associative_recall_reassign_scores_only_the_newest_value():
    env = raw("rfwp/AssociativeRecallReassign-easy-v0", n_keys=3, n_values=3, n_pairs=5, n_reassign=2, n_queries=3)
    assert (env.max_episode_steps, env.memory_horizon, env.n_distinct) == (8, 7, 3)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        history: dict[int, list[int]] = {}
        for _ in range(5):
            key, value = assert_one_hot(obs[0:3]), assert_one_hot(obs[3:6])
            assert obs[6] == 0
            if key in history:
                assert value != history[key][-1]  # a re-assignment always changes the value
            history.setdefault(key, []).append(value)
            obs, *_ = env.step(0)
        reassigned = {k for k, v in history.items() if len(v) == 2}
        assert len(history) == 3 and len(reassigned) == 2  # 2 re-writes on 2 different keys
        asked = []
        for j in range(3):
            key = assert_one_hot(obs[0:3])
            assert not obs[3:6].any() and obs[6] == 1
            asked.append(key)
            newest, oldest = history[key][-1], history[key][0]
            assert env.optimal_action() == newest
            # the first value of a re-assigned key scores nothing; the newest scores 1/3
            obs, r, term, trunc, _ = env.step(oldest if key in reassigned and j == 0 else newest)
            assert r == (0.0 if key in reassigned and j == 0 else 1 / 3)
            assert (term, trunc) == (j == 2, False)
        assert sorted(asked) == [0, 1, 2]
    # fewer queries than re-assigned keys: every query asks a re-assigned key
    env = raw("rfwp/AssociativeRecallReassign-hard-v0")
    for seed in range(3):
        env.reset(seed=seed)
        ep = env._episode
        writes = ep.obs[:64, :48].argmax(1)
        asked = ep.obs[64:, :48].argmax(1)
        assert all((writes == k).sum() == 2 for k in asked)
        assert len(set(asked.tolist())) == 16
    with pytest.raises(
        UserError,
        match=r"^AssociativeRecallReassign: n_pairs 8 with n_reassign 2 needs 6 distinct "
        r"keys, more than n_keys 4; allowed: n_pairs - n_reassign <= n_keys$",
    ):
        raw("rfwp/AssociativeRecallReassign-easy-v0", n_pairs=8)
    with pytest.raises(
        UserError,
        match=r"^AssociativeRecallReassign: n_reassign 6 is invalid; "
        r"allowed: an integer in 1..5$",
    ):
        raw("rfwp/AssociativeRecallReassign-easy-v0", n_reassign=6)
    with pytest.raises(UserError, match=r"^AssociativeRecallReassign: n_queries 5 is more than the 4 distinct"):
        raw("rfwp/AssociativeRecallReassign-easy-v0", n_queries=5)


# -- CueGrid --------------------------------------------------------------------------------


def grid_obs(env, x: int, y: int, cue: int | None) -> np.ndarray:
    """The CueGrid observation written out by hand."""
    g, s = env.n_goals, env.size
    obs = np.zeros(g + 2 * s + 4, np.float32)
    if cue is not None:
        obs[cue] = 1
    obs[g + x] = obs[g + s + y] = 1
    obs[g + 2 * s :] = [y == 0, x == s - 1, y == s - 1, x == 0]  # walls up, right, down, left
    return obs


def test_cue_grid_episode_by_hand():
    env = raw("rfwp/CueGrid-easy-v0")  # 5 x 5, goals top-left (0, 0) and top-right (4, 0)
    assert env.observation_space.shape == (16,) and env.action_space.n == 4
    assert env.goals == [(0, 0), (4, 0)] and env.start == (2, 2)
    UP, RIGHT, LEFT = 0, 1, 3  # (2: down)
    seen = set()
    for seed in range(8):
        obs, _ = env.reset(seed=seed)
        cue = assert_one_hot(obs[0:2])
        seen.add(cue)
        np.testing.assert_array_equal(obs, grid_obs(env, 2, 2, cue))
        toward, away = (LEFT, RIGHT) if cue == 0 else (RIGHT, LEFT)
        # the cue step: no action moves the agent, the cue is gone afterwards
        obs, r, term, trunc, _ = env.step(toward)
        np.testing.assert_array_equal(obs, grid_obs(env, 2, 2, None))
        assert (r, term, trunc) == (0.0, False, False)
        # two steps toward the cued side, one into the side wall (no move), then up twice
        path = [(toward, 1), (toward, 0), (toward, 0), (UP, 0), (UP, 0)]
        x = 2
        for i, (action, _) in enumerate(path):
            obs, r, term, trunc, _ = env.step(action)
            if action == toward:
                x = max(x - 1, 0) if cue == 0 else min(x + 1, 4)
            y = 2 - sum(a == UP for a, _ in path[: i + 1])
            np.testing.assert_array_equal(obs, grid_obs(env, x, y, None))  # the cue is gone
            assert (r, term, trunc) == ((1.0, True, False) if i == 4 else (0.0, False, False))
        # the other goal: -1 / (n_goals - 1) = -1
        env.reset(seed=seed)
        rewards = [env.step(a)[1] for a in (UP, away, away, UP, UP)]
        assert rewards == [0.0, 0.0, 0.0, 0.0, -1.0]
    assert seen == {0, 1}


def test_cue_grid_truncates_at_the_step_limit():
    env = raw("rfwp/CueGrid-medium-v0", max_steps=7)
    assert env.wrong_goal_reward == pytest.approx(-1 / 3) and env.max_episode_steps == 7
    env.reset(seed=0)
    for t in range(7):  # up and down in the middle, never at a goal
        obs, r, term, trunc, _ = env.step(0 if t % 2 == 0 else 2)
        assert (r, term, trunc) == (0.0, False, t == 6)
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(0)
    # through make_env: the truncation arrives as such (no TimeLimit of gymnasium on top)
    wrapped = make_env("rfwp/CueGrid-easy-v0", seed=1, max_steps=5)
    wrapped.reset()
    out = [wrapped.step(a)[2:4] for a in (0, 2, 0, 2, 0)]
    assert out == [(False, False)] * 4 + [(False, True)]


def test_cue_grid_a_cue_blind_policy_scores_zero_on_average():
    # walking straight to goal 0 whatever the cue: +1 with probability 1/4, else -1/3
    env = raw("rfwp/CueGrid-medium-v0")

    def to_goal_0(env) -> int:
        cue, env._cue = env._cue, 0  # the oracle of goal 0
        action = env.optimal_action()
        env._cue = cue
        return action

    returns = np.array([sum(play(env, to_goal_0, seed)[1]) for seed in range(400)])
    assert set(np.round(returns, 6)) == {1.0, round(-1 / 3, 6)}
    assert abs(returns.mean()) < 4.5 * returns.std() / np.sqrt(len(returns))


def test_cue_grid_a_memoryless_policy_cannot_carry_the_cue():
    # the policy of a feedforward agent that saw the cue: "move toward the cued side", then,
    # without memory, "walk to the goal on the side I stand on". Without the cue step it
    # would score 1; the cue step leaves it at the start, so it scores 0 on average.
    env = raw("rfwp/CueGrid-easy-v0")

    def memoryless(env) -> int:
        obs = env._obs()  # what the agent sees now, nothing else
        x = int(np.argmax(obs[2:7]))
        if obs[0:2].any():
            return 3 if obs[0] else 1  # toward the cued side
        return 0 if x in (0, 4) else (3 if x <= 2 else 1)  # to the nearer side, then up

    returns = np.array([sum(play(env, memoryless, seed)[1]) for seed in range(400)])
    assert set(returns) == {1.0, -1.0}  # always goal 0 (x = 2 is walked left): right half the time
    assert abs(returns.mean()) < 4.5 * returns.std() / np.sqrt(len(returns))


def test_cue_grid_bad_settings():
    with pytest.raises(
        UserError,
        match=r"^CueGrid: size 6 is invalid \(the start is the centre cell\); "
        r"allowed: an odd integer >= 3$",
    ):
        raw("rfwp/CueGrid-easy-v0", size=6)
    with pytest.raises(UserError, match=r"^CueGrid: n_goals 5 is invalid; allowed: an integer in 2..4$"):
        raw("rfwp/CueGrid-easy-v0", n_goals=5)
    with pytest.raises(UserError, match=r"^CueGrid: max_steps 4 is invalid; allowed: an integer >= 5$"):
        raw("rfwp/CueGrid-easy-v0", max_steps=4)


def test_envs_readme_table_matches_the_suite():
    rows = {}
    for line in (REPO / "env_specs" / "README.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in suite.SUITE:
            rows[cells[0]] = cells
    assert sorted(rows) == sorted(IDS)
    for env_id, (_, _, steps, horizon, rnd, opt) in rows.items():
        e = suite.SUITE[env_id]
        assert steps.removeprefix("<= ") == str(e.max_episode_steps)
        assert int(horizon) == e.memory_horizon
        num, _, den = rnd.partition("/")
        assert float(num) / float(den or 1) == pytest.approx(e.random_return)
        assert float(opt) == e.optimal_return
