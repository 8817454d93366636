"""``rfwp-rl probe``: per-step entropy, value and state norms of a saved agent, binned by the step
index within the episode."""

import csv
import math

import pytest
import torch

from rfwp_rl import cli
from rfwp_rl.agent import Agent
from rfwp_rl.impala.probe import StepStats

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_stats_bin_by_step_within_the_episode():
    agent = Agent((3,), 2, "ff")
    stats = StepStats(agent, bin_steps=10)
    params = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [0.0, math.log(3.0)]]])  # [1, 3 envs, 2 logits]
    out = {"policy_params": params, "baseline": torch.tensor([[1.0, 3.0, 5.0]])}
    state = (torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]]),)  # norms 5, 0, 1
    stats([0, 1, 2], [0, 9, 12], {}, out, state)
    rows = stats.table()
    assert [(r["first_step"], r["last_step"], r["samples"]) for r in rows] == [(0, 9, 2), (10, 19, 1)]
    p = torch.tensor([0.25, 0.75])
    assert rows[0]["entropy"] == pytest.approx(math.log(2.0))
    assert rows[1]["entropy"] == pytest.approx(float(-(p * p.log()).sum()))
    assert (rows[0]["value"], rows[1]["value"]) == (pytest.approx(2.0), pytest.approx(5.0))
    assert (rows[0]["state0_norm"], rows[1]["state0_norm"]) == (pytest.approx(2.5), pytest.approx(1.0))


def test_shift_kl_is_the_kl_to_a_twin_moved_by_the_step_size():
    torch.manual_seed(0)
    n = 4000
    agent = Agent((3,), 3, "ff")
    stats = StepStats(agent, bin_steps=10, shift=0.05, num_envs=n, seed=1)
    for p, q in zip(agent.parameters(), stats.twin.parameters()):  # every parameter moved by +-0.05
        torch.testing.assert_close((q - p).abs(), torch.full_like(p, 0.05))
    inputs = {
        "x": torch.randn(1, n, 3),
        "reward": torch.zeros(1, n),
        "done": torch.ones(1, n, dtype=torch.bool),
        "prev_action": torch.zeros(1, n, dtype=torch.long),
    }
    with torch.no_grad():
        out, state = agent(
            inputs["x"], inputs["reward"], inputs["done"], agent.initial_state(n), prev_action=inputs["prev_action"]
        )
        twin_out, _ = stats.twin(
            inputs["x"], inputs["reward"], inputs["done"], agent.initial_state(n), prev_action=inputs["prev_action"]
        )
    exact = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=out["policy_params"][0]),
        torch.distributions.Categorical(logits=twin_out["policy_params"][0]),
    )
    stats(list(range(n)), [0] * n, inputs, out, state)
    row = stats.table()[0]
    assert list(row)[:6] == ["first_step", "last_step", "samples", "entropy", "value", "shift_kl"]
    assert float(exact.mean()) > 1e-4
    assert row["shift_kl"] == pytest.approx(float(exact.mean()), rel=0.1)  # a sampled estimate of it


def test_probe_a_trained_run_counts_every_played_step(tmp_path, capsys):
    from rfwp_rl.impala.probe import probe

    run = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--env",
                "CartPole-v1",
                "--core",
                "lstm",
                "--env-backend",
                "local",
                "--num-actors",
                "2",
                "--unroll-length",
                "5",
                "--batch-size",
                "2",
                "--total-steps",
                "40",
                "--run-dir",
                str(run),
                "--log-every",
                "0",
                "--set",
                "core_config.hidden_size=8",
            ]
        )
        == 0
    )
    record = probe(run, episodes=3, bin_steps=5, num_envs=2)
    assert len(record["lengths"]) == 3 and record["state_shapes"] == [[1, 8], [1, 8]]  # LSTM h, c: 1 layer x 8
    assert sum(r["samples"] for r in record["rows"]) == sum(record["lengths"])
    assert record["rows"][0]["samples"] == 3 * 5  # CartPole episodes last at least 8 steps: steps 0-4 of each
    assert all(0.0 <= r["entropy"] <= math.log(2.0) + 1e-6 and r["state0_norm"] >= 0.0 for r in record["rows"])
    out = tmp_path / "probe.csv"
    assert cli.main(["probe", str(run), "--episodes", "3", "--bin", "5", "--num-actors", "2", "--out", str(out)]) == 0
    assert "3 episodes (sample)" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["first_step", "last_step", "samples", "entropy", "value", "state0_norm", "state1_norm"]
    assert sum(int(r["samples"]) for r in rows) == sum(record["lengths"])  # same seeds: the same episodes
    small, large = (
        probe(run, episodes=3, bin_steps=100, num_envs=2, shift=s)["rows"][0]["shift_kl"] for s in (1e-4, 1e-2)
    )
    assert 0.0 <= small < large


def test_probe_refuses_bad_counts(tmp_path, capsys):
    assert cli.main(["probe", str(tmp_path), "--episodes", "0"]) == 2
    assert "--episodes 0" in capsys.readouterr().err
    assert cli.main(["probe", str(tmp_path), "--shift", "-1"]) == 2
    assert "--shift -1" in capsys.readouterr().err
