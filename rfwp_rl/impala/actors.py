"""IMPALA actors: batched inference on env batches, and rollouts of T+1 steps.

The N environments are split into ``num_batches`` batches (2 by default) that are stepped
alternately: while the env workers step batch 0, this process runs the model on batch 1's
observations, and vice versa (double buffering, as in moolib's IMPALA example). Stepping the
pool and watching over its processes is :mod:`rfwp_rl.impala.env_batches`'s job.

Per step, every environment reports (:class:`rfwp_rl.envs.pool_env.PoolEnv`) ``obs``, ``reward``
(received on arriving at it), ``done`` (it is the first observation of a new episode; the
pool reset the env after the episode ended) and ``episode_end``/``episode_return``/
``episode_step`` (on ``episode_end``: the statistics of the full episode that has just ended;
for Atari the full game, even with ``episodic_life``).

A rollout is T+1 consecutive steps of one batch; its first entry repeats the last entry of
the previous rollout, and it carries the core state from before its first entry. See
:mod:`rfwp_rl.impala.loss` for the meaning of each field.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import torch
from gymnasium import spaces

from rfwp_rl.envs.spaces import obs_keys, pick_obs, torch_dtype
from rfwp_rl.impala.acting_graph import capture_acting
from rfwp_rl.impala.env_batches import ENV_TIMEOUT, EnvBatches
from rfwp_rl.perf import Timers, autocast


def rollout_spec(obs_space: gymnasium.Space, action_dist: Any) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The layout of a rollout: ``{key: (dtype, trailing shape)}``, each tensor being ``[T+1, b, *shape]``.

    ``obs_space`` is the tensor observation space (:mod:`rfwp_rl.envs.spaces`), ``action_dist`` the
    agent's :class:`rfwp_rl.distributions.ActionDistribution`. Actions have the distribution's stored form
    (its ``valid`` checks their range); ``behaviour_log_prob`` is log mu(a_t|x_t) of the acting policy."""
    parts = obs_space.spaces if isinstance(obs_space, spaces.Dict) else {"": obs_space}
    spec = {
        key: (torch_dtype(space.dtype), tuple(int(d) for d in space.shape))
        for key, space in zip(obs_keys(obs_space), parts.values())
    }
    action = (action_dist.action_dtype, tuple(action_dist.action_shape))
    spec.update(
        {
            "reward": (torch.float32, ()),
            "done": (torch.bool, ()),
            "truncated": (torch.bool, ()),
            "prev_action": action,
            "action": action,
            "behaviour_log_prob": (torch.float32, ()),
        }
    )
    return spec


@dataclasses.dataclass
class Rollout:
    """T+1 steps of b environments: ``data[key]`` is ``[T+1, b, ...]``, ``state`` the core state
    (tuple of ``[b, ...]``) before step 0."""

    data: dict[str, torch.Tensor]
    state: tuple

    def to(self, device: torch.device) -> Rollout:
        """This rollout on ``device`` (itself if it is there already); from the CPU through page-locked memory."""
        if self.data["reward"].device == device:
            return self
        pin = device.type == "cuda" and self.data["reward"].device.type == "cpu"

        def move(t: torch.Tensor) -> torch.Tensor:
            return (t.pin_memory() if pin else t).to(device, non_blocking=pin)

        return Rollout({k: move(v) for k, v in self.data.items()}, tuple(move(s) for s in self.state))


class ActorBatch:
    """One batch of environments: its last action, core state and the rollout being filled."""

    def __init__(self, index: int, batch_size: int, agent: torch.nn.Module, unroll_length: int, device: torch.device):
        self.index = index
        self.batch_size = batch_size
        self.unroll_length = unroll_length
        dist = agent.action_dist
        self.action = torch.zeros(
            batch_size, *dist.action_shape, dtype=dist.action_dtype, device=device
        )  # ignored by the first (reset) step
        self.core_state = agent.initial_state(batch_size, device=device)
        self.rollout_state = self.core_state  # state before the rollout's first entry
        self.steps: list[dict[str, torch.Tensor]] = []
        self.pinned: dict[str, torch.Tensor] = {}  # CUDA: page-locked staging buffers of env outputs


class Actors:
    """Drives the env batches with the current model and cuts rollouts.

    ``step()`` advances one batch by one env step and returns the rollouts completed by it
    and the statistics ``(return, length)`` of the episodes that ended (nothing if
    ``should_stop()`` became true while waiting for the envs). Inference runs under
    ``torch.inference_mode`` (and bf16 autocast with ``precision="bf16"``); what a rollout keeps
    is copied out of inference mode, so the learner can backpropagate through it.

    ``acting_graph``: on a CUDA device, one acting step is a CUDA graph replay where it captures and replays
    equal to the eager step (:mod:`rfwp_rl.impala.acting_graph`; ``graph_note`` says which and why).

    Env faults (``max_env_failures``, ``env_timeout``, ``env_failures``): see
    :class:`rfwp_rl.impala.env_batches.EnvBatches`. ``timers`` collects the seconds spent waiting
    for env results (``env``), copying them to the actors' device (``copy``), in inference (``inference``) and
    handing the actions to the env workers (``send``).
    """

    def __init__(
        self,
        pool: Any,
        agent: torch.nn.Module,
        num_envs: int,
        num_batches: int,
        unroll_length: int,
        device: torch.device | str = "cpu",
        max_env_failures: int | None = None,
        env_failures: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
        env_timeout: float = ENV_TIMEOUT,
        precision: str = "fp32",
        timers: Timers | None = None,
        acting_graph: bool = False,
    ):
        self.envs = EnvBatches(
            pool, num_batches, num_envs // num_batches, max_env_failures, env_failures, should_stop, env_timeout
        )
        self.agent = agent
        self.action_dist = agent.action_dist
        self.obs_keys = obs_keys(agent.obs_space)
        self.device = torch.device(device)
        self.precision = precision
        self.timers = timers or Timers()
        self.batches = [
            ActorBatch(i, num_envs // num_batches, agent, unroll_length, self.device) for i in range(num_batches)
        ]
        self.next_batch = 0
        self.env_steps = 0  # observations processed (all envs)
        self.graph, self.graph_note = None, "off"
        if acting_graph and self.device.type == "cuda":
            layout = rollout_spec(agent.obs_space, agent.action_dist)
            self.graph, self.graph_note = capture_acting(agent, layout, num_envs // num_batches, self.device, precision)

    @property
    def env_failures(self) -> int:
        return self.envs.env_failures

    @env_failures.setter
    def env_failures(self, value: int) -> None:
        self.envs.env_failures = value

    @property
    def should_stop(self) -> Callable[[], bool]:
        return self.envs.should_stop

    @should_stop.setter
    def should_stop(self, value: Callable[[], bool]) -> None:
        self.envs.should_stop = value

    def step(self) -> tuple[list[Rollout], list[tuple[float, int]]]:
        batch = self.batches[self.next_batch]
        self.next_batch = (self.next_batch + 1) % len(self.batches)
        if self.envs.futures[batch.index] is None:
            with self.timers("send"):
                self.envs.send(batch.index, self.env_action(batch.action))
        with self.timers("env"):
            env_out = self.envs.receive(batch.index)
        if env_out is None:  # stop requested while waiting
            return [], []
        # The pool reuses its buffers once the batch is stepped again: copy what we keep.
        with self.timers("copy"):
            obs = {k: self._to_device(batch, k, env_out[k]) for k in self.obs_keys}
            reward = self._to_device(batch, "reward", env_out["reward"], torch.float32)
            done = self._to_device(batch, "done", env_out["done"], torch.bool)
            truncated = (
                self._to_device(batch, "truncated", env_out["truncated"], torch.bool)
                if "truncated" in env_out
                else torch.zeros_like(done)
            )
        episodes = []
        if bool(env_out["episode_end"].any()):
            for i in torch.nonzero(env_out["episode_end"]).flatten().tolist():
                episodes.append((float(env_out["episode_return"][i]), int(env_out["episode_step"][i])))

        prev_action = batch.action
        state_before = batch.core_state
        with self.timers("inference"):  # up to the actions on the CPU: a GPU's compute is waited for here
            if self.graph is not None:
                out, batch.core_state = self.graph(obs, reward, done, state_before, prev_action)
            else:
                out, batch.core_state = self.act(pick_obs(obs), reward, done, state_before, prev_action)
            action = out["action"][0]
            env_action = self.env_action(action)
        batch.action = action
        with self.timers("send"):
            self.envs.send(batch.index, env_action)  # workers step while we go on
        self.env_steps += batch.batch_size

        batch.steps.append(
            {
                **obs,
                "reward": reward,
                "done": done,
                "truncated": truncated,
                "prev_action": prev_action,
                "action": action,
                "behaviour_log_prob": out["log_prob"][0],
            }
        )
        return self._cut(batch, state_before), episodes

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The env's form of the agent's actions ``[b, ...]`` (on the CPU), e.g. clipped to a Box's bounds."""
        with torch.inference_mode():
            return self.action_dist.env_action(action).cpu()

    def act(
        self, obs: Any, reward: torch.Tensor, done: torch.Tensor, state: tuple, prev_action: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], tuple]:
        """One step of the model on one env batch: ``obs [b, ...]`` (or a dict of them), ``reward``/``done``
        ``[b]``, ``prev_action [b, ...]`` -> outputs ``[1, b, ...]`` and the new core state."""
        if self.agent.training:  # the learner may share the model; eval() walks every module, so only on a change
            self.agent.eval()
        obs = {k: v.unsqueeze(0) for k, v in obs.items()} if isinstance(obs, dict) else obs.unsqueeze(0)
        with torch.inference_mode(), autocast(self.device, self.precision):
            return self.agent(obs, reward.unsqueeze(0), done.unsqueeze(0), state, prev_action=prev_action.unsqueeze(0))

    def _to_device(
        self, batch: ActorBatch, key: str, value: torch.Tensor, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """A copy of an env output on the actors' device. CUDA: through a page-locked buffer and a
        non-blocking copy (the buffer is refilled only after this step's action came back to the
        CPU, which waits for the copy)."""
        if self.device.type != "cuda":
            return value.to(self.device, dtype, copy=True)
        pinned = batch.pinned.get(key)
        if pinned is None or pinned.shape != value.shape:
            pinned = batch.pinned[key] = torch.empty(value.shape, dtype=dtype or value.dtype, pin_memory=True)
        pinned.copy_(value)
        return pinned.to(self.device, non_blocking=True)

    @staticmethod
    def _cut(batch: ActorBatch, state_before: tuple) -> list[Rollout]:
        """The rollout completed by the step just appended, if any (stacked and copied out of
        inference mode)."""
        if len(batch.steps) < batch.unroll_length + 1:
            return []
        data = {k: torch.stack([s[k] for s in batch.steps]) for k in batch.steps[0]}
        rollout = Rollout(data, tuple(s.clone() for s in batch.rollout_state))
        # The next rollout starts with this step again, from the state before it.
        batch.steps = [batch.steps[-1]]
        batch.rollout_state = state_before
        return [rollout]

    def release(self) -> None:
        """See :meth:`rfwp_rl.impala.env_batches.EnvBatches.release`."""
        self.envs.release()

    def drain(self) -> None:
        """Wait for the pending env steps (so that another :class:`Actors` can use the pool)."""
        self.envs.drain()


def act_seconds(agent: torch.nn.Module, device: torch.device, batch_size: int, repeats: int = 8) -> float:
    """Seconds per acting step of ``agent`` on ``device`` for one env batch of ``batch_size``, counting the copy
    of the observations from the CPU and of the actions back (what :meth:`Actors.step` pays per step)."""
    spec = rollout_spec(agent.obs_space, agent.action_dist)
    obs = {k: torch.zeros(batch_size, *spec[k][1], dtype=spec[k][0]) for k in obs_keys(agent.obs_space)}
    dtype, shape = spec["action"]
    prev_action = torch.zeros(1, batch_size, *shape, dtype=dtype, device=device)
    reward, done = (
        torch.zeros(1, batch_size, device=device),
        torch.zeros(1, batch_size, dtype=torch.bool, device=device),
    )
    state = agent.initial_state(batch_size, device=device)
    agent.eval()
    times = []
    for _ in range(repeats + 2):  # the first two warm up (allocator, kernel selection)
        t0 = time.perf_counter()
        x = {k: v.to(device).unsqueeze(0) for k, v in obs.items()}
        with torch.inference_mode():
            out, state = agent(pick_obs(x), reward, done, state, prev_action=prev_action)
            out["action"].cpu()
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[len(times[2:]) // 2]


def choose_actor_device(
    requested: str, agent: torch.nn.Module, learner_device: torch.device, batch_size: int
) -> tuple[torch.device, str]:
    """Where the actors run the model, and why (for the start-up line). ``auto``: on the CPU when the learner
    is there; with a GPU learner, wherever one acting step of an env batch is faster, timed here on a CPU copy
    of ``agent`` (a small model acts faster on the CPU than through a GPU round trip; an image torso on a
    batch of frames, on the GPU)."""
    if requested != "auto":
        return torch.device(requested), f"--actor-device {requested}"
    if learner_device.type == "cpu":
        return learner_device, "the learner's device"
    on_gpu = act_seconds(agent, learner_device, batch_size)
    on_cpu = act_seconds(copy.deepcopy(agent).to("cpu"), torch.device("cpu"), batch_size)
    device = torch.device("cpu") if on_cpu < on_gpu else learner_device
    return device, (
        f"auto: one acting step of {batch_size} envs took {1e3 * on_cpu:.2f} ms on the CPU, "
        f"{1e3 * on_gpu:.2f} ms on {learner_device}"
    )


class RolloutQueue:
    """Collects rollouts of any batch size and hands out learner batches of exactly ``batch_size``
    (concatenated along the batch dimension; leftovers wait for the next batch)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.items: list[Rollout] = []
        self.size = 0

    def put(self, rollout: Rollout) -> None:
        self.items.append(rollout)
        self.size += rollout.data["reward"].shape[1]

    def ready(self) -> bool:
        return self.size >= self.batch_size

    def get(self) -> Rollout:
        data = {k: torch.cat([r.data[k] for r in self.items], dim=1) for k in self.items[0].data}
        state = tuple(torch.cat(parts, dim=0) for parts in zip(*[r.state for r in self.items]))
        B = self.batch_size
        out = Rollout({k: v[:, :B] for k, v in data.items()}, tuple(s[:B] for s in state))
        self.items, self.size = [], 0
        if data["reward"].shape[1] > B:
            self.put(Rollout({k: v[:, B:] for k, v in data.items()}, tuple(s[B:] for s in state)))
        return out
