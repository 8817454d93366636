"""Time-limit truncation through the IMPALA data path: the pool shows the last observation of a
truncated episode as one extra step, the actors mark it, the learner masks it and bootstraps
from its value (the V-trace arithmetic itself is checked by hand in test_vtrace.py)."""

import math

import gymnasium
import numpy as np
import pytest
import torch

from rfwp_rl.agent import Agent
from rfwp_rl.impala.actors import Actors
from rfwp_rl.impala.env_batches import LocalEnvPool
from rfwp_rl.impala.loss import compute_loss, loss_config

COUNTER_ID = "rfwp_test/Counter-v0"


class Counter(gymnasium.Env):
    """obs = [steps so far], reward 1 per step; terminates after ``end_at`` steps (if given)."""

    observation_space = gymnasium.spaces.Box(0, 100, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, end_at: int | None = None):
        self.end_at = end_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([float(self.t)], np.float32), 1.0, self.end_at is not None and self.t >= self.end_at, False, {}


if COUNTER_ID not in gymnasium.registry:
    gymnasium.register(COUNTER_ID, entry_point=Counter)


def drive(pool: LocalEnvPool, steps: int) -> list[dict]:
    out = []
    for _ in range(steps):
        r = pool.step(0, torch.zeros(1, dtype=torch.int64)).result()
        out.append({k: v[0].item() if v[0].numel() == 1 else v[0] for k, v in r.items()})
    return out


def test_pool_shows_the_last_observation_of_a_truncated_episode():
    pool = LocalEnvPool(COUNTER_ID, {"max_episode_steps": 3}, seed=1, batch_size=1, num_batches=1)
    seen = drive(pool, 7)
    assert [s["obs"] for s in seen] == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0]
    assert [s["truncated"] for s in seen] == [False, False, False, True, False, False, False]
    assert [s["done"] for s in seen] == [False, False, False, False, True, False, False]
    # the extra step after the truncation gives no reward; the episode's statistics are the env's own
    assert [s["reward"] for s in seen] == [0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert [s["episode_end"] for s in seen] == [False, False, False, False, True, False, False]
    assert (seen[4]["episode_return"], seen[4]["episode_step"]) == (3.0, 3)
    pool.close()


def test_pool_terminations_are_unchanged():
    pool = LocalEnvPool(COUNTER_ID, {"end_at": 2, "max_episode_steps": 10}, seed=1, batch_size=1, num_batches=1)
    seen = drive(pool, 5)
    assert [s["obs"] for s in seen] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert [s["done"] for s in seen] == [False, False, True, False, True]
    assert not any(s["truncated"] for s in seen)
    pool.close()


def test_actor_rollouts_carry_truncation_and_the_learner_masks_it():
    torch.manual_seed(0)
    pool = LocalEnvPool(COUNTER_ID, {"max_episode_steps": 3}, seed=1, batch_size=2, num_batches=1)
    agent = Agent((1,), 2, "lstm", {"hidden_size": 8})
    actors = Actors(pool, agent, num_envs=2, num_batches=1, unroll_length=6)
    rollouts = []
    while not rollouts:
        rollouts, _ = actors.step()
    batch = rollouts[0]
    assert batch.data["truncated"][:, 0].tolist() == [False, False, False, True, False, False, False]
    assert batch.data["done"][:, 0].tolist() == [False, False, False, False, True, False, False]

    cfg = loss_config(discount=0.9)
    base, _ = compute_loss(agent, batch.data, batch.state, cfg)
    # the masked step's action never ran: the loss must not depend on it or on its behaviour log-prob
    changed = {k: v.clone() for k, v in batch.data.items()}
    changed["action"][3] = 1 - changed["action"][3]
    changed["behaviour_log_prob"][3] -= 5.0
    other, _ = compute_loss(agent, changed, batch.state, cfg)
    assert float(other.detach()) == pytest.approx(float(base.detach()), rel=1e-6)
    # while the same change on an executed step does change it
    changed = {k: v.clone() for k, v in batch.data.items()}
    changed["action"][2] = 1 - changed["action"][2]
    other, _ = compute_loss(agent, changed, batch.state, cfg)
    assert float(other.detach()) != pytest.approx(float(base.detach()), rel=1e-6)
    pool.close()


def test_normalized_advantages_do_not_scale_with_the_rewards():
    torch.manual_seed(0)
    T, B = 8, 4
    batch = {
        "obs": torch.randn(T + 1, B, 3),
        "reward": torch.randn(T + 1, B),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "truncated": torch.zeros(T + 1, B, dtype=torch.bool),
        "prev_action": torch.zeros(T + 1, B, dtype=torch.int64),
        "action": torch.randint(2, (T + 1, B)),
        "behaviour_log_prob": torch.full((T + 1, B), -math.log(2)),
    }
    agent = Agent((3,), 2, "lstm", {"hidden_size": 8})
    torch.nn.init.zeros_(agent.baseline.weight)  # V = 0: the advantages are the returns, linear in the rewards
    torch.nn.init.zeros_(agent.baseline.bias)
    reward_input = agent.torso.output_size  # the core also sees the (clipped) reward: hide it, so the policy is fixed

    def hide_reward(module, args):
        x = args[0].clone()
        x[..., reward_input] = 0.0
        return (x, *args[1:])

    agent.core.register_forward_pre_hook(hide_reward)
    state = agent.initial_state(B)

    def policy_loss(scale: float, normalize: bool) -> float:
        data = dict(batch, reward=batch["reward"] * scale)
        cfg = loss_config(reward_clip=0, normalize_advantages=normalize, baseline_cost=0, entropy_cost=0)
        return float(compute_loss(agent, data, state, cfg)[0].detach())

    assert policy_loss(100.0, False) == pytest.approx(100 * policy_loss(1.0, False), rel=1e-4)
    assert policy_loss(100.0, True) == pytest.approx(policy_loss(1.0, True), rel=1e-4)
    assert policy_loss(1.0, True) != pytest.approx(policy_loss(1.0, False), rel=1e-2)
