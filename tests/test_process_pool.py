"""The ``process`` env backend against the in-process pool, which has the same semantics and seeds."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from rfwp_rl.envs import make_env
from rfwp_rl.envs.process_pool import ProcessEnvPool, _slices
from rfwp_rl.envs.spaces import zero_obs
from rfwp_rl.impala.env_batches import EnvBatches, EnvPoolBroken, make_env_pool

KEYS = ("obs", "reward", "done", "episode_return", "episode_step", "episode_end", "truncated", "env_error")


def _blank(env_id: str):
    env = make_env(env_id)
    try:
        return zero_obs(env.observation_space), env.action_space
    finally:
        env.close()


def _run(pool, num_batches: int, b: int, actions: list[torch.Tensor], steps: int) -> list[dict]:
    envs = EnvBatches(pool, num_batches, b)
    outs = []
    for t in range(steps):
        i = t % num_batches
        envs.send(i, actions[t])
        out = envs.receive(i)
        outs.append({k: out[k].clone() for k in KEYS if k in out})
    return outs


@pytest.mark.parametrize("env_id,workers", [("CartPole-v1", 2), ("CartPole-v1", 3), ("Pendulum-v1", 2)])
def test_process_pool_steps_like_the_local_pool(env_id, workers):
    blank, space = _blank(env_id)
    b, num_batches, steps = 4, 2, 120  # CartPole episodes end within the 60 steps of each batch
    g = torch.Generator().manual_seed(0)
    if space.shape:  # Box actions: rows of the action's shape
        low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
        actions = [low + (high - low) * torch.rand(b, *space.shape, generator=g) for _ in range(steps)]
        action_row = (tuple(space.shape), np.dtype(space.dtype))
    else:
        actions = [torch.randint(0, int(space.n), (b,), generator=g) for _ in range(steps)]
        action_row = None
    local = make_env_pool("local", env_id, {}, 5, b * num_batches, num_batches, 1, blank_obs=blank)
    process = make_env_pool(
        "process", env_id, {}, 5, b * num_batches, num_batches, workers, blank_obs=blank, action_row=action_row
    )
    try:
        expected = _run(local, num_batches, b, actions, steps)
        got = _run(process, num_batches, b, actions, steps)
    finally:
        local.close()
        process.close()
    assert any(bool(o["episode_end"].any()) for o in expected) or env_id == "Pendulum-v1"
    for t, (e, o) in enumerate(zip(expected, got)):
        for k in e:
            assert torch.equal(e[k], o[k]), f"step {t}, {k}"


def test_answers_for_the_other_batch_wait_until_asked_for():
    """The trainer sends batch 0's next step before it takes batch 1's result (double buffering)."""
    blank, _ = _blank("CartPole-v1")
    pool = ProcessEnvPool("CartPole-v1", {}, 1, batch_size=2, num_batches=2, num_processes=2, blank_obs=blank)
    try:
        zeros = torch.zeros(2, dtype=torch.long)
        first0, first1 = pool.step(0, zeros), pool.step(1, zeros)
        first0.result()
        second0 = pool.step(0, zeros)
        assert first1.result()["done"].shape == (2,)
        assert second0.result()["episode_step"].tolist() == [1, 1]
        with pytest.raises(RuntimeError, match="stepped again"):
            pool.step(1, zeros)
            pool.step(1, zeros)
    finally:
        pool.close()


def test_a_dead_worker_is_reported_and_close_ends_the_others():
    blank, _ = _blank("CartPole-v1")
    pool = ProcessEnvPool("CartPole-v1", {}, 1, batch_size=4, num_batches=2, num_processes=2, blank_obs=blank)
    envs = EnvBatches(pool, 2, 4, env_timeout=120.0)
    try:
        envs.send(0, torch.zeros(4, dtype=torch.long))
        envs.receive(0)
        victim = pool.workers[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=60.0)
        assert pool.processes.dead() is not None
        envs.send(0, torch.zeros(4, dtype=torch.long))
        with pytest.raises((EnvPoolBroken, RuntimeError)):
            envs.receive(0)
    finally:
        pool.close()
    deadline = time.monotonic() + 60.0
    while any(w.is_alive() for w in pool.workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in pool.workers)


def test_slices_cover_the_batch_once():
    for batch_size in (1, 5, 24):
        for workers in range(1, batch_size + 1):
            slices = _slices(batch_size, workers)
            covered = [i for a, b in slices for i in range(a, b)]
            assert covered == list(range(batch_size))
            assert max(b - a for a, b in slices) - min(b - a for a, b in slices) <= 1
