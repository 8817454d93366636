"""Several optimizer steps per batch (``epochs``): the batch's env steps count once, every epoch
is an update, and the trust region bounds the total move from the behaviour policy."""

import dataclasses

import pytest
import torch

from rfwp_rl import cli
from rfwp_rl.agent import Agent
from rfwp_rl.impala import learner
from rfwp_rl.impala.actors import Rollout
from rfwp_rl.impala.config import ImpalaConfig
from rfwp_rl.impala.trust_region import behaviour_kl

pytestmark = pytest.mark.usefixtures("one_thread")


def _rollout(agent: Agent, T: int = 6, B: int = 64) -> Rollout:
    """B columns of T+1 steps, actions drawn from the agent's policy, rewards favouring action 0."""
    torch.manual_seed(2)
    obs = torch.randn(T + 1, B, 3)
    with torch.no_grad():
        out, _ = agent(obs, torch.zeros(T + 1, B), torch.zeros(T + 1, B, dtype=torch.bool), ())
    logits = out["policy_params"]
    action = torch.distributions.Categorical(logits=logits).sample()
    data = {
        "obs": obs,
        "reward": (action == 0).float(),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T + 1, B, dtype=torch.long),
        "action": action,
        "behaviour_log_prob": torch.log_softmax(logits, -1).gather(-1, action[..., None])[..., 0],
    }
    return Rollout(data, ())


def _learn_one_batch(epochs: int, max_kl: float) -> tuple[learner.Learner, Rollout, Agent]:
    torch.manual_seed(0)
    agent = Agent((3,), 3, "ff")
    cfg = dataclasses.replace(
        ImpalaConfig(),
        batch_size=64,
        unroll_length=6,
        total_steps=10_000,
        optimizer="adam",
        learning_rate=3e-3,
        normalize_advantages=True,
        epochs=epochs,
        max_kl=max_kl,
    )
    lrn = learner.Learner(agent, cfg)
    batch = _rollout(agent)
    learner.Learning(lrn).submit(batch)
    return lrn, batch, agent


def test_env_steps_count_once_and_each_epoch_is_an_update():
    one, batch, _ = _learn_one_batch(epochs=1, max_kl=0.0)
    three, _, agent3 = _learn_one_batch(epochs=3, max_kl=0.0)
    assert one.counters == {"step": 384, "updates": 1}
    assert three.counters == {"step": 384, "updates": 3}
    # more epochs on the same batch move the policy further from the behaviour policy
    kl_one = float(behaviour_kl(one.agent, batch.data, ()))
    kl_three = float(behaviour_kl(agent3, batch.data, ()))
    assert kl_three > 2 * kl_one > 0


def test_the_trust_region_bounds_the_move_over_all_epochs():
    lrn, batch, agent = _learn_one_batch(epochs=8, max_kl=1e-3)
    assert lrn.counters["updates"] == 8
    assert float(behaviour_kl(agent, batch.data, ())) < 2e-3  # each epoch is shrunk against mu, not the last epoch


def test_training_with_epochs_counts_updates(tmp_path):
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
        "--epochs",
        "3",
        "--run-dir",
        str(tmp_path / "run"),
        "--log-every",
        "0",
    ]
    assert cli.main(argv) == 0
    ckpt = sorted((tmp_path / "run").glob("ckpt_*.pt"))[-1]
    counters = torch.load(ckpt, weights_only=True)["state"]["counters"]
    assert counters["updates"] == 3 * counters["step"] // 10


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--epochs", "0"], "--epochs 0 is invalid"),
        (["--epochs", "2", "--broker", "127.0.0.1:4431", "--group", "g"], "--epochs 2 needs one learner"),
    ],
)
def test_bad_epochs_get_one_line(tmp_path, capsys, argv, message):
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
