"""Settings of ``rfwp-rl meta-rl``: the FWM paper's meta-RL experiment (App. I).

A2C with Adam (learning rate 1e-3, epsilon 1e-4 as in the paper's code), discount 0.9, value
loss weight 0.1, entropy weight 0.03, no gradient clipping; a batch of 600 agents, agent b on
training graph b, each playing one 30-step episode per optimizer step; 60,000 such steps.
Every field is a flag of ``rfwp-rl meta-rl`` and a ``--set`` key (:mod:`rfwp_rl.flags`); the
budget and the evaluation interval count env steps (agents x steps), as ``rfwp-rl train``'s do.
"""

from __future__ import annotations

import dataclasses

from rfwp_rl.flags import ACTIONS, ENV_STEPS, SECONDS, setting
from rfwp_rl.meta_rl import graph_env

EVAL_ACTIONS = (*ACTIONS, "both")
TIME_LIMITS = ("terminate", "truncate")
# The paper's optimizer step: one episode of every training graph's agent.
PAPER_STEPS_PER_UPDATE = graph_env.NUM_TRAIN_GRAPHS * graph_env.EPISODE_STEPS


@dataclasses.dataclass
class MetaRLConfig:
    # training (FWM paper App. I)
    total_steps: int = setting(
        60_000 * PAPER_STEPS_PER_UPDATE,
        "each optimizer step takes one episode (--episode-steps) of every agent of the batch "
        "(the paper: 60,000 steps of 600 agents x 30)",
        unit=ENV_STEPS,
    )
    seed: int = setting(1, "of the model, the action sampling and the graph placement")
    batch_size: int | None = setting(
        None,
        "agents per optimizer step, one episode each (train's rollouts); "
        "default: the number of training graphs "
        "(agent b always on graph b, as the paper); otherwise graphs are drawn at "
        "random for each optimizer step",
    )
    learning_rate: float = setting(1e-3, "Adam's, constant")
    adam_eps: float = setting(1e-4, "the paper's code's")
    discount: float = setting(0.9)
    baseline_cost: float = setting(0.1, "of the mean squared advantage, without a factor 1/2, as the paper's code")
    entropy_cost: float = setting(0.03)
    grad_norm_clip: float = setting(0.0, "the paper: 0")
    # environment
    data_seed: int = setting(graph_env.DATA_SEED, "seed of the fixed train/test graph sets")
    train_graphs: int = setting(graph_env.NUM_TRAIN_GRAPHS, "training graphs")
    test_graphs: int = setting(graph_env.NUM_TEST_GRAPHS, "test graphs (never trained on)")
    episode_steps: int = setting(graph_env.EPISODE_STEPS, "env steps of an episode")
    goal_reward: float = setting(graph_env.GOAL_REWARD, "reward for reaching the goal")
    invalid_penalty: float = setting(graph_env.INVALID_PENALTY, "cost of an invalid action")
    timeout_steps: int = setting(graph_env.TIMEOUT_STEPS, "unsuccessful steps before agent and goal are re-placed")
    reward_sum_scale: float = setting(
        graph_env.REWARD_SUM_SCALE, "scale of the reward-so-far input (0: the paper's code, which fed 0)"
    )
    time_limit: str = setting(
        "terminate",
        "the end of an episode after --episode-steps: terminate (the paper: the "
        "agent observes the time, so it is a terminal state) or truncate (a time "
        "limit: A2C bootstraps from the value of the last observation)",
        choices=TIME_LIMITS,
    )
    # evaluation, logging
    eval_every: int = setting(
        100 * PAPER_STEPS_PER_UPDATE,
        "one episode on every test graph at the first optimizer step past each multiple, at the start and at the end",
        unit=ENV_STEPS,
    )
    eval_actions: str = setting(
        "sample",
        "how the test episodes' actions are chosen: greedy (the policy's argmax), sample (drawn from it: the paper), "
        "or both (each test twice)",
        choices=EVAL_ACTIONS,
    )
    log_every: float = setting(10.0, "TensorBoard gets every optimizer step's scalars", unit=SECONDS)
    checkpoint_every: float = setting(300.0, unit=SECONDS)
    torch_threads: int = setting(0, "0: torch's default")
    device: str = setting("cpu")
