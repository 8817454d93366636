"""A2C meta-RL: the loss against a hand computation, every core through the trainer, a short
learning run, resume, CLI errors. (The FWM core and its stepper are tested in test_fwm_core.py.)"""

import csv
import math
import os
import signal

import pytest
import torch

from rfwp_rl import cores
from rfwp_rl.checkpoint import find_checkpoint_file, lock_run_dir, read_checkpoint
from rfwp_rl.cli import main
from rfwp_rl.meta_rl import a2c, graph_env, train
from rfwp_rl.meta_rl.config import MetaRLConfig
from rfwp_rl.meta_rl.model import MetaRLAgent, count_parameters
from rfwp_rl.presets import AGENTS_DIR, load_preset

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = MetaRLConfig()
LOSS = dict(discount=CFG.discount, baseline_cost=CFG.baseline_cost, entropy_cost=CFG.entropy_cost)  # App. I's


# ------------------------------------------------------------------------------- the loss


def test_discounted_returns_by_hand():
    r = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    out = a2c.discounted_returns(r, 0.5)
    expected = torch.tensor([[1 + 0.5 * 0 + 0.25 * 3, 0 + 0.5 * 2 + 0], [0 + 0.5 * 3, 2.0], [3.0, 0.0]])
    torch.testing.assert_close(out, expected)
    out = a2c.discounted_returns(r, 0.5, bootstrap=torch.tensor([8.0, 4.0]))
    torch.testing.assert_close(out[2], torch.tensor([3 + 4.0, 0 + 2.0]))
    torch.testing.assert_close(out[0, 1], torch.tensor(0 + 0.5 * (2 + 0.5 * 2.0)))


def test_discounted_returns_cut_at_termination_and_bootstrapped_at_truncation():
    """One sequence of 5 steps, gamma 0.5: an episode terminates after step 1, the next is cut by a
    time limit after step 3 (V of its last observation: 6), a third runs past the end (bootstrap 8)."""
    r = torch.tensor([[1.0], [2.0], [0.0], [4.0], [1.0]])
    terminated = torch.tensor([[False], [True], [False], [False], [False]])
    truncated = torch.tensor([[False], [False], [False], [True], [False]])
    final_values = torch.tensor([[0.0], [0.0], [0.0], [6.0], [0.0]])
    out = a2c.discounted_returns(
        r, 0.5, bootstrap=torch.tensor([8.0]), terminated=terminated, truncated=truncated, final_values=final_values
    )
    # R4 = 1 + .5*8 = 5; R3 = 4 + .5*6 = 7; R2 = 0 + .5*7 = 3.5; R1 = 2 (terminal); R0 = 1 + .5*2 = 2
    torch.testing.assert_close(out[:, 0], torch.tensor([2.0, 2.0, 3.5, 7.0, 5.0]))
    with pytest.raises(ValueError, match="final_values"):
        a2c.discounted_returns(r, 0.5, truncated=truncated)


def test_a2c_loss_equals_hand_computation():
    L3 = math.log(3.0)
    logits = torch.tensor(
        [
            [[0, 0], [L3, 0]],  # t = 0: p = (.5, .5) and (.75, .25)
            [[L3, 0], [0, 0]],  # t = 1
            [[0, 0], [L3, 0]],
        ]
    )  # t = 2
    actions = torch.tensor([[1, 0], [1, 1], [0, 1]])
    rewards = torch.tensor([[0.0, 10.0], [-0.05, 0.0], [10.0, 0.0]])
    values = torch.tensor([[1.0, 2.0], [3.0, 0.0], [4.0, -1.0]], requires_grad=True)
    logits.requires_grad_(True)
    out = a2c.a2c_loss(logits, values, actions, rewards, discount=0.9, baseline_cost=0.1, entropy_cost=0.03)

    # returns with discount 0.9, by hand:
    #   agent 0: R2 = 10, R1 = -0.05 + 0.9 * 10 = 8.95, R0 = 0 + 0.9 * 8.95 = 8.055
    #   agent 1: R2 = 0,  R1 = 0,                        R0 = 10
    # advantages R - V: agent 0: 7.055, 5.95, 6; agent 1: 8, 0, 1
    adv = [7.055, 8.0, 5.95, 0.0, 6.0, 1.0]  # (t, b) in row-major order
    logp = [math.log(0.5), math.log(0.75), math.log(0.25), math.log(0.5), math.log(0.5), math.log(0.25)]
    policy = -sum(lp * a for lp, a in zip(logp, adv)) / 6
    value = sum(a * a for a in adv) / 6
    h_half, h_34 = math.log(2), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    entropy = (3 * h_half + 3 * h_34) / 6
    assert out["policy_loss"].item() == pytest.approx(policy, rel=1e-6)
    assert out["value_loss"].item() == pytest.approx(value, rel=1e-6)
    assert out["entropy"].item() == pytest.approx(entropy, rel=1e-6)
    assert out["loss"].item() == pytest.approx(policy + 0.1 * value - 0.03 * entropy, rel=1e-6)

    out["loss"].backward()
    # d loss / d V = baseline_cost * d mean(A²) / dV = -2 * 0.1 * A / 6 (the policy term's A is detached)
    expected = torch.tensor([[7.055, 8.0], [5.95, 0.0], [6.0, 1.0]]) * (-2 * 0.1 / 6)
    torch.testing.assert_close(values.grad, expected)
    # d loss / d logit of the taken action at a uniform (.5, .5) entry with A = 7.055:
    # policy part -(1 - .5) A / 6; entropy part of a uniform distribution is stationary (0)
    assert logits.grad[0, 0, 1].item() == pytest.approx(-(1 - 0.5) * 7.055 / 6, rel=1e-5)


def test_a2c_loss_rejects_bad_shapes():
    with pytest.raises(ValueError, match="shape mismatch"):
        a2c.a2c_loss(
            torch.zeros(3, 2, 3), torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.long), torch.zeros(2, 3), **LOSS
        )


# ------------------------------------------------------------------------------- agents


def test_paper_agents_parameter_counts_and_presets():
    fwm = load_preset(AGENTS_DIR / "meta_rl_fwm.toml")
    assert fwm.core == "fwm" and fwm.core_config == train.META_RL_CORE_DEFAULTS["fwm"]
    agent = MetaRLAgent("fwm", fwm.core_config, 17, 3)
    # LSTM 17->32 (6,528) + W_write,W_β 32->49 (1,617) + read 32->64 (2,112) + W_o 16->32 (544)
    # + policy 32->3 (99) + value 32->1 (33)
    assert count_parameters(agent) == 10_933
    for h in (512, 1024, 2048, 4096):
        p = load_preset(AGENTS_DIR / f"meta_rl_lstm{h}.toml")
        assert p.core == "lstm" and p.core_config == {"hidden_size": h, "num_layers": 1}
        # nn.LSTM (two bias vectors) + heads
        formula = 4 * h * (17 + h) + 8 * h + 4 * h + 4
        assert f"{formula:,}" in (AGENTS_DIR / f"meta_rl_lstm{h}.toml").read_text()
    assert count_parameters(MetaRLAgent("lstm", {"hidden_size": 512}, 17, 3)) == 4 * 512 * 529 + 12 * 512 + 4
    assert 4 * 4096 * (17 + 4096) + 12 * 4096 + 4 == 67_436_548  # paper: "67.4M"


@pytest.mark.parametrize("name", sorted(cores.available()))
def test_every_core_trains_one_episode(name):
    torch.manual_seed(0)
    train_t, _ = graph_env.graph_sets()
    env = graph_env.GraphBatchEnv(train_t[:3], rng=0)
    small = {
        "hidden_size": 16,
        "num_heads": 2,
        "num_layers": 1,
        "ff_size": 32,
        "memory_size": 8,
        "backend": "reference",
    }  # (the fused kernels have their own tests)
    config = {k: v for k, v in small.items() if k in cores.available()[name].defaults}
    agent = MetaRLAgent(name, config, 17, 3)
    out = train.rollout(agent, env, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert out["logits"].shape == (30, 3, 3) and out["values"].shape == (30, 3)
    loss = a2c.a2c_loss(out["logits"], out["values"], out["actions"], out["rewards"], **LOSS)["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in agent.parameters())
    # the value head gets a gradient from the whole episode
    assert agent.value.weight.grad.abs().sum() > 0


def test_rollout_trains_on_the_logits_it_acted_with():
    # acting steps the core without gradients; a training rollout then calls the agent once on
    # the whole episode: the same logits and values, now with gradients through all 30 steps
    torch.manual_seed(0)
    train_t, _ = graph_env.graph_sets()
    agent = MetaRLAgent("fwm", {"hidden_size": 16, "memory_size": 8}, 17, 3)
    outs = []
    for grad in (False, True):
        env = graph_env.GraphBatchEnv(train_t[:4], rng=0)
        with torch.set_grad_enabled(grad):
            outs.append(train.rollout(agent, env, torch.device("cpu"), torch.Generator().manual_seed(0)))
    acted, trained = outs
    assert torch.equal(acted["actions"], trained["actions"])
    assert trained["logits"].requires_grad and not acted["logits"].requires_grad
    torch.testing.assert_close(trained["logits"], acted["logits"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(trained["values"], acted["values"], rtol=1e-5, atol=1e-6)


def test_training_rollout_replays_the_acting_steps_with_the_gradients_of_one_call(ext):
    # on the fused ops the training rollout replays what acting recorded (no second forward);
    # the loss gradient equals the one through one call of the agent on the episode (float32:
    # the environment's observations)
    from rfwp_rl.cores.fwm import FWMCore

    train_t, _ = graph_env.graph_sets()
    grads = {}
    for record in (True, False):
        torch.manual_seed(0)
        agent = MetaRLAgent("fwm", {"hidden_size": 16, "memory_size": 8, "backend": "kernel"}, 17, 3)
        env = graph_env.GraphBatchEnv(train_t[:6], rng=0)
        made = []
        stepper = FWMCore.stepper

        def spy(self, *a, record=False, **k):  # used in this iteration only: its loop variables are current
            s = stepper(self, *a, record=record and RECORD, **k)  # noqa: B023
            made.append(s)  # noqa: B023
            return s

        RECORD = record
        FWMCore.stepper = spy
        try:
            out = train.rollout(agent, env, torch.device("cpu"), torch.Generator().manual_seed(0))
        finally:
            FWMCore.stepper = stepper
        assert (made[0].replay() is not None) == record  # the record is what was used
        loss = a2c.a2c_loss(out["logits"], out["values"], out["actions"], out["rewards"], **LOSS)["loss"]
        grads[record] = (out["logits"], torch.autograd.grad(loss, list(agent.parameters())))
    torch.testing.assert_close(grads[True][0], grads[False][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(grads[True][1], grads[False][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------- the trainer


def _rows(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_short_run_learns_on_unseen_graphs(tmp_path, capsys):
    """400 updates of 256 agents (LSTM of 32 units, 10-step episodes: 1,024,000 env steps; invalid actions cost 10):
    the agent learns to stop repeating invalid actions, which needs memory of the previous
    location, and the sampled test reward on the 600 unseen graphs rises clearly (about +10;
    the evaluation noise of a mean over 600 episodes is about 1)."""
    code = main(
        [
            "meta-rl",
            "--core",
            "lstm",
            "--set",
            "core_config.hidden_size=32",
            "--learning-rate",
            "2e-2",
            "--invalid-penalty",
            "10",
            "--episode-steps",
            "10",
            "--batch-size",
            "256",
            "--total-steps",
            str(400 * 2560),
            "--eval-every",
            str(200 * 2560),
            "--seed",
            "0",
            "--torch-threads",
            "1",
            "--run-dir",
            str(tmp_path),
            "--log-every",
            "1000",
        ]
    )
    assert code == 0
    rows = _rows(tmp_path)
    assert [r["episode"] for r in rows] == ["0", "200", "400"]
    assert [r["env_steps"] for r in rows] == ["0", str(200 * 2560), str(400 * 2560)]
    before, *after = [float(r["test_reward_sampled"]) for r in rows]
    assert min(after) > before + 4.0 and sum(after) / 2 > before + 6.0, (before, after)
    # invalid actions per 10-step episode in updates 201-400 (a random policy makes ~3.8)
    assert float(rows[2]["train_invalid"]) < 3.2
    assert "test total reward" in capsys.readouterr().out


STEPS = 8 * 30  # env steps of an episode of the batch below


def _run_args(run_dir, episodes):
    return [
        "meta-rl",
        "--core",
        "fwm",
        "--set",
        "core_config.hidden_size=16",
        "--set",
        "core_config.memory_size=8",
        "--batch-size",
        "8",
        "--test-graphs",
        "8",
        "--total-steps",
        str(episodes * STEPS),
        "--eval-every",
        str(2 * STEPS),
        "--eval-actions",
        "both",
        "--seed",
        "3",
        "--run-dir",
        str(run_dir),
        "--log-every",
        "1000",
    ]


def test_resume_after_interruption_continues_at_saved_episode(tmp_path, monkeypatch, capsys):
    straight = tmp_path / "straight"
    assert main(_run_args(straight, 6)) == 0

    # interrupted run: a real SIGINT arrives during the 4th update; the trainer finishes that
    # update, saves a checkpoint at episode 4 and exits 0
    calls = {"n": 0}
    real_loss = a2c.a2c_loss

    def loss_then_sigint(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return real_loss(*args, **kwargs)

    interrupted = tmp_path / "interrupted"
    monkeypatch.setattr(a2c, "a2c_loss", loss_then_sigint)
    assert main(_run_args(interrupted, 6)) == 0
    monkeypatch.setattr(a2c, "a2c_loss", real_loss)
    out = capsys.readouterr().out
    assert f"stopped at env step {4 * STEPS:,} (episode 4)" in out
    assert read_checkpoint(find_checkpoint_file(interrupted))["step"] == 4 * STEPS

    assert main(_run_args(interrupted, 6)) == 0  # the same command resumes
    assert "resuming" in capsys.readouterr().out
    a = read_checkpoint(find_checkpoint_file(straight))
    b = read_checkpoint(find_checkpoint_file(interrupted))
    assert a["step"] == b["step"] == 6 * STEPS
    for k, v in a["state"]["model"].items():  # identical training trajectory
        assert torch.equal(v, b["state"]["model"][k]), k
    keep = [c for c in train.CSV_COLUMNS if c not in ("wall_minutes", "episodes_per_s")]
    ra, rb = _rows(straight), _rows(interrupted)
    assert [r["episode"] for r in rb] == ["0", "2", "4", "6"]
    assert [[r[c] for c in keep] for r in ra] == [[r[c] for c in keep] for r in rb]
    assert rb[-1]["test_reward_greedy"] != "" and rb[-1]["test_reward_sampled"] != ""

    # a finished run re-run with more episodes continues from 6
    assert main(_run_args(interrupted, 8)) == 0
    assert f"at env step {6 * STEPS:,} (episode 6" in capsys.readouterr().out
    assert _rows(interrupted)[-1]["episode"] == "8"


def test_resume_refuses_a_different_agent(tmp_path, capsys):
    assert main(_run_args(tmp_path, 2)) == 0
    args = _run_args(tmp_path, 4)
    args[args.index("core_config.memory_size=8")] = "core_config.memory_size=4"
    assert main(args) == 2
    assert "does not match this run: core_config.memory_size" in capsys.readouterr().err


def test_two_trainers_never_share_a_run_directory(tmp_path, capsys):
    held = lock_run_dir(tmp_path)
    try:
        assert main(_run_args(tmp_path, 2)) == 2
        assert f"is in use by pid {os.getpid()}" in capsys.readouterr().err
    finally:
        held.close()
    assert main(_run_args(tmp_path, 2)) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--core", "lstn"], "unknown core 'lstn'; did you mean 'lstm'"),
        (["--core", "fwm", "--set", "hiden_size=4"], "hiden_size"),
        (
            ["--core", "fwm", "--set", "hidden_size=4"],  # the old bare spelling names the new one
            "--set 'hidden_size=4': unknown key 'hidden_size'; core options are set as --set core_config.hidden_size=4",
        ),
        (["--core", "lstm", "--preset", str(AGENTS_DIR / "meta_rl_fwm.toml")], "contradicts preset"),
        (["--total-steps", "0"], "--total-steps 0 is invalid"),
        (["--preset", "agents/nope.toml"], "does not exist"),
        (["--discount", "2"], "--discount 2 is invalid; allowed: a number in [0, 1]"),
        (["--learning-rate", "nan"], "--learning-rate nan is invalid; allowed: a number > 0"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, capsys, args, message):
    assert main(["meta-rl", *args, "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_preset_and_core_flags_pick_the_papers_fwm(tmp_path):
    core, config, label = train.resolve_agent(None, str(AGENTS_DIR / "meta_rl_lstm512.toml"), [])
    assert (core, config, label) == ("lstm", {"hidden_size": 512, "num_layers": 1}, "lstm512")
    assert train.resolve_agent("fwm", None, []) == (
        "fwm",
        {"hidden_size": 32, "memory_size": 16, "num_reads": 3},
        "fwm",
    )
    assert train.resolve_agent(None, None, ["core_config.num_reads=2"])[1]["num_reads"] == 2
    assert train.resolve_agent("lstm", None, ["core_config.hidden_size=8"])[1] == {"hidden_size": 8}


# ------------------------------------------------------------------------------- results


def test_plot_summarises_runs_at_equal_episodes(tmp_path):
    from rfwp_rl.meta_rl import plot

    def write_run(name, tests, minutes_per_eval):
        d = tmp_path / name
        d.mkdir()
        lines = ["episode,wall_minutes,train_reward,test_reward_sampled,test_reward_greedy"]
        for i, t in enumerate(tests, 1):
            lines.append(f"{100 * i},{minutes_per_eval * i},{t},{t},")
        (d / "metrics.csv").write_text("\n".join(lines) + "\n")
        (d / "config.json").write_text(f'{{"label": "{name}", "seed": 1}}')
        return d

    fast = write_run("fwm", [50, 60, 80, 90, 95, 100, 100, 100, 100, 100, 110], 1.0)
    slow = write_run("lstm512", [50, 50, 52, 54, 56], 4.0)
    assert plot.main([str(fast), str(slow), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "summary.csv") as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    fwm, lstm = rows["fwm (s1)"], rows["lstm512 (s1)"]
    # running mean of 5 evaluations: 85 at episode 600, (80+90+95+100+100)/5 = 93 at 700
    assert float(fwm["episodes_to_test_90"]) == 700 and float(fwm["minutes_to_test_90"]) == 7.0
    assert float(fwm["episodes_to_test_100"]) == 1000  # (100 x 5) at 1000
    assert float(fwm["common_episode"]) == float(lstm["common_episode"]) == 500
    assert float(fwm["test_at_common_episode"]) == pytest.approx((50 + 60 + 80 + 90 + 95) / 5)
    assert float(lstm["test_at_common_episode"]) == pytest.approx((50 + 50 + 52 + 54 + 56) / 5)
    assert lstm["episodes_to_test_90"] == "" and float(fwm["test_reward_last"]) == pytest.approx(102)
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000


def test_bench_meta_rl_writes_a_row_per_case(tmp_path, capsys):
    from rfwp_rl.meta_rl import bench

    out = tmp_path / "update_time.csv"
    assert (
        main(
            [
                "bench",
                "meta_rl",
                "--cases",
                "fwm (fused),fwm (fused) no replay",
                "--batch-size",
                "4",
                "--updates",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(out.open()))
    assert [r["case"] for r in rows] == ["fwm (fused)", "fwm (fused) no replay"]
    assert all(float(r["cpu_seconds_per_update"]) > 0 and r["batch_size"] == "4" for r in rows)
    assert "replaying the acting steps" in capsys.readouterr().out
    assert main(["bench", "meta_rl", "--cases", "fwm (fast)", "--out", str(out)]) == 2
    assert "unknown case 'fwm (fast)'" in capsys.readouterr().err
    assert bench.CASES["fwm (fused)"][2] and not bench.CASES["fwm (fused) no replay"][2]
