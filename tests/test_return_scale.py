"""Return normalisation (``normalize_returns``): the running scale, its effect on the loss, its
checkpoint, and that returns within [-1, 1] are left alone."""

import math

import pytest
import torch

from rfwp_rl.agent import Agent
from rfwp_rl.impala import learner
from rfwp_rl.impala.loss import ReturnScale, compute_loss, loss_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_scale_is_the_running_rms_of_returns_and_never_below_one():
    off = ReturnScale(enabled=False)
    off.update(1e6)
    assert off.value == 1.0
    scale = ReturnScale(enabled=True, rate=0.5)
    assert scale.value == 1.0  # nothing seen yet
    scale.update(400.0)
    assert scale.value == pytest.approx(20.0)  # the first batch sets it
    scale.update(100.0)
    assert scale.mean_square == pytest.approx(250.0) and scale.value == pytest.approx(math.sqrt(250.0))
    scale.update(float("nan"))  # a non-finite batch changes nothing
    assert scale.mean_square == pytest.approx(250.0)
    small = ReturnScale(enabled=True)
    small.update(0.25)  # returns of a +-1 task: RMS 0.5 < 1
    assert small.value == 1.0
    again = ReturnScale(enabled=True)
    again.load_state_dict(scale.state_dict())
    assert again.value == scale.value


def test_loss_with_a_return_scale_is_the_loss_of_scaled_rewards():
    torch.manual_seed(3)
    agent = Agent((3,), 2, "ff")
    T, B = 5, 3
    batch = {
        "obs": torch.randn(T + 1, B, 3),
        "reward": torch.randn(T + 1, B).sign() * (15 + 10 * torch.rand(T + 1, B)),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T + 1, B, dtype=torch.long),
        "action": torch.randint(2, (T + 1, B)),
        "behaviour_log_prob": torch.full((T + 1, B), -0.7),
    }
    cfg = loss_config(reward_clip=0.0)
    loss, stats = compute_loss(agent, batch, (), cfg, return_scale=10.0)
    scaled = dict(
        batch, reward=batch["reward"] / 10.0
    )  # |r| > 1 either way: the agent's clipped reward input is the same
    loss_ref, stats_ref = compute_loss(agent, scaled, (), cfg)
    assert float(loss.detach()) == pytest.approx(float(loss_ref.detach()), rel=1e-5)
    assert stats["loss/baseline"] == pytest.approx(stats_ref["loss/baseline"], rel=1e-5)
    # the mean square of the targets is reported in the rewards' own units
    assert stats["learner/return_ms"] == pytest.approx(100.0 * stats_ref["learner/return_ms"], rel=1e-5)
    assert stats["learner/return_scale"] == 10.0


def test_learner_checkpoint_keeps_the_scale():
    from rfwp_rl.impala.config import ImpalaConfig

    cfg = ImpalaConfig(env="CartPole-v1", normalize_returns=True, batch_size=2, unroll_length=3)
    first = learner.Learner(Agent((4,), 2, "ff"), cfg)
    first.return_scale.update(900.0)
    second = learner.Learner(Agent((4,), 2, "ff"), cfg)
    second.load_state_dict(first.state_dict())
    assert second.return_scale.value == pytest.approx(30.0)
