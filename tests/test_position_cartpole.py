"""PositionOnlyCartPole: CartPole's dynamics with the velocities hidden, return in [0, 1]."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv

from rfwp_rl.envs import env_spec, make_env
from rfwp_rl.errors import UserError
from rfwp_rl.memory import suite
from test_memory_tasks import play

IDS = list(suite.CONTROL)


def raw(env_id: str, **options):
    suite.register()
    return gymnasium.make(env_id, **options).unwrapped


@pytest.mark.parametrize("env_id", IDS)
def test_velocities_are_hidden_and_positions_follow_cartpole(env_id):
    env = raw(env_id)
    actions = np.random.default_rng(0).integers(2, size=500)
    obs = np.stack(play(env, lambda e: int(actions[e._steps]), seed=3)[0])
    assert obs.dtype == np.float32 and obs.shape[1] == 4
    assert np.all(obs[:, [1, 3]] == 0.0)
    # the same dynamics as CartPole-v1 from the same start state
    ref = CartPoleEnv()
    ref.reset()
    env.reset(seed=3)
    ref.state = tuple(env._true.astype(np.float64))
    for t in range(5):
        o, _, _, _, _ = env.step(int(actions[t]))
        r, _, _, _, _ = ref.step(int(actions[t]))
        np.testing.assert_allclose(o[[0, 2]], np.asarray(r, dtype=np.float32)[[0, 2]], rtol=1e-6)


@pytest.mark.parametrize("env_id", IDS)
def test_controller_on_positions_balances_to_the_limit(env_id):
    # the task is solvable from positions alone: finite differences give the velocities
    env, e = raw(env_id), suite.CONTROL[env_id]
    for seed in range(3):
        _, rewards, terminated, truncated = play(env, lambda x: x.optimal_action(), seed)
        assert truncated and not terminated and len(rewards) == e.max_episode_steps
        assert sum(rewards) == pytest.approx(e.optimal_return)
        assert suite.normalized_return(env_id, sum(rewards)) == pytest.approx(1.0)


def test_random_policy_matches_the_documented_estimate():
    env_id = IDS[0]
    env, e = raw(env_id), suite.CONTROL[env_id]
    rng = np.random.default_rng(0)
    returns = np.array([sum(play(env, lambda _: int(rng.integers(2)), 100 + i)[1]) for i in range(2000)])
    sem = returns.std() / np.sqrt(len(returns))
    assert abs(returns.mean() - e.random_return) < 4.5 * sem, (returns.mean(), e.random_return, sem)
    assert suite.normalized_return(env_id, e.random_return) == pytest.approx(0.0)


def test_trainer_sees_the_step_limit_and_bad_options_are_one_line():
    info = env_spec(IDS[0])
    assert info.kind == "vector" and info.obs_shape == (4,)
    assert make_env(IDS[1]).unwrapped.max_episode_steps == 400
    with pytest.raises(UserError, match="max_steps"):
        raw(IDS[0], max_steps=0)
    with pytest.raises(UserError, match="PositionOnlyCartPole option"):
        raw(IDS[0], gravity=3)
