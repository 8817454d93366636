"""Environment layer: Atari preprocessing on real ALE games, gymnasium ids, errors, configs."""

from __future__ import annotations

import csv
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from rfwp_rl.envs import (
    ATARI_DEFAULTS,
    PAPER_GAMES,
    POMDP_GRAPH_ID,
    ensure_registered,
    env_spec,
    import_env_module,
    load_env_config,
    make_env,
    resolve_env_id,
)
from rfwp_rl.envs.atari import area_resize_matrix
from rfwp_rl.envs.pool_env import PoolEnv
from rfwp_rl.errors import UserError

REPO = Path(__file__).resolve().parent.parent
ENVS_DIR = REPO / "env_specs"


def _resize_ref(frame: np.ndarray, size: int = 84) -> np.ndarray:
    """Dense float64 area resize + round half up: the reference for the einsum version."""
    r = area_resize_matrix(frame.shape[0], size).astype(np.float64)
    c = area_resize_matrix(frame.shape[1], size).astype(np.float64)
    return np.floor(r @ frame.astype(np.float64) @ c.T + 0.5)


# -- Atari ---------------------------------------------------------------------------------


def test_atari_observation_shape_dtype_and_stack():
    env = make_env("Pong", seed=0)
    assert env.observation_space.shape == (4, 84, 84)
    assert env.observation_space.dtype == np.uint8
    assert env.action_space == gymnasium.spaces.Discrete(6)
    obs, info = env.reset()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.observation_space.contains(obs)
    assert all((obs[i] == obs[0]).all() for i in range(4))  # stack filled with the first frame
    prev = obs
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step(0)
        np.testing.assert_array_equal(obs[:3], prev[1:])  # oldest first, newest last
        prev = obs
    assert obs.std() > 0  # a real picture, not zeros
    env.close()


def test_out_of_range_action_is_refused():
    env = make_env("Pong", seed=0)
    env.reset()
    for bad in (-1, 6):
        with pytest.raises(IndexError, match="out of range"):
            env.step(bad)


def test_frame_skip_counts_emulator_frames():
    for skip in (4, 3):
        env = make_env("Pong", seed=0, frame_skip=skip, noop_max=0)
        env.reset()
        ale = env.unwrapped.ale
        assert ale.getEpisodeFrameNumber() == 0  # noop_max=0: no no-op frames
        for t in range(1, 6):
            env.step(1)
            assert ale.getEpisodeFrameNumber() == t * skip
        env.close()


def test_noop_starts_are_1_to_noop_max_frames_and_seeded():
    env = make_env("Pong")
    counts = [env.reset(seed=seed)[1]["episode_frame_number"] for seed in range(8)]
    assert all(1 <= c <= 30 for c in counts)
    assert len(set(counts)) > 2  # random across seeds
    unseeded = [env.reset()[1]["episode_frame_number"] for _ in range(8)]  # RNG runs on
    assert all(1 <= c <= 30 for c in unseeded) and len(set(unseeded)) > 2
    _, info = make_env("Pong", seed=3).reset()
    assert info["episode_frame_number"] == counts[3]  # same seed, same start


def test_max_over_last_two_frames_then_area_resize():
    """Replay the ALE by hand from a cloned state and compare with the wrapper's output."""
    env = make_env("Pong", seed=1)
    env.reset()
    ale = env.unwrapped.ale
    action_set = env.unwrapped._action_set
    pooled_differs = 0
    for step in range(40):
        a = step % 6
        state = ale.cloneState()
        frames = []
        for _ in range(4):
            ale.act(action_set[a])
            frames.append(ale.getScreenGrayscale().copy())
        ale.restoreState(state)
        obs = env.step(a)[0]
        expected = _resize_ref(np.maximum(frames[-2], frames[-1]))
        diff = np.abs(obs[-1].astype(np.int32) - expected)
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3  # float rounding at .5 only
        unpooled = _resize_ref(frames[-1])
        pooled_differs += int(np.abs(unpooled - expected).max() > 1)
    assert pooled_differs > 0  # the max really mattered on some steps (moving ball/paddles)


def test_area_resize_matrix():
    m = area_resize_matrix(210, 84)
    np.testing.assert_allclose(m.sum(1), 1.0, rtol=1e-6)
    assert m.shape == (84, 210)
    # integer factor: plain block average
    img = np.arange(64, dtype=np.float64).reshape(8, 8)
    r = area_resize_matrix(8, 4).astype(np.float64)
    np.testing.assert_allclose(r @ img @ r.T, img.reshape(4, 2, 4, 2).mean((1, 3)))


def test_minimal_action_sets():
    assert make_env("Pong").action_space.n == 6
    assert make_env("Breakout").action_space.n == 4
    assert make_env("ALE/MsPacman-v5").action_space.n == 9
    assert make_env("Pong", full_action_space=True).action_space.n == 18


def test_atari_games_csv_matches_code_and_ale():
    rows = list(csv.DictReader((ENVS_DIR / "atari_games.csv").open()))
    assert len(rows) == 20 == len(PAPER_GAMES)
    for row, game in zip(rows, PAPER_GAMES):
        assert row["game"] == game.name and row["gym_id"] == game.gym_id
        assert row["paper_name"] == game.paper_name
        assert int(row["minimal_actions"]) == game.minimal_actions
        assert int(row["paper_actions"]) == game.paper_actions
    ensure_registered()
    for game in PAPER_GAMES:  # every number measured against the installed ale-py
        env = gymnasium.make(game.gym_id, disable_env_checker=True)
        assert env.action_space.n == game.minimal_actions, game.name
        env.close()
    by_name = {g.name: g for g in PAPER_GAMES}
    assert by_name["Amidar"].paper_actions == 6 and by_name["Jamesbond"].paper_actions == 6


def test_full_game_episode_does_not_end_at_life_loss():
    env = make_env("Breakout", seed=0)
    env.reset()
    start_lives = env.unwrapped.ale.lives()
    assert start_lives == 5
    lives_seen, total, steps = {start_lives}, 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += reward
        steps += 1
        lives_seen.add(info["lives"])
        if terminated or truncated:
            break
        assert "episode" not in info
        assert steps < 20_000
    assert terminated and not truncated
    assert len(lives_seen) == 6  # 5, 4, 3, 2, 1, 0: all lives were lost in ONE episode
    assert info["episode"]["r"] == total and info["episode"]["l"] == steps


def test_episodic_life_is_opt_in_and_reports_full_game_return():
    env = make_env("Breakout", seed=0, episodic_life=True)
    env.reset()
    total, life_ends = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += reward
        if "episode" in info:
            break
        if terminated:
            life_ends += 1
            frame_before = info["episode_frame_number"]
            obs, info = env.reset()  # the game goes on
            assert info["episode_frame_number"] > frame_before  # not a new game
            assert (obs == obs[-1]).all()
    assert life_ends == 4  # 5 lives: 4 life-loss ends, then the game over
    assert terminated
    assert info["episode"]["r"] == total  # full-game return, not the last life's


def test_max_episode_frames_truncates():
    env = make_env("Pong", seed=0, max_episode_frames=400, noop_max=0)
    env.reset()
    for step in range(1, 200):  # noqa: B007 (the step the episode ended at, read below)
        obs, reward, terminated, truncated, info = env.step(0)
        if terminated or truncated:
            break
    assert truncated and not terminated
    assert step == 100 and info["episode"]["l"] == 100
    assert env_spec("Pong").max_episode_steps == 27_000


def test_atari_ids_and_short_names_resolve():
    for name in ("Pong", "pong", "PongNoFrameskip-v4", "ALE/Pong-v5", "Pong-v0"):
        r = resolve_env_id(name)
        assert (r.kind, r.gym_id, r.game) == ("atari", "ALE/Pong-v5", "Pong"), name
    assert resolve_env_id("space_invaders").gym_id == "ALE/SpaceInvaders-v5"
    info = env_spec("SpaceInvaders", repeat_action_probability=0.25)
    assert info.kind == "atari" and info.num_actions == 6 and info.obs_shape == (4, 84, 84)
    assert info.settings["repeat_action_probability"] == 0.25
    assert info.action_meanings[0] == "NOOP"


def test_sticky_actions_reach_the_emulator():
    assert make_env("Pong").unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    env = make_env("Pong", repeat_action_probability=0.25)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)


def test_seeded_atari_runs_repeat():
    def run(seed):
        env = make_env("Pong", seed=seed, repeat_action_probability=0.25)
        obs, _ = env.reset()
        out = [obs]
        for t in range(30):
            out.append(env.step(t % 6)[0])
        return np.stack(out)

    np.testing.assert_array_equal(run(7), run(7))


def test_bad_atari_settings():
    with pytest.raises(UserError, match="did you mean 'frame_skip'"):
        make_env("Pong", frameskip=4)
    with pytest.raises(UserError, match="repeat_action_probability=1.5"):
        make_env("Pong", repeat_action_probability=1.5)
    with pytest.raises(UserError, match="noop_max"):
        make_env("Pong", noop_max=-1)


# -- configs ---------------------------------------------------------------------------------


def test_atari_toml_equals_code_defaults(tmp_path):
    assert load_env_config(ENVS_DIR / "atari.toml") == ATARI_DEFAULTS
    bad = tmp_path / "bad.toml"
    bad.write_text("[atari]\nframe_skipp = 2\n")
    with pytest.raises(UserError, match="unknown Atari setting 'frame_skipp'"):
        load_env_config(bad)
    with pytest.raises(UserError, match="does not exist"):
        load_env_config(tmp_path / "missing.toml")
    with pytest.raises(UserError, match="is not a file"):
        load_env_config(tmp_path)
    bad.write_bytes(b"\x80\xcf\x00 not text")
    with pytest.raises(UserError, match="is not a text file"):
        load_env_config(bad)


# -- other gymnasium ids ---------------------------------------------------------------------


def test_vector_env_cartpole():
    env = make_env("CartPole-v1", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (4,) and obs.dtype == np.float32
    assert env.action_space.n == 2
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            break
    assert info["episode"]["l"] == steps and info["episode"]["r"] == pytest.approx(steps)
    info = env_spec("CartPole-v1")
    assert (info.kind, info.obs_shape, info.obs_dtype, info.num_actions, info.max_episode_steps) == (
        "vector",
        (4,),
        "float32",
        2,
        500,
    )
    first = [make_env("CartPole-v1", seed=5).reset()[0] for _ in range(2)]
    np.testing.assert_array_equal(first[0], first[1])


def test_discrete_observations_stay_integers_for_the_one_hot_encoder():
    env = make_env("FrozenLake-v1", seed=0)
    obs, _ = env.reset()
    assert obs.dtype == np.int64 and obs.shape == () and 0 <= int(obs) < 16
    assert env.observation_space == gymnasium.spaces.Discrete(16)


def test_continuous_actions_are_made_as_they_are():
    env = make_env("Pendulum-v1")
    assert env.action_space.shape == (1,)
    info = env_spec("Pendulum-v1")
    assert info.num_actions is None and info.action_space["type"] == "Box" and info.action_space["low"] == -2.0


def test_unknown_env_id_suggests_close_matches():
    with pytest.raises(UserError) as e:
        make_env("Pongg")
    msg = str(e.value)
    assert msg.startswith("unknown environment 'Pongg'") and "'Pong'" in msg and "\n" not in msg
    with pytest.raises(UserError, match="'CartPole-v1'"):
        make_env("CartPol-v1")
    with pytest.raises(UserError, match="cannot import env module 'no_such_pkg.envs'"):
        make_env("no_such_pkg.envs:Foo-v0")


def test_bad_gymnasium_kwarg_is_a_user_error():
    with pytest.raises(UserError, match="bad option for environment 'CartPole-v1'"):
        make_env("CartPole-v1", no_such_option=3)
    with pytest.raises(UserError, match=r"bad option for environment 'CartPole-v1' \(max_episode_steps\): .*positive"):
        make_env("CartPole-v1", max_episode_steps=-5)  # a value gymnasium refuses with a ValueError


# -- user environments -----------------------------------------------------------------------


def test_example_env_registers_and_is_solvable():
    path = ENVS_DIR / "example_env.py"
    module = import_env_module(str(path))
    assert import_env_module(str(path)) is module  # imported once
    env = make_env(f"{path}:{module.ENV_ID}", seed=0)
    assert env_spec(module.ENV_ID).kind == "vector"
    for _ in range(4):  # the optimal policy: remember the cue, walk, turn
        obs, _ = env.reset()
        turn = module.LEFT if obs[0] == 1.0 else module.RIGHT
        while obs[2] == 0.0:
            obs, reward, terminated, truncated, info = env.step(module.FORWARD)
        obs, reward, terminated, truncated, info = env.step(turn)
        assert terminated and reward == 1.0 and info["episode"]["l"] == 6


def test_pomdp_graph_id_is_registered_lazily():
    ensure_registered()
    spec = gymnasium.registry[POMDP_GRAPH_ID]
    assert spec.entry_point == "rfwp_rl.meta_rl.graph_env:PomdpGraphEnv"
    try:
        import rfwp_rl.meta_rl.graph_env  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="cannot be imported"):
            make_env(POMDP_GRAPH_ID)
    else:
        assert env_spec(POMDP_GRAPH_ID).kind == "vector"
    # the same lazy mechanism with a module that does not exist: a one-line UserError
    if "rfwp_tests/Missing-v0" not in gymnasium.registry:
        gymnasium.register(id="rfwp_tests/Missing-v0", entry_point="rfwp_no_such_module.env:Env")
    with pytest.raises(UserError, match="'rfwp_tests/Missing-v0' is registered but its module cannot be imported"):
        make_env("rfwp_tests/Missing-v0")


def test_missing_env_module_file():
    with pytest.raises(UserError, match="does not exist"):
        import_env_module("no/such/file.py")


# -- the adapter moolib.EnvPool drives ------------------------------------------------------


def test_pool_env_adapter_episode_bookkeeping():
    env = PoolEnv(make_env("CartPole-v1", seed=0))
    first = env.reset()
    assert set(first) == {"obs", "episode_return", "episode_step", "episode_end", "truncated"}
    assert first["obs"].shape == (4,) and not first["episode_end"]
    steps = 0
    while True:
        out, reward, done, _ = env.step(0)  # always left: falls in ~10 steps
        steps += 1
        assert out["episode_step"] == steps and out["episode_return"] == pytest.approx(steps)
        if done:
            break
    assert out["episode_end"]
    after = env.reset()  # what EnvPool stores on the done step: new obs, ended episode's stats
    assert after["episode_end"] and after["episode_step"] == steps
    nxt, _, _, _ = env.step(0)
    assert nxt["episode_step"] == 1 and not nxt["episode_end"]


def test_pool_env_adapter_episodic_life_counts_full_games():
    env = PoolEnv(make_env("Breakout", seed=0, episodic_life=True))
    env.reset()
    total, dones = 0.0, 0
    while True:
        out, reward, done, _ = env.step(np.random.randint(4))
        total += reward
        assert out["episode_return"] == pytest.approx(total)
        if done:
            dones += 1
            out = env.reset()
            if out["episode_end"]:
                break
            assert out["episode_return"] == pytest.approx(total)  # still the running game
    assert dones == 5 and out["episode_return"] == pytest.approx(total)


@pytest.mark.filterwarnings("ignore:.*WARN:")  # gymnasium's env checker names the same bad reward
@pytest.mark.parametrize("reward", [None, float("nan"), float("inf"), "1", np.float64(0.5), np.array(2.0)])
def test_an_env_reward_that_is_no_finite_number_stops_in_one_line(reward):
    import gymnasium

    class Env(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(0, 1, (2,))
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), reward, False, False, {}

    gymnasium.register("rfwp-test/BadReward-v0", entry_point=Env)
    try:
        env = make_env("rfwp-test/BadReward-v0", seed=0)
        env.reset()
        if isinstance(reward, (np.floating, np.ndarray)):  # numpy numbers are numbers
            assert env.step(0)[1] == float(reward) and isinstance(env.step(0)[1], float)
            return
        with pytest.raises(ValueError, match=r"^rfwp-test/BadReward-v0 returned the reward .*; allowed: a finite"):
            env.step(0)
    finally:
        del gymnasium.registry["rfwp-test/BadReward-v0"]
