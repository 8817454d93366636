"""rfwp-rl eval: the paper's protocol (repeats x episodes of full games), noneg, outputs,
checkpoint checks. Checkpoints are built here in the trainer's format (rfwp_rl.impala.train)."""

from __future__ import annotations

import json

import gymnasium
import numpy as np
import pytest
import torch

from rfwp_rl import cli, envs
from rfwp_rl.agent import Agent
from rfwp_rl.checkpoint import Checkpointer
from rfwp_rl.errors import UserError
from rfwp_rl.impala.evaluate import eval_env_options, evaluate, play, quotas, split_repeats, summarize
from rfwp_rl.impala.run_spec import RunSpec
from rfwp_rl.presets import Preset
from rfwp_rl.scores import load_runs

pytestmark = pytest.mark.usefixtures("one_thread")


def make_checkpoint(
    run_dir, env_id, core="lstm", core_config=None, env_options=None, step=1000, trainer="impala", meta_num_actions=None
):
    """Save an untrained agent exactly as ``rfwp-rl train`` does (``RunSpec.meta`` + state['agent'])."""
    spec = envs.env_spec(env_id, **(env_options or {}))
    action_space = (
        spec.action_space if meta_num_actions is None else {"type": "Discrete", "n": meta_num_actions, "start": 0}
    )
    run = RunSpec(
        spec.gym_id,
        spec.kind,
        spec.obs_space,
        action_space,
        dict(env_options or {}),
        Preset(core, dict(core_config or {})),
    )
    torch.manual_seed(0)
    agent = run.build_agent()
    meta = {**run.meta(agent), "trainer": trainer}
    return Checkpointer(run_dir, meta).save({"agent": agent.state_dict()}, step)


class SignEnv(gymnasium.Env):
    """Deterministic scores: every episode lasts 2 steps; episode k of an env scores -1 when
    k % 3 == 1, else +2 (the reward is half of that at each step)."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self):
        self.k, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k, self.t = self.k + 1, 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        score = -1.0 if self.k % 3 == 1 else 2.0
        return np.full(3, self.t / 2, np.float32), score / 2, self.t == 2, False, {}


SIGN_ID = "RfwpTestSign-v0"
if SIGN_ID not in gymnasium.registry:
    gymnasium.register(id=SIGN_ID, entry_point=SignEnv)


# ---------------------------------------------------------------- aggregation


def test_split_repeats_and_summary_on_a_fixed_score_list():
    scores = [3, -2, 5, 0, -1, 4, 7, -3, 1, 2]
    groups, dropped = split_repeats(scores, episodes=2, repeats=3)
    assert groups == [[3, -2], [5, 0], [-1, 4]] and dropped == 0
    groups, dropped = split_repeats(scores, episodes=2, repeats=3, noneg=True)
    assert groups == [[3, 5], [0, 4], [7, 1]] and dropped == 3  # a score of 0 is kept
    s = summarize(groups)
    assert s["repeat_means"] == [4.0, 2.0, 4.0]
    assert s["mean"] == pytest.approx(10 / 3) and s["std"] == pytest.approx(np.sqrt(8 / 9))
    with pytest.raises(ValueError, match="7 usable episodes, 8 needed"):
        split_repeats(scores, episodes=4, repeats=2, noneg=True)
    assert quotas(150, 16) == [10] * 6 + [9] * 10 and sum(quotas(7, 3)) == 7


def test_noneg_end_to_end_on_deterministic_scores(tmp_path):
    make_checkpoint(tmp_path / "run", SIGN_ID, core_config={"hidden_size": 8})
    # 12 episodes on 5 envs: quotas 3, 3, 2, 2, 2; each env plays +2, -1, +2, +2, -1, ...
    rec = evaluate(tmp_path / "run", episodes=4, repeats=3, num_envs=5, quiet=True)
    # (env, episode) order: [2,-1,2 | 2,-1,2 | 2,-1 | 2,-1 | 2,-1] in groups of 4
    assert rec["scores"] == [[2, -1, 2, 2], [-1, 2, 2, -1], [2, -1, 2, -1]]
    assert rec["mean"] == pytest.approx(0.75) and rec["std"] == pytest.approx(np.std([1.25, 0.5, 0.5]))
    assert rec["dropped_negative"] == 0 and rec["lengths"] == [[2] * 4] * 3
    rec = evaluate(tmp_path / "run", episodes=4, repeats=3, num_envs=5, noneg=True, quiet=True)
    assert rec["scores"] == [[2.0] * 4] * 3 and (rec["mean"], rec["std"]) == (2.0, 0.0)
    assert rec["dropped_negative"] == 5  # one negative episode per env before its quota is full
    assert rec["env_steps"] == 2 * (12 + 5)
    with pytest.raises(UserError, match="--noneg: 3 episodes ended with a negative score"):
        evaluate(tmp_path / "run", episodes=4, repeats=3, num_envs=5, noneg=True, max_dropped=2, quiet=True)


class SpyAgent(Agent):
    """Records what the agent is fed at each batched call, and the policy logits it returns."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def forward(self, obs, reward, done, state, prev_action=None, greedy=False, with_features=False):
        out, state = super().forward(
            obs, reward, done, state, prev_action=prev_action, greedy=greedy, with_features=with_features
        )
        self.calls.append((reward[0].tolist(), done[0].tolist(), out["policy_params"][0].clone()))
        return out, state


def test_play_feeds_rewards_and_resets_like_training_and_keeps_states_apart():
    torch.manual_seed(0)
    spy = SpyAgent((3,), 2, "lstm", {"hidden_size": 8})
    eps = play(spy, [envs.make_env(SIGN_ID, seed=i) for i in range(2)], [2, 1])
    assert [(e.env, e.index, e.score, e.length) for e in eps] == [(0, 0, 2.0, 2), (0, 1, -1.0, 2), (1, 0, 2.0, 2)]
    # env 0's second episode starts with the previous episode's last reward (1.0) and done=True
    assert [c[:2] for c in spy.calls] == [
        ([0.0, 0.0], [True, True]),
        ([1.0, 1.0], [False, False]),
        ([1.0], [True]),
        ([-0.5], [False]),
    ]
    # env 0 played alone gives the same outputs: batching and dropping finished envs keep states apart
    alone = SpyAgent((3,), 2, "lstm", {"hidden_size": 8})
    alone.load_state_dict(spy.state_dict())
    play(alone, [envs.make_env(SIGN_ID, seed=0)], [2])
    batched_env0 = [spy.calls[0][2][0], spy.calls[1][2][0], spy.calls[2][2][0], spy.calls[3][2][0]]
    for a, b in zip(batched_env0, [c[2][0] for c in alone.calls], strict=True):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(spy.calls[1][2][0], spy.calls[3][2][0])  # inputs differ -> outputs differ


# ---------------------------------------------------------------- full protocol


def test_cartpole_cli_5_by_30_outputs_and_tensorboard(tmp_path, capsys):
    run = tmp_path / "cartpole_lstm"
    make_checkpoint(run, "CartPole-v1", core_config={"hidden_size": 16}, step=4321)
    assert cli.main(["eval", str(run), "--num-actors", "10"]) == 0
    out = capsys.readouterr().out
    assert "CartPole lstm @ 4.321k:" in out
    rec = json.loads((run / "eval_000000004321_greedy.json").read_text())
    assert (rec["episodes"], rec["repeats"], rec["mode"], rec["noneg"]) == (30, 5, "greedy", False)
    scores = np.array(rec["scores"])
    assert scores.shape == (5, 30) and np.array(rec["lengths"]).shape == (5, 30)
    assert (scores >= 8).all()  # CartPole: +1 per step, at least ~8 steps before falling
    assert np.array_equal(scores, np.array(rec["lengths"]))  # CartPole: score == length
    assert rec["repeat_means"] == pytest.approx(scores.mean(1).tolist())
    assert rec["mean"] == pytest.approx(scores.mean(1).mean()) and rec["std"] == pytest.approx(scores.mean(1).std())
    assert rec["env_steps"] == scores.sum() and rec["steps"] == 4321
    # the CSV row is read back by `rfwp-rl compare --runs`
    (score,) = load_runs([run])
    assert (score.game, score.model, score.steps) == ("CartPole", "lstm", 4321)
    assert score.mean == pytest.approx(rec["mean"])
    assert (
        (run / "eval_000000004321_greedy.csv")
        .read_text()
        .startswith("game,game_label,model,model_label,steps,mean,std")
    )
    # TensorBoard scalars at the checkpoint's step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    (ev,) = acc.Scalars("eval/greedy/mean")
    assert ev.step == 4321 and ev.value == pytest.approx(rec["mean"], rel=1e-6)
    # --actions sample and --episodes/--repeats overrides write separate files
    assert (
        cli.main(["eval", str(run), "--actions", "sample", "--episodes", "3", "--repeats", "2", "--no-tensorboard"])
        == 0
    )
    rec = json.loads((run / "eval_000000004321_sample.json").read_text())
    assert np.array(rec["scores"]).shape == (2, 3) and rec["mode"] == "sample"


def test_atari_full_games_tiny_limit_and_gif(tmp_path):
    from PIL import Image

    run = tmp_path / "pong"
    # trained with episodic_life on: eval must still play full games
    make_checkpoint(
        run, "Pong", core_config={"hidden_size": 32}, env_options={"episodic_life": True, "max_episode_frames": 120}
    )
    rec = evaluate(
        run,
        episodes=2,
        repeats=5,
        num_envs=10,
        video=tmp_path / "pong.gif",
        quiet=True,
        env_overrides={"max_episode_frames": 120},
    )
    assert np.array(rec["scores"]).shape == (5, 2)
    assert rec["env_options"] == {"episodic_life": False, "max_episode_frames": 120} and rec["env"] == "ALE/Pong-v5"
    assert rec["truncated"] == 10  # every game hit the 120-frame limit (<= 30 agent steps)
    assert all(0 < n <= 30 for row in rec["lengths"] for n in row)
    gif = Image.open(tmp_path / "pong.gif")
    assert gif.size == (160, 210) and gif.n_frames > 5
    total_ms = 0  # Pillow merges identical consecutive frames and adds up their durations
    for i in range(gif.n_frames):
        gif.seek(i)
        total_ms += gif.info["duration"]
    assert total_ms == 70 * (rec["lengths"][0][0] + 1)  # first frame + one per step of env 0's episode


def test_eval_env_options_full_games_and_paper_frame_cap():
    meta = {"env_options": {"episodic_life": True, "max_episode_frames": 108000, "repeat_action_probability": 0.25}}
    assert eval_env_options(meta, {}, "atari") == {
        "episodic_life": False,
        "max_episode_frames": 400_000,
        "repeat_action_probability": 0.25,
    }
    assert eval_env_options(meta, {"max_episode_frames": 0}, "atari")["max_episode_frames"] == 0
    assert eval_env_options({"env_options": {"max_episode_steps": 50}}, {}, "vector") == {"max_episode_steps": 50}


# ---------------------------------------------------------------- checkpoint checks


def test_mismatched_core_env_or_actions_give_one_line_errors(tmp_path, capsys):
    run = tmp_path / "run"
    make_checkpoint(run, "CartPole-v1", core_config={"hidden_size": 8})
    for flags, message in [
        (["--core", "rdn"], "core: checkpoint has 'lstm', this run has 'rdn'"),
        (["--num-actions", "3"], "num_actions: checkpoint has 2, this run has 3"),
        (["--env", "Acrobot-v1"], "env: checkpoint has 'CartPole-v1', this run has 'Acrobot-v1'"),
    ]:
        assert cli.main(["eval", str(run), *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # a checkpoint whose action count differs from its env's (e.g. trained with a reduced action set)
    make_checkpoint(tmp_path / "a3", "CartPole-v1", core_config={"hidden_size": 8}, meta_num_actions=3)
    with pytest.raises(UserError, match="action_space.n: checkpoint has 3, this run has 2"):
        evaluate(tmp_path / "a3", episodes=1, repeats=1, quiet=True)
    make_checkpoint(tmp_path / "a2c", "CartPole-v1", trainer="meta_rl")
    with pytest.raises(UserError, match="trainer 'meta_rl', not 'impala'"):
        evaluate(tmp_path / "a2c", quiet=True)
    with pytest.raises(UserError, match="does not exist"):
        evaluate(tmp_path / "nowhere", quiet=True)


@pytest.mark.slow
def test_evaluates_a_checkpoint_written_by_the_trainer(tmp_path, capsys):
    """Guards the trainer <-> eval contract (meta keys, state['agent']) with a real tiny run."""
    run = tmp_path / "tiny"
    assert (
        cli.main(
            [
                "train",
                "--env",
                "CartPole-v1",
                "--core",
                "lstm",
                "--set",
                "core_config.hidden_size=8",
                "--total-steps",
                "160",
                "--num-actors",
                "2",
                "--unroll-length",
                "10",
                "--batch-size",
                "2",
                "--env-backend",
                "local",
                "--run-dir",
                str(run),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        cli.main(
            [
                "eval",
                str(run),
                "--episodes",
                "3",
                "--repeats",
                "2",
                "--core",
                "lstm",
                "--env",
                "CartPole-v1",
                "--num-actions",
                "2",
                "--no-tensorboard",
            ]
        )
        == 0
    )
    (score,) = load_runs([run])
    assert (score.game, score.model, score.steps) == ("CartPole", "lstm", 160)
    rec = json.loads(next(run.glob("eval_*_greedy.json")).read_text())
    assert np.array(rec["scores"]).shape == (2, 3) and rec["core_config"]["hidden_size"] == 8


@pytest.mark.slow
def test_eval_of_an_env_from_a_module_imports_it_only_when_env_names_it(tmp_path, capsys):
    """A run trained with --env module:EnvId records the module with the env; importing it runs the
    module's code, so eval asks for --env naming it (one line) instead of importing what a file
    says; with --env it evaluates. A checkpoint of another layout is refused in one line that names
    what differs, by eval and by a resume."""
    from rfwp_rl.checkpoint import atomic_torch_save, list_checkpoints, read_checkpoint

    run = tmp_path / "mod"
    assert (
        cli.main(
            [
                "train",
                "--env",
                "fault_envs:FaultCartPole-v0",
                "--core",
                "lstm",
                "--set",
                "core_config.hidden_size=8",
                "--total-steps",
                "40",
                "--num-actors",
                "2",
                "--unroll-length",
                "10",
                "--batch-size",
                "2",
                "--env-backend",
                "local",
                "--run-dir",
                str(run),
            ]
        )
        == 0
    )
    file = list_checkpoints(run)[0]
    assert read_checkpoint(file)["meta"]["env"] == "fault_envs:FaultCartPole-v0"
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--episodes", "2", "--repeats", "1", "--num-actors", "2"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--env fault_envs:FaultCartPole-v0" in err[0], err
    env = ["--env", "fault_envs:FaultCartPole-v0"]
    assert cli.main(["eval", str(run), *env, "--episodes", "2", "--repeats", "1", "--num-actors", "2"]) == 0
    assert "on fault_envs:FaultCartPole-v0" in capsys.readouterr().out
    train = [
        "train",
        "--env",
        "fault_envs:FaultCartPole-v0",
        "--core",
        "lstm",
        "--set",
        "core_config.hidden_size=8",
        "--total-steps",
        "60",
        "--num-actors",
        "2",
        "--unroll-length",
        "10",
        "--batch-size",
        "2",
        "--env-backend",
        "local",
        "--run-dir",
        str(run),
    ]
    assert cli.main(train) == 0  # resumes
    assert "from step 40" in capsys.readouterr().out
    file = list_checkpoints(run)[0]
    other = read_checkpoint(file)
    del other["meta"]["obs_space"]
    atomic_torch_save(other, file)
    assert cli.main(["eval", str(run), *env, "--episodes", "2", "--repeats", "1", "--num-actors", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: checkpoint {file} lacks meta 'obs_space': it has another layout than rfwp-rl train of "
        "this version writes"
    ], err
    assert cli.main([*train, "--total-steps", "80"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "obs_space: checkpoint has '<missing>'" in err[0], err


def test_a_checkpoint_from_before_the_grid_embedding_loads_with_scaled_cells(tmp_path):
    """Grid cells are embedded by default; a checkpoint whose meta predates the option (no
    ``grid_embedding`` in its agent) was trained on cells scaled by 1/255 and loads as such."""
    import space_envs  # noqa: F401  (registers SpaceDict-v0: a 7x7x3 uint8 grid among its parts)
    from rfwp_rl.checkpoint import atomic_torch_save, read_checkpoint
    from rfwp_rl.impala.evaluate import load_agent

    file = make_checkpoint(tmp_path / "embedded", "space_envs:SpaceDict-v0")
    agent, meta, _, _ = load_agent(tmp_path / "embedded", env="space_envs:SpaceDict-v0")
    assert meta["agent"]["grid_embedding"] == 16 and agent.torso.images["image"].embed is not None

    spec = envs.env_spec("space_envs:SpaceDict-v0")
    run = RunSpec(spec.gym_id, spec.kind, spec.obs_space, spec.action_space, {}, Preset("lstm", {}))
    run.preset.agent["grid_embedding"] = 0
    scaled = run.build_agent()
    meta = {**run.meta(scaled), "trainer": "impala"}
    del meta["agent"]["grid_embedding"]
    obj = read_checkpoint(file)
    obj["meta"], obj["state"] = meta, {"agent": scaled.state_dict()}
    (tmp_path / "old").mkdir()
    atomic_torch_save(obj, tmp_path / "old" / file.name)
    agent, _, _, _ = load_agent(tmp_path / "old", env="space_envs:SpaceDict-v0")
    assert agent.torso.images["image"].embed is None and agent.torso.images["image"].divisor == 255.0


@pytest.mark.filterwarnings("ignore:.*render_mode:UserWarning")  # gymnasium's, before the env refuses it
def test_video_of_an_env_that_cannot_render_is_a_one_line_error(tmp_path):
    run = tmp_path / "recall"
    make_checkpoint(run, "rfwp/DelayedRecall-easy-v0", core_config={"hidden_size": 8})
    with pytest.raises(UserError, match=r"^--video: rfwp/DelayedRecall-easy-v0 cannot render frames"):
        evaluate(run, episodes=1, repeats=1, num_envs=1, video=tmp_path / "x.gif", quiet=True)
    assert not (tmp_path / "x.gif").exists()


def test_a_render_that_gives_no_rgb_frame_is_a_one_line_error(tmp_path):
    from rfwp_rl.impala.evaluate import GifRecorder

    with pytest.raises(UserError, match=r"render\(\) gave NoneType, not an RGB frame"):
        GifRecorder(tmp_path / "x.gif", lambda: None).capture()
    with pytest.raises(UserError, match=r"render\(\) gave an array of shape \(4, 4\)"):
        GifRecorder(tmp_path / "x.gif", lambda: np.zeros((4, 4), np.uint8)).capture()
    rgba = GifRecorder(tmp_path / "x.gif", lambda: np.full((4, 5, 4), 200, np.uint8))
    rgba.capture()
    assert rgba.save() == tmp_path / "x.gif" and (tmp_path / "x.gif").is_file()
