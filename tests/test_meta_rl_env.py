"""POMDP graph environments (FWM paper Sec. 4.2, App. I, Listing 1): generator, graph sets,
batch dynamics on hand-built graphs, the gymnasium env."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rfwp_rl.errors import UserError
from rfwp_rl.meta_rl import graph_env as ge
from rfwp_rl.meta_rl.graph_env import GraphBatchEnv, PomdpGraphEnv


def listing1(n_actions, n_states, random_state):
    """The paper's Listing 1, written out independently as the oracle for sample_graph."""
    while True:
        A = np.zeros((n_actions, n_states, n_states))
        for i in range(n_states):
            j = random_state.choice([s for s in range(n_states) if s != i])
            A[random_state.randint(0, n_actions), i, j] = 1
        for j in range(n_states):
            acts, froms = np.where(A.sum(2) == 0)
            opts = np.asarray([(f, a) for f, a in zip(froms, acts) if f != j])
            f, a = opts[random_state.choice(np.arange(len(opts)))]
            A[a, f, j] = 1
        Q = (A.sum(0) > 0).astype(float)
        for _ in range(n_states):
            Q = Q @ Q
        if (Q == 0).sum() == 0:
            return A


# ------------------------------------------------------------------------------- generator


def test_sample_graph_equals_listing1_call_for_call():
    for seed in (0, 1, 666):
        r1, r2 = np.random.RandomState(seed), np.random.RandomState(seed)
        for _ in range(100):
            np.testing.assert_array_equal(ge.sample_graph(r1), listing1(3, 5, r2))


def test_generator_properties_over_many_seeds():
    tables = [t for seed in range(40) for t in ge.generate_graphs(11, np.random.RandomState(seed))]
    assert len(tables) == 440
    for table in tables:
        adj = ge.table_to_adjacency(table)
        assert table.shape == (3, 5)
        assert ge.strongly_connected(table)  # every location reaches every other
        assert all(adj[a, s, s] == 0 for a in range(3) for s in range(5))  # no self-transitions
        assert (adj.sum(-1) <= 1).all()  # deterministic actions
        assert (table >= 0).sum() == 10 and (table < 0).sum() == 5  # some actions invalid
        assert ((table >= 0).sum(0) >= 1).all()  # every location can be left
        assert (adj.sum((0, 1)) >= 1).all()  # every location can be entered
        np.testing.assert_array_equal(ge.adjacency_to_table(adj), table)
    # graphs differ from each other: the generator is not degenerate
    assert len({t.tobytes() for t in tables}) > 400


def test_strongly_connected_detects_a_split_graph():
    table = np.full((3, 5), -1, dtype=np.int8)
    table[0] = [1, 0, 3, 4, 2]  # two separate cycles {0,1} and {2,3,4}
    assert not ge.strongly_connected(table)
    table[1, 1] = 2
    assert not ge.strongly_connected(table)  # 2,3,4 cannot get back to 0,1
    table[1, 4] = 0
    assert ge.strongly_connected(table)


def test_graph_sets_deterministic_disjoint_and_seed_dependent():
    train, test = ge.graph_sets(666, 600, 600)
    assert train.shape == (600, 3, 5) and test.shape == (600, 3, 5)
    assert not train.flags.writeable
    train_b = {t.tobytes() for t in train}
    assert not train_b & {t.tobytes() for t in test}  # no test graph is a training graph
    fresh = ge.graph_sets.__wrapped__(666, 600, 600)  # bypass the cache: same arrays again
    np.testing.assert_array_equal(fresh[0], train)
    np.testing.assert_array_equal(fresh[1], test)
    other_train, other_test = ge.graph_sets.__wrapped__(7, 50, 50)
    assert not np.array_equal(other_test, test[:50])
    assert not {t.tobytes() for t in other_train} & {t.tobytes() for t in other_test}
    # the test set is drawn first, exactly as Listing 1 would from the data seed
    rng = np.random.RandomState(666)
    for i in range(5):
        np.testing.assert_array_equal(ge.adjacency_to_table(listing1(3, 5, rng)), test[i])


def test_training_graphs_equal_to_a_test_graph_are_redrawn():
    rng = np.random.RandomState(3)
    first = ge.generate_graphs(1, np.random.RandomState(3))[0]
    out = ge.generate_graphs(1, rng, exclude={first.tobytes()})[0]
    assert not np.array_equal(out, first)


# ------------------------------------------------------------------------------- dynamics

# hand-built graph: action 0 walks the ring 0->1->2->3->4->0, action 1 jumps i -> i+2 from
# even locations, everything else is invalid
RING = np.array([[1, 2, 3, 4, 0], [2, -1, 4, -1, 1], [-1, -1, -1, -1, -1]], dtype=np.int8)


def _env(**kw):
    env = GraphBatchEnv(RING[None], rng=0, **kw)
    env.reset()
    return env


def test_observation_layout():
    assert ge.obs_size() == 17
    env = _env()
    env.agent[:], env.goal[:] = 1, 3
    obs = env.observe()[0]
    expected = np.zeros(17, np.float32)
    expected[3] = 1  # reward location 3
    expected[5 + 1] = 1  # current location 1
    expected[10] = 1  # previous action: none
    expected[14] = 1  # bias
    expected[15] = 0.0  # progress 0/30
    expected[16] = 0.0  # reward so far
    np.testing.assert_array_equal(obs, expected)
    obs, reward, done = env.step(np.array([0]))  # 1 -> 2 with action 0
    expected[5 + 1], expected[5 + 2] = 0, 1
    expected[10], expected[11] = 0, 1  # previous action 0
    expected[15] = 1 / 30
    np.testing.assert_array_equal(obs[0], expected)
    assert reward[0] == 0 and not done
    obs, reward, _ = env.step(np.array([2]))  # invalid: stays at 2, penalty
    assert reward[0] == pytest.approx(-0.05)
    assert obs[0, 5 + 2] == 1 and obs[0, 13] == 1 and obs[0, 11] == 0
    assert obs[0, 16] == pytest.approx(-0.05 * 0.01)  # reward so far, scaled by 1/100
    assert obs[0, 15] == pytest.approx(2 / 30)
    lay = ge.obs_layout()
    assert (
        lay["goal"],
        lay["location"],
        lay["prev_action_none"],
        lay["prev_action"],
        lay["bias"],
        lay["progress"],
        lay["reward_sum"],
    ) == (slice(0, 5), slice(5, 10), 10, slice(11, 14), 14, 15, 16)


def test_goal_reward_and_replacement():
    env = _env()
    for _ in range(50):  # many draws of the random re-placement
        env.reset()
        env.agent[:], env.goal[:] = 0, 2
        env.timer[:] = 4
        obs, reward, _ = env.step(np.array([1]))  # 0 -> 2 reaches the goal
        assert reward[0] == 10.0
        assert env.goal[0] != 2 and env.agent[0] != env.goal[0]
        assert env.timer[0] == 0  # App. I: timer reset on reaching the reward
        assert env.prev_action[0] == 1 and obs[0, 12] == 1
        assert env.goals[0] == 1 and env.last_reached[0]
        assert obs[0, 16] == pytest.approx(10 * 0.01)


def test_invalid_action_penalty_and_stay():
    env = _env(invalid_penalty=0.25)
    env.agent[:], env.goal[:] = 1, 4
    _, reward, _ = env.step(np.array([1]))  # action 1 is invalid at 1
    assert reward[0] == pytest.approx(-0.25) and env.agent[0] == 1 and env.invalid[0] == 1
    assert env.reward_sum[0] == pytest.approx(-0.25)


def test_timeout_after_six_unsuccessful_steps():
    env = _env()
    env.agent[:], env.goal[:] = 1, 0
    # five unsuccessful steps (invalid action 2 and moves that miss the goal): no re-placement
    for a in (2, 2, 0, 2, 0):  # 1 -> 1 -> 1 -> 2 -> 2 -> 3
        _, reward, _ = env.step(np.array([a]))
        assert env.goal[0] == 0 and not env.last_timeout[0]
    assert env.agent[0] == 3 and env.timer[0] == 5
    obs, reward, _ = env.step(np.array([2]))  # the sixth: both re-placed
    assert env.last_timeout[0] and env.timeouts[0] == 1
    assert env.goal[0] != 0 and env.agent[0] != env.goal[0]
    assert env.timer[0] == 0 and env.prev_action[0] == 3
    assert obs[0, 10] == 1 and obs[0, 11:14].sum() == 0  # previous action shows "none"
    assert reward[0] == pytest.approx(-0.05)  # the sixth step still pays its penalty


def test_reaching_the_goal_restarts_the_timeout_count():
    env = _env()
    env.agent[:], env.goal[:] = 0, 4
    for a in (2, 2, 2, 2, 2):  # five invalid steps at 0
        env.step(np.array([a]))
    env.goal[:] = 1
    env.step(np.array([0]))  # 0 -> 1: goal, timer back to 0
    g = env.goal[0]
    for _ in range(5):
        env.step(np.array([2]))  # action 2 is invalid everywhere
    assert env.goal[0] == g and env.timeouts[0] == 0  # 5 more unsuccessful steps: no timeout


def test_episode_length_and_batch_independence():
    tables = np.stack([RING, np.roll(RING, 1, axis=0)])
    env = GraphBatchEnv(tables, rng=1)
    obs = env.reset()
    assert obs.shape == (2, 17) and obs.dtype == np.float32
    assert (env.agent != env.goal).all()
    for t in range(30):
        obs, reward, done = env.step(np.array([0, 1]))
        assert done == (t == 29)
        assert obs[0, 15] == pytest.approx((t + 1) / 30)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.array([0, 0]))
    with pytest.raises(ValueError, match="shape"):
        env.reset()
        env.step(np.array([0]))
    with pytest.raises(ValueError, match="0..2"):
        env.step(np.array([0, 3]))


def test_random_agent_total_reward_is_near_the_papers_start():
    """An untrained agent's total reward starts near 45 in the paper's log; a uniformly random
    policy on the 600 test graphs gives the same."""
    _, test = ge.graph_sets()
    env = GraphBatchEnv(test, rng=0)
    env.reset()
    rng = np.random.default_rng(0)
    total = np.zeros(600)
    done = False
    while not done:
        _, r, done = env.step(rng.integers(0, 3, 600))
        total += r
    assert 40 < total.mean() < 50


# ------------------------------------------------------------------------------- gymnasium


def test_gymnasium_env_checks_and_episode():
    env = PomdpGraphEnv(graphs="test", render_mode="ansi")
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=5, options={"graph_index": 7})
    np.testing.assert_array_equal(env.table, ge.graph_sets()[1][7])
    assert env.observation_space.contains(obs) and info["graph_index"] == 7
    steps, terminated = 0, False
    while not terminated:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert not truncated and env.observation_space.contains(obs)
        steps += 1
    assert steps == 30 and "edges" in env.render()
    a = PomdpGraphEnv(graphs="random")
    b = PomdpGraphEnv(graphs="random")
    oa, _ = a.reset(seed=3)
    ob, _ = b.reset(seed=3)
    np.testing.assert_array_equal(oa, ob)
    np.testing.assert_array_equal(a.table, b.table)
    assert ge.strongly_connected(a.table)


def test_gymnasium_env_bad_arguments():
    with pytest.raises(UserError, match="graph set 'tset'.*test"):
        PomdpGraphEnv(graphs="tset")
    with pytest.raises(UserError, match="graph_index 600 out of range"):
        PomdpGraphEnv(graphs="train", graph_index=600)
