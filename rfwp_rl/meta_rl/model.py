"""The meta-RL agent: observation -> any :mod:`rfwp_rl.cores` core -> policy and value heads.

As in the FWM paper's published agents, the 17-dim observation goes straight into the core
(no torso) and two linear heads read the core's output: ``Linear(out, 3)`` for the policy
logits and ``Linear(out, 1)`` for the value.

Acting needs one core step at a time (the next observation depends on the action);
:meth:`MetaRLAgent.stepper` returns an object with ``step(obs [B, obs_size]) -> (logits
[B, A], value [B])`` that carries the state from a zero start, built on the core's own
stepper (``core.stepper``, :mod:`rfwp_rl.cores.base`): made without gradients, the ``fwm``
core's is the fused op's incremental stepper. Training calls the agent on whole episodes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from rfwp_rl import cores


class MetaRLAgent(nn.Module):
    """Policy/value network on a recurrent core.

    Args:
        core: core name (``rfwp_rl.cores.available()``).
        core_config: keyword options of ``rfwp_rl.cores.make``.
        obs_size: observation length (17 for the paper's graphs).
        num_actions: number of actions (3).
    """

    def __init__(self, core: str, core_config: dict[str, Any], obs_size: int, num_actions: int) -> None:
        super().__init__()
        self.core_name = core
        self.core = cores.make(core, obs_size, **core_config)
        self.policy = nn.Linear(self.core.output_size, num_actions)
        self.value = nn.Linear(self.core.output_size, 1)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> tuple:
        """The core's zero state for ``batch_size`` agents."""
        return self.core.initial_state(batch_size, device=device)

    def forward(
        self, obs: torch.Tensor, state: tuple, reset: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """``obs [T, B, obs_size]`` -> ``(logits [T, B, A], values [T, B], new state)``."""
        y, state = self.core(obs, state, reset)
        return self.policy(y), self.value(y).squeeze(-1), state

    def heads(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Core output ``[..., out]`` -> ``(logits [..., A], value [...])``."""
        return self.policy(y), self.value(y).squeeze(-1)

    def stepper(self, batch_size: int, device: torch.device | str | None = None, record: bool = False) -> AgentStepper:
        """A fresh one-step-at-a-time runner from the zero state (see module docstring);
        ``record``: see :meth:`rfwp_rl.cores.base.Core.stepper`."""
        return AgentStepper(self, self.core.stepper(batch_size, device, record=record))


class AgentStepper:
    """``step(obs [B, obs_size]) -> (logits [B, A], value [B])`` on top of a core stepper."""

    def __init__(self, agent: MetaRLAgent, core_stepper: Any) -> None:
        self.agent = agent
        self.core_stepper = core_stepper

    def step(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Advances the state by one step."""
        return self.agent.heads(self.core_stepper.step(obs))

    def replay(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(logits [T, B, A], values [T, B])`` of the steps taken, with gradients, from a
        recording core stepper; None without a record."""
        y = self.core_stepper.replay()
        return None if y is None else self.agent.heads(y)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable weights."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def parameter_table(agent: MetaRLAgent) -> list[tuple[str, int]]:
    """``[(parameter name, size)]`` of an agent, for the report of parameter counts."""
    return [(name, p.numel()) for name, p in agent.named_parameters() if p.requires_grad]
