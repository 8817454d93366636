"""``rfwp-rl probe``: per-step entropy, value and state norms of a saved agent, binned by the step
index within the episode."""

import csv
import math

import gymnasium
import numpy as np
import pytest
import torch

from rfwp_rl import cli
from rfwp_rl.agent import Agent
from rfwp_rl.distributions import make_distribution
from rfwp_rl.impala import memory_span
from rfwp_rl.impala.memory_span import MemorySpan, ridge_r2
from rfwp_rl.impala.probe import StepStats
from rfwp_rl.impala.saliency import Saliency

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


def test_step_stats_of_a_gaussian_policy_whose_entropy_reads_a_parameter():
    agent = Agent((3,), gymnasium.spaces.Box(-1.0, 1.0, (2,)), "ff")
    stats = StepStats(agent, bin_steps=10, shift=1e-3, num_envs=2)
    inputs = {
        "x": torch.randn(1, 2, 3),
        "reward": torch.zeros(1, 2),
        "done": torch.ones(1, 2, dtype=torch.bool),
        "prev_action": torch.zeros(1, 2, 2),
    }
    with torch.inference_mode():
        out, state = agent(inputs["x"], inputs["reward"], inputs["done"], agent.initial_state(2))
    stats([0, 1], [0, 1], inputs, out, state)  # outside inference mode, as play calls it
    entropy = float(agent.action_dist.entropy(out["policy_params"][0]).detach()[0])
    assert stats.table()[0]["entropy"] == pytest.approx(entropy)


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
    # --span: one row per lag; the present features recover themselves at lag 0
    assert cli.main(["probe", str(run), "--episodes", "12", "--span", "3", "--out", str(out)]) == 0
    assert "how far back the memory reaches" in capsys.readouterr().out
    span = list(csv.DictReader((tmp_path / "probe_span.csv").open()))
    assert [r["lag"] for r in span] == ["0", "1", "2", "3"]
    assert list(span[0]) == ["lag", "pairs_fit", "pairs_scored", "r2_output", "r2_state", "r2_present"]
    assert float(span[0]["r2_present"]) > 0.99 and int(span[3]["pairs_fit"]) < int(span[0]["pairs_fit"])
    # --saliency: one row per lag; an LSTM's decisions draw on the present and on the steps before it
    assert cli.main(["probe", str(run), "--episodes", "4", "--saliency", "2", "--out", str(out)]) == 0
    assert "what the decisions draw on" in capsys.readouterr().out
    uses = list(csv.DictReader((tmp_path / "probe_saliency.csv").open()))
    assert list(uses[0]) == ["lag", "steps", "policy_share", "value_share"] and len(uses) == 3
    assert 0.0 < float(uses[0]["policy_share"]) < 1.0 and 0.0 < float(uses[1]["value_share"]) < 1.0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0])[-2:] == ["policy_past_share", "value_past_share"]
    assert all(0.0 < float(r["policy_past_share"]) < 1.0 for r in rows[1:])


def test_probe_refuses_bad_counts(tmp_path, capsys):
    assert cli.main(["probe", str(tmp_path), "--episodes", "0"]) == 2
    assert "--episodes 0" in capsys.readouterr().err
    assert cli.main(["probe", str(tmp_path), "--shift", "-1"]) == 2
    assert "--shift -1" in capsys.readouterr().err
    assert cli.main(["probe", str(tmp_path), "--span", "-2"]) == 2
    assert "--span -2 is invalid; allowed: an integer >= 0" in capsys.readouterr().err
    assert cli.main(["probe", str(tmp_path), "--span", "4", "--episodes", "1"]) == 2
    assert "--span needs --episodes 2 or more" in capsys.readouterr().err
    assert cli.main(["probe", str(tmp_path), "--saliency", "-1"]) == 2
    assert "--saliency -1 is invalid; allowed: an integer >= 0" in capsys.readouterr().err


def _feed(span: MemorySpan, episodes: int, length: int, width: int = 6, seed: int = 0) -> None:
    """Episodes of i.i.d. features, played by a hand-made agent whose output is the features of one step back
    and whose state holds those of two steps back (zeros before the episode's start)."""
    rng = np.random.default_rng(seed)
    for _ in range(episodes):
        feats = rng.standard_normal((length, width)).astype(np.float32)
        for t in range(length):
            back = [torch.from_numpy(feats[t - k]) if t >= k else torch.zeros(width) for k in (1, 2)]
            out = {"features": torch.from_numpy(feats[t])[None, None], "core_output": back[0][None, None]}
            span([0], [t], {}, out, (back[1][None],))


def test_memory_span_reads_what_the_core_holds_and_no_more(monkeypatch):
    span = MemorySpan(max_lag=3)
    _feed(span, episodes=40, length=12)
    rows = {r["lag"]: r for r in span.table()}
    assert rows[0]["pairs_fit"] == rows[0]["pairs_scored"] == 20 * 12 and rows[3]["pairs_fit"] == 20 * 9
    assert rows[0]["r2_present"] == pytest.approx(1.0, abs=1e-3)  # the present features recover themselves
    assert rows[1]["r2_output"] > 0.95 and rows[2]["r2_state"] > 0.95  # one step back in the output, two in the state
    for lag in (1, 2, 3):
        assert abs(rows[lag]["r2_present"]) < 0.1  # i.i.d. features: the present says nothing of the past
    assert abs(rows[2]["r2_output"]) < 0.1 and abs(rows[1]["r2_state"]) < 0.1 and abs(rows[3]["r2_state"]) < 0.1
    many = MemorySpan(max_lag=1)
    _feed(many, episodes=4, length=40)
    monkeypatch.setattr(memory_span, "MAX_PAIRS", 30)  # long episodes: at most this many pairs a side
    x, y = many.pairs(1, fit=True)["output"]
    assert len(x) == len(y) == 30 and np.array_equal(x, y) and many.table()[1]["r2_output"] > 0.95


def test_ridge_r2_on_exact_independent_and_too_few_pairs():
    rng = np.random.default_rng(1)
    x, noise = rng.standard_normal((400, 5)), rng.standard_normal((400, 3))
    y = x @ rng.standard_normal((5, 3))
    assert ridge_r2(x[:200], y[:200], x[200:], y[200:]) > 0.99
    assert abs(ridge_r2(x[:200], noise[:200], x[200:], noise[200:])) < 0.1
    assert math.isnan(ridge_r2(x[:10], y[:10], x[200:], y[200:]))  # fewer than MIN_PAIRS fitted
    wide = rng.standard_normal((120, 200))  # more input numbers than pairs, none of them informative
    assert -0.2 < ridge_r2(wide[:60], noise[:60], wide[60:], noise[60:120]) < 0.1  # the penalty grows, no overfit
    assert math.isnan(ridge_r2(x[:200, :0], y[:200], x[200:, :0], y[200:]))  # a core without state


class Lagged(torch.nn.Module):
    """A hand-made agent: its policy's logits at step t are the features of step t - 1 (constant at an
    episode's first step), its value the sum of the features of steps t and t - 2 (of t alone where there
    is no t - 2), so the policy draws everything from one step back and the value half from the present, half
    from two steps back (the gradient of a sum is a vector of ones for each step it reads)."""

    def __init__(self):
        super().__init__()
        self.torso = torch.nn.Linear(3, 3)
        self.action_dist = make_distribution(gymnasium.spaces.Discrete(3))

    def forward(self, x, reward, done, state, prev_action=None, greedy=False):
        T, B = reward.shape
        f = self.torso(x.reshape(T * B, -1)).view(T, B, -1)
        zeros = torch.zeros_like(f[:1])
        logits = torch.cat([zeros, f[:-1]]) if T > 1 else zeros
        value = f.sum(-1) + (torch.cat([zeros, zeros, f[:-2]]).sum(-1) if T > 2 else 0.0)
        return {"policy_params": logits, "baseline": value, "action": logits.argmax(-1)}, state


def _play_lagged(uses, episodes: int, length: int, seed: int = 0) -> None:
    """Feed ``uses`` episodes of random observations of a Lagged agent on 2 envs, the actions drawn at random."""
    rng = np.random.default_rng(seed)
    for _ in range(episodes):
        for t in range(length):
            inputs = {
                "x": torch.from_numpy(rng.standard_normal((1, 2, 3)).astype(np.float32)),
                "reward": torch.zeros(1, 2),
                "done": torch.full((1, 2), t == 0),
                "prev_action": torch.zeros(1, 2, dtype=torch.long),
            }
            out = {"action": torch.from_numpy(rng.integers(0, 3, (1, 2)))}
            uses([0, 1], [t, t], inputs, out, (torch.full((2, 1), float(t)),))


def test_saliency_finds_the_lags_each_output_reads():
    torch.manual_seed(0)
    uses = Saliency(Lagged(), max_lag=3, bin_steps=2)
    _play_lagged(uses, episodes=3, length=6)
    rows = {r["lag"]: r for r in uses.table()}
    # every step's window: 1 + min(t, 3) steps; the policy of step 0 reads no feature (left out)
    assert [rows[k]["steps"] for k in range(4)] == [2 * 3 * 5, 2 * 3 * 5, 2 * 3 * 4, 2 * 3 * 3]
    assert rows[0]["policy_share"] == pytest.approx(0.0) and rows[1]["policy_share"] == pytest.approx(1.0)
    assert rows[2]["policy_share"] == pytest.approx(0.0) and rows[3]["policy_share"] == pytest.approx(0.0)
    # the value: steps 0 and 1 read the present only; from step 2 on half the present and half lag 2
    assert rows[0]["value_share"] == pytest.approx((2 * 1.0 + 4 * 0.5) / 6)
    assert rows[2]["value_share"] == pytest.approx(0.5) and rows[1]["value_share"] == pytest.approx(0.0)
    past = uses.past_share_by_bin()  # bins of 2 steps: (policy, value) drawn from lags above 0
    assert past[0] == (pytest.approx(1.0), pytest.approx(0.0))  # step 0's policy is left out
    assert past[1] == past[2] == (pytest.approx(1.0), pytest.approx(0.5))


def test_saliency_scores_long_episodes_at_evenly_spaced_steps(monkeypatch):
    from rfwp_rl.impala import saliency

    monkeypatch.setattr(saliency, "MAX_TARGETS", 4)
    uses = Saliency(Lagged(), max_lag=1, bin_steps=100)
    _play_lagged(uses, episodes=2, length=10)
    assert uses.table()[1]["steps"] == 2 * 2 * 3  # steps 0, 3, 6, 9 of each episode; step 0 has no lag 1


def test_saliency_of_a_value_with_a_torso_of_its_own():
    torch.manual_seed(0)
    agent = Agent((3,), 3, "lstm", {"hidden_size": 8}, {"separate_baseline": True})
    uses = Saliency(agent, max_lag=2, bin_steps=2)
    state = agent.initial_state(2)
    for t in range(5):
        inputs = {
            "x": torch.randn(1, 2, 3),
            "reward": torch.zeros(1, 2),
            "done": torch.full((1, 2), t == 0),
            "prev_action": torch.zeros(1, 2, dtype=torch.long),
        }
        with torch.inference_mode():
            out, state = agent(inputs["x"], inputs["reward"], inputs["done"], state, prev_action=inputs["prev_action"])
        uses([0, 1], [t, t], inputs, out, state)
    rows = uses.table()
    assert [r["steps"] for r in rows] == [10, 8, 6]
    for kind in ("policy_share", "value_share"):
        assert 0.0 < rows[0][kind] < 1.0 and 0.0 < rows[2][kind] < 1.0  # an LSTM reads the present and the past
