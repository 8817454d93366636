"""What a saved agent's decisions draw on: ``rfwp-rl probe RUN --saliency K``.

For every scored step t of an episode and each lag k = 0..K: the norm of the gradient of log pi(a_t) (the
action the agent took) with respect to the torso's features of step t - k (the observation as the agent
encodes it), as a share of the sum of those norms over the lags (gradient saliency, Simonyan, Vedaldi &
Zisserman 2014, *Deep Inside Convolutional Networks*, Sec. 3, taken over time steps instead of pixels); the
same for the value estimate V(t) (through the baseline's own torso where the agent has one,
``separate_baseline``).

- Lag 0 is the present observation: a memoryless agent (``ff``) puts all of its decision there.
- A share at lag k > 0 is what the decision takes, through the core's memory, from what was seen k steps back;
  ``1 - share at lag 0`` is how much of the decision comes from memory at all.

Beside ``--span`` (what the memory holds, as a linear read-out recovers it) this says what the policy uses.
Each step's gradient is taken through the last K + 1 steps, from the core state recorded before them (held
fixed: the shares are of those K + 1 steps; earlier steps' influence, if any, is not counted). A step whose
gradients are all zero (a policy that no input moves) is left out. Episodes are scored as they end, so that
no more than one episode per env is held; from a long episode :data:`MAX_TARGETS` steps are scored, evenly
spaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rfwp_rl.envs.spaces import map_obs

MAX_TARGETS = 64  # scored steps per episode at most (each costs a forward and backward pass of K + 1 steps)


@dataclass
class _Step:
    """One played step of one env, as the agent saw it (``x`` an array or a dict of arrays) and what it did;
    ``state`` is the core state after the step."""

    x: Any
    reward: float
    done: bool
    prev_action: np.ndarray
    action: np.ndarray
    state: tuple[np.ndarray, ...]


class Saliency:
    """Fed by :func:`rfwp_rl.impala.evaluate.play`'s observer; :meth:`table` gives the shares by lag and
    :meth:`past_share_by_bin` the share drawn from memory by step of the episode (bins of ``bin_steps``)."""

    def __init__(self, agent: torch.nn.Module, max_lag: int, bin_steps: int):
        self.agent, self.max_lag, self.bin = agent, max_lag, bin_steps
        self.device = next(agent.parameters()).device
        self.current: dict[int, list[_Step]] = {}
        self.share_sums = np.zeros((max_lag + 1, 2))  # [lag, (policy, value)]
        self.share_counts = np.zeros((max_lag + 1, 2))
        self.bins: dict[int, np.ndarray] = {}  # bin -> [policy past, value past, policy count, value count]

    def __call__(self, envs: list[int], steps: list[int], inputs: dict, out: dict, state: tuple) -> None:
        x = map_obs(inputs["x"], lambda v: v[0].cpu().numpy())
        reward, done = inputs["reward"][0].cpu().numpy(), inputs["done"][0].cpu().numpy()
        prev, action = inputs["prev_action"][0].cpu().numpy(), out["action"][0].cpu().numpy()
        after = [s.cpu().numpy() for s in state]
        for j, (env, t) in enumerate(zip(envs, steps)):
            if t == 0 and self.current.get(env):  # the env's previous episode has ended
                self._score(self.current.pop(env))
            self.current.setdefault(env, []).append(
                _Step(
                    map_obs(x, lambda v, j=j: v[j].copy()),
                    float(reward[j]),
                    bool(done[j]),
                    prev[j].copy(),
                    action[j].copy(),
                    tuple(s[j].copy() for s in after),
                )
            )

    def _score(self, episode: list[_Step]) -> None:
        """Add the shares of an ended episode's scored steps (windows of one length batched together)."""
        n = len(episode)
        targets = range(n) if n <= MAX_TARGETS else np.unique(np.linspace(0, n - 1, MAX_TARGETS).round().astype(int))
        by_width: dict[int, list[int]] = {}
        for t in targets:
            by_width.setdefault(min(int(t), self.max_lag) + 1, []).append(int(t))
        for width, ts in by_width.items():
            shares = self._shares(episode, ts, width)  # [2, width, len(ts)]: lag w back at row width - 1 - w
            for kind in range(2):
                lags = shares[kind][::-1]  # row k: lag k
                scored = ~np.isnan(lags).any(0)
                self.share_sums[:width, kind] += lags[:, scored].sum(1)
                self.share_counts[:width, kind] += scored.sum()
                for t, past, ok in zip(ts, 1.0 - lags[0], scored):
                    if ok:
                        row = self.bins.setdefault(t // self.bin, np.zeros(4))
                        row[kind] += past
                        row[2 + kind] += 1

    def _shares(self, episode: list[_Step], ts: list[int], width: int) -> np.ndarray:
        """``[2 (policy, value), width, len(ts)]``: each lag's share of the gradient norm of log pi(a_t) and of
        V(t) for the steps ``ts``, each through its last ``width`` steps (row ``width - 1``: step t itself); NaN
        where the norms sum to zero or the output's gradient does not reach the torso's features."""
        windows = [episode[t - width + 1 : t + 1] for t in ts]
        d = self.device

        def stack(get: Any) -> torch.Tensor:
            return torch.from_numpy(np.stack([np.stack([get(s) for s in w]) for w in windows], axis=1)).to(d)

        first = windows[0][0].x
        x = {k: stack(lambda s, k=k: s.x[k]) for k in first} if isinstance(first, dict) else stack(lambda s: s.x)
        reward = stack(lambda s: np.float32(s.reward))
        done = stack(lambda s: s.done)
        prev = stack(lambda s: s.prev_action)
        action = torch.from_numpy(np.stack([w[-1].action for w in windows])[None]).to(d)  # [1, n, ...]
        # the state before each window: that after its step before, or any state where the window starts an
        # episode (done resets it)
        before = [episode[t - width].state if t - width >= 0 else episode[t].state for t in ts]
        state = tuple(torch.from_numpy(np.stack(parts)).to(d) for parts in zip(*before))

        # the torsos' outputs become leaves of the graph; the value reads its own torso where it has one
        torsos = [self.agent.torso, getattr(self.agent, "baseline_torso", None) or self.agent.torso]
        captured: dict[torch.nn.Module, torch.Tensor] = {}

        def leaf(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            captured[module] = output.detach().requires_grad_(True)
            return captured[module]

        hooks = [torso.register_forward_hook(leaf) for torso in set(torsos)]
        try:
            with torch.enable_grad():
                out, _ = self.agent(x, reward, done, state, prev_action=prev, greedy=True)
                log_prob = self.agent.action_dist.log_prob(out["policy_params"][-1:], action)
                grads = [
                    torch.autograd.grad(y.sum(), captured[torso], retain_graph=True, allow_unused=True)[0]
                    if y.requires_grad
                    else None  # an output no feature reaches
                    for y, torso in zip((log_prob, out["baseline"][-1]), torsos)
                ]
        finally:
            for hook in hooks:
                hook.remove()
        result = np.full((2, width, len(ts)), np.nan)
        for kind, grad in enumerate(grads):
            if grad is None:
                continue
            norms = grad.float().view(width, len(ts), -1).norm(dim=-1).cpu().numpy().astype(np.float64)
            total = norms.sum(0)
            result[kind][:, total > 0] = norms[:, total > 0] / total[total > 0]
        return result

    def finish(self) -> None:
        """Score the episodes still held (each env's last one)."""
        for env in list(self.current):
            self._score(self.current.pop(env))

    def table(self) -> list[dict]:
        """One row per lag 0..``max_lag``: ``lag``, ``steps`` (scored steps whose window reaches that lag),
        ``policy_share`` and ``value_share`` (mean shares; NaN where none was scored)."""
        self.finish()
        with np.errstate(invalid="ignore"):
            mean = self.share_sums / self.share_counts
        return [
            {
                "lag": k,
                "steps": int(self.share_counts[k, 0]),
                "policy_share": float(mean[k, 0]),
                "value_share": float(mean[k, 1]),
            }
            for k in range(self.max_lag + 1)
        ]

    def past_share_by_bin(self) -> dict[int, tuple[float, float]]:
        """``{bin: (policy, value)}``: the mean share the scored steps of that bin draw from lags above 0."""
        self.finish()
        return {
            b: tuple(float(row[k] / row[2 + k]) if row[2 + k] else float("nan") for k in range(2))
            for b, row in self.bins.items()
        }
