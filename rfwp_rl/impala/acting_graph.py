"""The actors' model step on a GPU as one CUDA graph: one replay instead of a launch per kernel.

An acting step of an env batch runs a hundred or so small kernels (the torso's convolutions, the core's step,
the heads, the sampling); on a GPU their launches, not their work, take the time (``results/atari/README.md``).
:class:`ActingGraph` captures the step of one batch size once and replays it. Inputs are copied into the graph's
own buffers and what the caller keeps is cloned out, so one graph serves every env batch of that size. The replay
reads the parameters where they are: the actors' copy of the model must change in place only, as
``load_state_dict`` does. Sampling draws from torch's CUDA generator, which advances at every replay.
:func:`capture_acting` checks a replay against the eager step on the same inputs before it is used.
"""

from __future__ import annotations

from typing import Any

import torch

from rfwp_rl.envs.spaces import obs_keys, pick_obs
from rfwp_rl.perf import autocast

WARMUP_STEPS = 3  # eager steps on a side stream before capture, as CUDA graphs need (allocator, kernel choice)
TOLERANCE = 1e-4  # relative difference between a replay and the eager step that the check accepts


class ActingGraph:
    """One captured acting step of ``agent`` for ``batch_size`` envs on ``device`` (a CUDA device).

    ``graph(obs, reward, done, state, prev_action)`` takes what :meth:`rfwp_rl.impala.actors.Actors.act` takes
    (``obs``: ``{key: [b, ...]}`` by :func:`rfwp_rl.envs.spaces.obs_keys`, ``reward``/``done`` ``[b]``,
    ``prev_action [b, ...]``, ``state`` the core state) and returns the same: outputs ``[1, b, ...]`` and the
    new core state, every tensor the caller's own. ``layout``: the rollout's
    (:func:`rfwp_rl.impala.actors.rollout_spec`), which gives the inputs' dtypes and shapes."""

    def __init__(
        self, agent: torch.nn.Module, layout: dict, batch_size: int, device: torch.device, precision: str = "fp32"
    ):
        self.agent, self.device, self.precision = agent, torch.device(device), precision
        spec = layout
        self.keys = obs_keys(agent.obs_space)
        with torch.inference_mode():
            self.obs = {k: torch.zeros(1, batch_size, *spec[k][1], dtype=spec[k][0], device=device) for k in self.keys}
            self.reward = torch.zeros(1, batch_size, device=device)
            self.done = torch.zeros(1, batch_size, dtype=torch.bool, device=device)
            dtype, shape = spec["prev_action"]
            self.prev_action = torch.zeros(1, batch_size, *shape, dtype=dtype, device=device)
            self.state = tuple(s.clone() for s in agent.initial_state(batch_size, device=device))
        agent.eval()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out, self.new_state = self._step()

    def _step(self) -> tuple[dict[str, torch.Tensor], tuple]:
        # autocast's cache of cast weights would be baked into the graph: off while capturing (torch's CUDA graph notes)
        with torch.inference_mode(), autocast(self.device, self.precision, cache=False):
            return self.agent(pick_obs(self.obs), self.reward, self.done, self.state, prev_action=self.prev_action)

    def load(
        self,
        obs: dict[str, torch.Tensor],
        reward: torch.Tensor,
        done: torch.Tensor,
        state: tuple,
        prev_action: torch.Tensor,
    ) -> None:
        """Copy one step's inputs into the graph's buffers."""
        with torch.inference_mode():
            for k in self.keys:
                self.obs[k][0].copy_(obs[k], non_blocking=True)
            self.reward[0].copy_(reward, non_blocking=True)
            self.done[0].copy_(done, non_blocking=True)
            self.prev_action[0].copy_(prev_action, non_blocking=True)
            for mine, given in zip(self.state, state):
                mine.copy_(given, non_blocking=True)

    def __call__(
        self,
        obs: dict[str, torch.Tensor],
        reward: torch.Tensor,
        done: torch.Tensor,
        state: tuple,
        prev_action: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], tuple]:
        self.load(obs, reward, done, state, prev_action)
        self.agent.eval()
        self.graph.replay()
        with torch.inference_mode():  # the next replay overwrites the graph's outputs
            return {k: v.clone() for k, v in self.out.items()}, tuple(s.clone() for s in self.new_state)


def capture_acting(
    agent: torch.nn.Module, layout: dict, batch_size: int, device: torch.device, precision: str = "fp32"
) -> tuple[ActingGraph | None, str]:
    """An :class:`ActingGraph` and why (for the start-up line), or None and why not: acting not on a CUDA device,
    capture failed, or a replay differed from the eager step (outputs other than the sampled action, and the new
    state, on random inputs with some episode starts) by more than :data:`TOLERANCE`."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"acting on {device}"
    try:
        graph = ActingGraph(agent, layout, batch_size, device, precision)
        problem = _replay_differs(graph)
    except Exception as e:  # a model the graph cannot hold (host syncs, dynamic shapes): eager acting still works
        torch.cuda.synchronize(device)
        return None, f"capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if problem:
        return None, f"a replay differed from the eager step ({problem})"
    return graph, f"captured for {batch_size} envs, a replay equal to the eager step"


def _replay_differs(graph: ActingGraph) -> str:
    """What differs between a replay and the eager step on the same random inputs ('' if nothing)."""
    g = torch.Generator(device=graph.device).manual_seed(0)
    with torch.inference_mode():
        obs = {k: _random_like(v[0], g) for k, v in graph.obs.items()}
        B = graph.reward.shape[1]
        reward = torch.randn(B, device=graph.device, generator=g)
        done = torch.rand(B, device=graph.device, generator=g) < 0.5
        state = tuple(_random_like(s, g) for s in graph.state)
        prev_action = graph.prev_action[0].clone()
        for t in [*graph.out.values(), *graph.new_state]:  # a replay that wrote nothing must not pass
            if t.is_floating_point():
                t.fill_(float("nan"))
    out, new_state = graph(obs, reward, done, state, prev_action)
    graph.load(obs, reward, done, state, prev_action)
    ref, ref_state = graph._step()
    for key in ref:
        if key in ("action", "log_prob"):  # sampled: a replay draws other random numbers
            continue
        if not _close(out[key], ref[key]):
            return f"output {key!r}"
    for i, (a, b) in enumerate(zip(new_state, ref_state)):
        if not _close(a, b):
            return f"state[{i}]"
    if not graph.agent.action_dist.valid(out["action"][0].cpu()):
        return "an action outside the action space"
    return ""


def _random_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return torch.randint(0, 256, t.shape, dtype=t.dtype, device=t.device, generator=g)
    if t.dtype == torch.bool:
        return torch.rand(t.shape, device=t.device, generator=g) < 0.5
    if t.dtype.is_floating_point:
        return torch.randn(t.shape, dtype=t.dtype, device=t.device, generator=g)
    return torch.zeros_like(t)


def _close(a: Any, b: Any) -> bool:
    a, b = a.float(), b.float()
    return bool(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE * max(1.0, float(b.abs().max()))))
