"""Acting on a GPU: one acting step of the Atari agents asks the device nothing (a host synchronisation in the
actors' inner loop would stop the CPU from queueing the next kernels while the GPU works), and its CUDA graph
replays the eager step, with the parameters as they are at each replay; the learner's loss statistics come to
the host in one copy; the recall of a grid's symbols gives the CPU's loss. Skipped without a CUDA device;
``scripts/gpu_atari.sh`` runs it first."""

from __future__ import annotations

import argparse

import pytest
import torch

from rfwp_rl.bench import impala as bench_impala
from rfwp_rl.envs.spaces import obs_keys, pick_obs
from rfwp_rl.impala.acting_graph import _replay_differs, capture_acting
from rfwp_rl.impala.actors import rollout_spec
from rfwp_rl.impala.loss import host_floats

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"),
]


CORES = ["lstm", "gru", "ff", "lt", "delta", "delta_rnn", "rdn"]


def _agent(core: str, device: torch.device) -> torch.nn.Module:
    return bench_impala._run_spec(core, argparse.Namespace(env="Pong", overrides=[])).build_agent(device).eval()


@pytest.mark.parametrize("core", CORES)
def test_an_acting_step_makes_no_host_sync(core):
    device, B = torch.device("cuda"), 8
    agent = _agent(core, device)
    spec = rollout_spec(agent.obs_space, agent.action_dist)
    obs = {
        k: torch.randint(0, 256, (1, B, *spec[k][1]), dtype=spec[k][0], device=device)
        for k in obs_keys(agent.obs_space)
    }
    reward = torch.zeros(1, B, device=device)
    done = torch.tensor([[True, False] * (B // 2)], device=device)  # some entries start an episode
    prev_action = torch.zeros(1, B, dtype=torch.int64, device=device)
    state = agent.initial_state(B, device=device)
    with torch.inference_mode():
        agent(pick_obs(obs), reward, done, state, prev_action=prev_action)  # warm up: kernel selection, allocator
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out, state = agent(pick_obs(obs), reward, done, state, prev_action=prev_action)
            out, state = agent(pick_obs(obs), reward, torch.zeros_like(done), state, prev_action=out["action"])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert out["action"].shape == (1, B)


@pytest.mark.parametrize("core", CORES)
def test_the_acting_graph_replays_the_eager_step_with_the_parameters_of_now(core):
    device, B = torch.device("cuda"), 8
    agent = _agent(core, device)
    graph, why = capture_acting(agent, rollout_spec(agent.obs_space, agent.action_dist), B, device)
    assert graph is not None, why
    # the learner's updates reach the actors' copy in place, through load_state_dict
    agent.load_state_dict({k: v * 1.5 if v.is_floating_point() else v for k, v in agent.state_dict().items()})
    assert _replay_differs(graph) == ""


def test_the_loss_statistics_come_to_the_host_in_one_copy():
    x = torch.arange(4.0, device="cuda")
    named = {"a": x.sum(), "b": x.mean(), "c": torch.ones(()), "d": 0.5, "e": (x > 1).sum()}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning, match="synchroniz") as caught:
            host = host_floats(named)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1
    assert host == {"a": 6.0, "b": 1.5, "c": 1.0, "d": 0.5, "e": 2.0}


def test_the_symbols_recall_on_the_gpu_equals_the_cpus():
    from rfwp_rl.recall import RecallHead, symbol_recall_sum

    torch.manual_seed(0)
    head = RecallHead(6, 1, 4, hidden_size=8, grids=[(3, 2)])  # 3 cells x 2 channels
    symbols = torch.randint(0, 11, (5, 6))
    core_out, lag = torch.randn(5, 6), torch.randint(1, 5, (5,))
    losses = []
    for device in ("cpu", "cuda"):
        on = RecallHead(6, 1, 4, hidden_size=8, grids=[(3, 2)]).to(device)
        on.load_state_dict(head.state_dict())
        on.see(symbols.to(device))
        losses.append(symbol_recall_sum(on, core_out.to(device), lag.to(device), symbols.to(device)))
    torch.testing.assert_close(losses[1].cpu(), losses[0])
