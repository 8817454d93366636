"""Where the actors run, how many torch threads a trainer takes, and the learner taking rollouts from elsewhere."""

from __future__ import annotations

import argparse
import csv
import sys

import pytest
import torch

from rfwp_rl.bench import impala as bench_impala
from rfwp_rl.cli import main
from rfwp_rl.errors import UserError
from rfwp_rl.impala.acting_graph import capture_acting
from rfwp_rl.impala.actors import Rollout, act_seconds, choose_actor_device, rollout_spec
from rfwp_rl.impala.learner import Learner, Learning
from rfwp_rl.impala.train import config_from_args
from rfwp_rl.perf import choose_torch_threads


def _spec(env: str = "CartPole-v1", core: str = "lstm"):
    return bench_impala._run_spec(core, argparse.Namespace(env=env, overrides=[]))


def test_actors_stay_with_a_cpu_learner_unless_told():
    agent = _spec().build_agent()
    device, why = choose_actor_device("auto", agent, torch.device("cpu"), 8)
    assert device == torch.device("cpu") and "learner" in why
    device, why = choose_actor_device("cpu", agent, torch.device("cpu"), 8)
    assert device == torch.device("cpu") and why == "--actor-device cpu"


def test_act_seconds_times_one_step_of_an_env_batch():
    for env in ("CartPole-v1", "rfwp/DelayedRecall-easy-v0"):
        agent = _spec(env).build_agent()
        assert 0.0 < act_seconds(agent, torch.device("cpu"), 4, repeats=2) < 60.0


def test_a_gpu_learner_takes_one_thread_unless_told():
    assert choose_torch_threads(0, 16, heavy_model=True, gpu=True)[0] == 1
    assert choose_torch_threads(3, 16, heavy_model=True, gpu=True)[0] == 3
    assert choose_torch_threads(0, 0, heavy_model=False)[0] == 1


def test_rollout_to_its_own_device_is_itself_and_the_learner_moves_a_batch():
    data = {"reward": torch.zeros(3, 2)}
    rollout = Rollout(data, (torch.zeros(2, 4),))
    assert rollout.to(torch.device("cpu")) is rollout
    moved = rollout.to(torch.device("meta"))
    assert moved.data["reward"].device.type == "meta" and moved.state[0].device.type == "meta"
    assert rollout.data["reward"].device.type == "cpu"  # the original is left alone


def test_learning_keeps_an_acting_copy_only_where_it_needs_one():
    spec = _spec()
    ns = argparse.Namespace(env="CartPole-v1", total_steps=1000)
    cfg = config_from_args(ns, spec.kind, spec.memory_horizon, spec.max_episode_steps, spec.trainer_settings)
    learner = Learner(spec.build_agent(), cfg)
    shared = Learning(learner, group=None)
    assert shared.acting_agent is learner.agent and shared not in learner.followers
    threaded = Learning(learner, group=None, thread=True)
    try:
        assert threaded.acting_agent is not learner.agent and threaded in learner.followers
        with torch.no_grad():
            next(learner.agent.parameters()).add_(1.0)
        # the learner's parameters are read (on a GPU: waited for) before the actors' lock is taken
        held = []
        state_dict = learner.agent.state_dict
        learner.agent.state_dict = lambda: held.append(threaded.acting_lock.locked()) or state_dict()
        learner.publish()
        assert held == [False]
        for a, b in zip(threaded.acting_agent.parameters(), learner.agent.parameters()):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    finally:
        threaded.close()


def test_train_refuses_an_unknown_actor_device(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--env", "CartPole-v1", "--actor-device", "tpu", "--total-steps", "10"])
    assert stop.value.code == 2 and "invalid choice: 'tpu'" in capsys.readouterr().err


def test_train_refuses_cuda_actors_without_a_cuda_device(monkeypatch):
    from rfwp_rl.impala.config import ImpalaConfig
    from rfwp_rl.impala.train import check_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^--actor-device 'cuda': this torch build or machine has no CUDA device"):
        check_config(ImpalaConfig(actor_device="cuda"))
    check_config(ImpalaConfig(actor_device="cpu"))


def test_minatar_ids_register_on_demand_or_say_what_is_missing(monkeypatch):
    from rfwp_rl.envs import make_env, registry

    try:
        import minatar.gym  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="minatar"):
            registry.resolve_env_id("MinAtar/Breakout-v1")
        return
    env = make_env("MinAtar/Breakout-v1", seed=1)
    try:
        obs, _ = env.reset()
        assert obs.shape == (10, 10, 4) and env.action_space.n == 3
    finally:
        env.close()
    monkeypatch.setitem(sys.modules, "minatar.gym", None)  # as if it were not installed
    monkeypatch.delitem(registry.gymnasium.registry, "MinAtar/Asterix-v1", raising=False)
    with pytest.raises(UserError, match=r"pip install -e '\.\[minatar\]'"):
        registry.resolve_env_id("MinAtar/Asterix-v1")


def test_bench_impala_writes_both_bounds_per_agent_and_device(tmp_path):
    out = tmp_path / "bench.csv"
    code = main(
        [
            "bench",
            "impala",
            "--env",
            "CartPole-v1",
            "--cores",
            "lstm",
            "--devices",
            "cpu",
            "--env-backend",
            "process",
            "--num-actors",
            "8",
            "--num-env-processes",
            "2",
            "--batch-size",
            "4",
            "--unroll-length",
            "10",
            "--seconds",
            "0.5",
            "--warmup-seconds",
            "0",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["agent"], r["device"]) for r in rows] == [("lstm", "cpu")]
    for key in ("env_sps", "env_bound_sps", "learner_bound_sps", "ratio"):
        assert float(rows[0][key]) > 0
    bound = min(float(rows[0]["env_bound_sps"]), float(rows[0]["learner_bound_sps"]))
    assert float(rows[0]["ratio"]) == pytest.approx(float(rows[0]["env_sps"]) / bound, rel=1e-3)
    waiting = float(rows[0]["share_env_wait"])
    assert float(rows[0]["main_bound_sps"]) == pytest.approx(float(rows[0]["env_sps"]) / (1 - waiting), rel=1e-3)
    assert float(rows[0]["main_bound_sps"]) >= float(rows[0]["env_sps"])
    shares = [float(rows[0][f"share_{k}"]) for k in ("env_wait", "copy", "inference", "send", "learning", "other")]
    # the CSV keeps 6 significant digits of each share: their sum is 1 to within their rounding
    assert float(rows[0]["share_send"]) > 0 and sum(shares) == pytest.approx(1.0, abs=1e-5)


def test_no_acting_graph_off_a_gpu():
    agent = _spec().build_agent()
    graph, why = capture_acting(agent, rollout_spec(agent.obs_space, agent.action_dist), 4, torch.device("cpu"))
    assert graph is None and why == "acting on cpu"
