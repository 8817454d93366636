"""IMPALA actors: batched environments, batched inference, rollouts of T+1 steps.

Environments run in ``moolib.EnvPool`` worker processes (``--env-backend moolib``, the
default) or in this process (``--env-backend local``: for debugging, profiling and machines
without moolib; same semantics, no overlap of env stepping with inference).

The N environments are split into ``num_batches`` batches (2 by default) that are stepped
alternately: while the workers step batch 0, this process runs the model on batch 1's
observations, and vice versa (double buffering, as in moolib's IMPALA example).

Per step, every environment reports (:class:`rfwp_rl.envs.pool.PoolEnv`) ``obs``, ``reward``
(received on arriving at it), ``done`` (it is the first observation of a new episode; the
pool reset the env after the episode ended) and ``episode_end``/``episode_return``/
``episode_step`` (on ``episode_end``: the statistics of the full episode that has just ended;
for Atari the full game, even with ``episodic_life``).

A rollout is T+1 consecutive steps of one batch; its first entry repeats the last entry of
the previous rollout, and it carries the core state from before its first entry. See
:mod:`rfwp_rl.impala.learner` for the meaning of each field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from rfwp_rl.errors import UserError

_moolib_pool_made = False  # moolib aborts the process if a second EnvPool forks
STEP_KEYS = ("obs", "reward", "done", "prev_action", "action", "policy_logits")


def import_moolib():
    """``moolib``, or a one-line UserError telling how to get it."""
    try:
        import moolib
    except ImportError as e:
        raise UserError(f"moolib is not installed ({e}); run 'bash scripts/setup.sh' to build it, "
                        "or pass --env-backend local to step the environments in this process") from None
    return moolib


class _Ready:
    """An already-computed result with the ``.result()`` of a moolib future."""

    def __init__(self, value: dict[str, torch.Tensor]):
        self.value = value

    def result(self) -> dict[str, torch.Tensor]:
        return self.value


class LocalEnvPool:
    """In-process stand-in for ``moolib.EnvPool`` with the same ``step(batch_index, action)``:
    the first call on a batch resets its envs (the action is ignored), an env whose episode
    ended is reset and reports ``done`` with the new episode's first observation. Steps
    synchronously (no overlap with inference). Env ``i`` is seeded with ``seed * 100_003 + i``,
    so runs with this backend are reproducible."""

    def __init__(self, env_id: str, env_options: dict, seed: int, batch_size: int, num_batches: int):
        from rfwp_rl.envs import make_env
        from rfwp_rl.envs.pool import PoolEnv

        def create(i: int) -> PoolEnv:
            return PoolEnv(make_env(env_id, seed=(seed * 100_003 + i) % 2 ** 31, **env_options))

        self.envs = [[create(b * batch_size + i) for i in range(batch_size)] for b in range(num_batches)]
        self.started = [False] * num_batches

    def step(self, batch_index: int, action: torch.Tensor) -> _Ready:
        envs = self.envs[batch_index]
        outs, rewards, dones = [], [], []
        for env, a in zip(envs, action.tolist()):
            if not self.started[batch_index]:
                obs, reward, done = env.reset(), 0.0, False
            else:
                obs, reward, done, _ = env.step(a)
                if done:
                    obs = env.reset()
            outs.append(obs)
            rewards.append(reward)
            dones.append(done)
        self.started[batch_index] = True
        result = {k: torch.from_numpy(np.stack([o[k] for o in outs])) for k in outs[0]}
        result["reward"] = torch.tensor(rewards, dtype=torch.float32)
        result["done"] = torch.tensor(dones, dtype=torch.bool)
        return _Ready(result)

    def close(self) -> None:
        for batch in self.envs:
            for env in batch:
                env.close()


def make_env_pool(backend: str, env_id: str, env_options: dict, seed: int, num_envs: int, num_batches: int,
                  num_processes: int):
    """An env pool of ``num_batches`` batches of ``num_envs // num_batches`` envs
    (``moolib.EnvPool`` or :class:`LocalEnvPool`). Create it before any moolib Rpc/Group and
    before other threads: moolib forks its worker processes here. moolib workers seed their
    envs from OS entropy (runs with moolib are not bit-reproducible anyway: worker timing
    decides which model version acts)."""
    if num_envs % num_batches:
        raise UserError(f"--num-actors {num_envs} must be a multiple of --num-env-batches {num_batches}")
    if not 1 <= num_batches <= 4:
        raise UserError(f"--num-env-batches {num_batches} is invalid; allowed: 1 to 4")
    batch_size = num_envs // num_batches
    if backend == "local":
        return LocalEnvPool(env_id, env_options, seed, batch_size, num_batches)
    global _moolib_pool_made
    if _moolib_pool_made:
        raise UserError("moolib allows one EnvPool per process (it forks its workers once and aborts a second "
                        "fork); run each training in its own process, reuse the pool, or use --env-backend local")
    moolib = import_moolib()
    from rfwp_rl.envs.pool import PoolEnvFactory

    _moolib_pool_made = True
    return moolib.EnvPool(PoolEnvFactory(env_id, **env_options), num_processes=min(num_processes, num_envs),
                          batch_size=batch_size, num_batches=num_batches)


@dataclasses.dataclass
class Rollout:
    """T+1 steps of b environments: ``data[key]`` is ``[T+1, b, ...]``, ``state`` the core state
    (tuple of ``[b, ...]``) before step 0."""

    data: dict[str, torch.Tensor]
    state: tuple


class ActorBatch:
    """One batch of environments: its pending step, core state and the rollout being filled."""

    def __init__(self, index: int, batch_size: int, agent: torch.nn.Module, unroll_length: int,
                 device: torch.device):
        self.index = index
        self.batch_size = batch_size
        self.unroll_length = unroll_length
        self.future = None
        self.action = torch.zeros(batch_size, dtype=torch.int64, device=device)  # ignored by the first (reset) step
        self.core_state = agent.initial_state(batch_size, device=device)
        self.rollout_state = self.core_state  # state before the rollout's first entry
        self.steps: list[dict[str, torch.Tensor]] = []


class Actors:
    """Drives the env batches with the current model and cuts rollouts.

    ``step()`` advances one batch by one env step and returns the rollouts completed by it
    and the statistics ``(return, length)`` of the episodes that ended.
    """

    def __init__(self, pool: Any, agent: torch.nn.Module, num_envs: int, num_batches: int, unroll_length: int,
                 device: torch.device | str = "cpu"):
        self.pool = pool
        self.agent = agent
        self.device = torch.device(device)
        self.batches = [ActorBatch(i, num_envs // num_batches, agent, unroll_length, self.device) for i in range(num_batches)]
        self.next_batch = 0
        self.env_steps = 0  # observations processed (all envs)

    def step(self) -> tuple[list[Rollout], list[tuple[float, int]]]:
        batch = self.batches[self.next_batch]
        self.next_batch = (self.next_batch + 1) % len(self.batches)
        if batch.future is None:
            batch.future = self.pool.step(batch.index, batch.action)
        env_out = batch.future.result()
        # The pool reuses its buffers once the batch is stepped again: copy what we keep.
        obs = env_out["obs"].to(self.device, copy=True)
        reward = env_out["reward"].to(self.device, torch.float32, copy=True)
        done = env_out["done"].to(self.device, torch.bool, copy=True)
        episodes = []
        if bool(env_out["episode_end"].any()):
            for i in torch.nonzero(env_out["episode_end"]).flatten().tolist():
                episodes.append((float(env_out["episode_return"][i]), int(env_out["episode_step"][i])))

        prev_action = batch.action
        state_before = batch.core_state
        self.agent.eval()
        with torch.no_grad():
            out, batch.core_state = self.agent(obs.unsqueeze(0), reward.unsqueeze(0), done.unsqueeze(0),
                                               state_before, prev_action=prev_action.unsqueeze(0))
        action = out["action"][0]
        batch.action = action
        batch.future = self.pool.step(batch.index, action.cpu())  # workers step while we go on
        self.env_steps += batch.batch_size

        batch.steps.append({"obs": obs, "reward": reward, "done": done, "prev_action": prev_action,
                            "action": action, "policy_logits": out["policy_logits"][0]})
        rollouts = []
        if len(batch.steps) == batch.unroll_length + 1:
            data = {k: torch.stack([s[k] for s in batch.steps]) for k in STEP_KEYS}
            rollouts.append(Rollout(data, batch.rollout_state))
            # The next rollout starts with this step again, from the state before it.
            batch.steps = [batch.steps[-1]]
            batch.rollout_state = state_before
        return rollouts, episodes


    def drain(self) -> None:
        """Wait for the pending env steps (so that another :class:`Actors` can use the pool)."""
        for batch in self.batches:
            if batch.future is not None:
                batch.future.result()
                batch.future = None


class RolloutQueue:
    """Collects rollouts of any batch size and hands out learner batches of exactly ``batch_size``
    (concatenated along the batch dimension; leftovers wait for the next batch)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.items: list[Rollout] = []
        self.size = 0

    def put(self, rollout: Rollout) -> None:
        self.items.append(rollout)
        self.size += next(iter(rollout.data.values())).shape[1]

    def ready(self) -> bool:
        return self.size >= self.batch_size

    def get(self) -> Rollout:
        data = {k: torch.cat([r.data[k] for r in self.items], dim=1) for k in STEP_KEYS}
        state = tuple(torch.cat(parts, dim=0) for parts in zip(*[r.state for r in self.items]))
        B = self.batch_size
        out = Rollout({k: v[:, :B] for k, v in data.items()}, tuple(s[:B] for s in state))
        self.items, self.size = [], 0
        if data["obs"].shape[1] > B:
            self.put(Rollout({k: v[:, B:] for k, v in data.items()}, tuple(s[B:] for s in state)))
        return out
