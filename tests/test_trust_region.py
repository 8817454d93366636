"""The trust-region step of the learner (``max_kl``): the KL estimate against a closed form, the
shrunk step against its bound, and the settings' errors."""

import math

import pytest
import torch

from rfwp_rl import cli
from rfwp_rl.agent import Agent
from rfwp_rl.impala.trust_region import behaviour_kl, limit_policy_change

pytestmark = pytest.mark.usefixtures("one_thread")


def _batch(agent: Agent, T: int = 6, B: int = 4, samples: int = 1) -> dict:
    """A batch of ``samples`` x B columns whose actions are drawn from the agent's own policy."""
    torch.manual_seed(2)
    obs = torch.randn(T + 1, B, 3).repeat(1, samples, 1)
    batch = {
        "obs": obs,
        "reward": torch.zeros(T + 1, B * samples),
        "done": torch.zeros(T + 1, B * samples, dtype=torch.bool),
        "prev_action": torch.zeros(T + 1, B * samples, dtype=torch.long),
    }
    with torch.no_grad():
        out, _ = agent(batch["obs"], batch["reward"], batch["done"], ())
    logits = out["policy_params"]
    batch["action"] = torch.distributions.Categorical(logits=logits).sample()
    batch["behaviour_log_prob"] = torch.log_softmax(logits, -1).gather(-1, batch["action"][..., None])[..., 0]
    return batch


def test_kl_is_zero_on_policy_and_matches_the_closed_form_after_a_change():
    torch.manual_seed(0)
    agent = Agent((3,), 3, "ff")
    batch = _batch(agent, samples=4000)
    assert float(behaviour_kl(agent, batch, ())) == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        out_mu, _ = agent(batch["obs"], batch["reward"], batch["done"], ())
        agent.policy.weight.add_(0.3 * torch.randn_like(agent.policy.weight))
        out_pi, _ = agent(batch["obs"], batch["reward"], batch["done"], ())
    mu = torch.distributions.Categorical(logits=out_mu["policy_params"][:-1])
    pi = torch.distributions.Categorical(logits=out_pi["policy_params"][:-1])
    exact = float(torch.distributions.kl_divergence(mu, pi).mean())
    estimate = float(behaviour_kl(agent, batch, ()))
    assert exact > 0.01
    assert estimate == pytest.approx(exact, rel=0.1)  # a sample estimate over 4000 x 4 x 6 actions


def test_a_large_step_is_shrunk_to_the_bound_and_a_small_one_kept():
    torch.manual_seed(0)
    agent = Agent((3,), 3, "ff")
    batch = _batch(agent, samples=50)
    before = [p.detach().clone() for p in agent.parameters()]
    with torch.no_grad():
        agent.policy.weight.add_(1.0 * torch.randn_like(agent.policy.weight))
    full = agent.policy.weight.detach().clone()
    old = before[[p is agent.policy.weight for p in agent.parameters()].index(True)]
    stats = limit_policy_change(agent, before, batch, (), max_kl=0.01)
    assert stats["learner/policy_kl"] > 0.05 and 0 < stats["learner/step_scale"] < 1
    after = float(behaviour_kl(agent, batch, ()))
    assert 0.004 < after < 0.02  # the quadratic model puts it near the bound
    # the shrunk step points the same way: the parameters lie on the segment from before to the full step
    torch.testing.assert_close(agent.policy.weight, old + stats["learner/step_scale"] * (full - old))
    moved = [p.detach().clone() for p in agent.parameters()]
    small = limit_policy_change(agent, moved, batch, (), max_kl=1.0)
    assert small["learner/step_scale"] == 1.0
    for p, q in zip(agent.parameters(), moved):
        assert torch.equal(p, q)


def test_a_non_finite_kl_undoes_the_step():
    torch.manual_seed(0)
    agent = Agent((3,), 2, "ff")
    batch = _batch(agent)
    before = [p.detach().clone() for p in agent.parameters()]
    with torch.no_grad():
        agent.policy.bias.fill_(float("inf"))
    stats = limit_policy_change(agent, before, batch, (), max_kl=0.01)
    assert not math.isfinite(stats["learner/policy_kl"]) and stats["learner/step_scale"] == 0.0
    for p, q in zip(agent.parameters(), before):
        assert torch.equal(p, q)


def test_training_with_the_trust_region_logs_it_and_stays_within_bounds(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    argv = [
        "train",
        "--env",
        "CartPole-v1",
        "--core",
        "ff",
        "--env-backend",
        "local",
        "--num-actors",
        "4",
        "--unroll-length",
        "5",
        "--batch-size",
        "2",
        "--total-steps",
        "200",
        "--max-kl",
        "1e-6",
        "--run-dir",
        str(tmp_path / "run"),
        "--log-every",
        "0",
    ]
    assert cli.main(argv) == 0
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    scales = [e.value for e in events.Scalars("learner/step_scale")]
    assert scales and all(0.0 <= s <= 1.0 for s in scales) and min(scales) < 1.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-kl", "-1"], "--max-kl -1 is invalid"),
        (["--max-kl", "0.01", "--broker", "127.0.0.1:4431", "--group", "g"], "--max-kl 0.01 needs one learner"),
    ],
)
def test_bad_trust_region_settings_get_one_line(tmp_path, capsys, argv, message):
    code = cli.main(
        [
            "train",
            "--env",
            "CartPole-v1",
            "--core",
            "ff",
            "--env-backend",
            "local",
            "--total-steps",
            "10",
            "--run-dir",
            str(tmp_path / "run"),
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err
