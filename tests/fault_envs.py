"""Test environments that fail in controlled ways (used by tests/test_fault_tolerance_envs.py).

Importing this module registers ``FaultCartPole-v0``: CartPole whose ``reset``/``step`` raise or
hang as its keyword arguments say (``rfwp-rl train --env fault_envs:FaultCartPole-v0
--env-option reset_fails=first``; the tests put this directory on PYTHONPATH). Counters are per
process (moolib workers inherit them from the trainer at fork; the trainer never resets this env
before forking, so they start at 0 in every worker).
"""

from __future__ import annotations

import os
import time

import gymnasium

FIRST_RESETS = {"n": 0}  # first resets of instances of this process (reset_fails="odd_first")
MADE = {"n": 0}  # instances made in this process (make_fails=True)


def reset_counters() -> None:
    FIRST_RESETS["n"] = MADE["n"] = 0


class FaultCartPole(gymnasium.Wrapper):
    """CartPole-v1 with injected faults.

    Args:
        reset_fails: "" (never), "odd_first" (the first reset of every other instance made in this
            process raises: the 1st, 3rd, ... instance to reset; their replacements work),
            "after_episode" (the first reset after an ended episode raises, in every instance),
            "always" (every reset raises).
        make_fails: the constructor raises, except for the first instance of the process (the
            trainer makes one to read the spaces; moolib workers inherit its count).
        hang_at: step number (per instance) at which ``step`` sleeps ``hang_seconds``; 0: never.
        hang_seconds: how long that step sleeps.
        hang_marker: if set, hang only if this file does not exist yet, and create it before
            hanging (a re-executed trainer then runs on).
    """

    def __init__(
        self,
        reset_fails: str = "",
        make_fails: bool = False,
        hang_at: int = 0,
        hang_seconds: float = 3600.0,
        hang_marker: str = "",
    ) -> None:
        MADE["n"] += 1
        if make_fails and MADE["n"] > 1:
            raise RuntimeError(f"injected construction failure #{MADE['n']}")
        super().__init__(gymnasium.make("CartPole-v1"))
        if reset_fails not in ("", "odd_first", "after_episode", "always"):
            raise ValueError(f"reset_fails={reset_fails!r}")
        self.reset_fails, self.hang_at, self.hang_seconds = reset_fails, int(hang_at), float(hang_seconds)
        self.hang_marker = str(hang_marker)
        self.resets = 0
        self.steps = 0

    def reset(self, **kwargs):
        self.resets += 1
        if self.reset_fails == "always":
            raise RuntimeError("injected reset failure (always)")
        if self.reset_fails == "odd_first" and self.resets == 1:
            FIRST_RESETS["n"] += 1
            if FIRST_RESETS["n"] % 2 == 1:
                raise RuntimeError(f"injected first-reset failure #{FIRST_RESETS['n']}")
        if self.reset_fails == "after_episode" and self.resets == 2:
            raise RuntimeError("injected reset failure after an episode")
        return self.env.reset(**kwargs)

    def step(self, action):
        self.steps += 1
        if self.hang_at and self.steps == self.hang_at:
            if not self.hang_marker or not os.path.exists(self.hang_marker):
                if self.hang_marker:
                    with open(self.hang_marker, "w") as f:
                        f.write(str(os.getpid()))
                time.sleep(self.hang_seconds)
        return self.env.step(action)


if "FaultCartPole-v0" not in gymnasium.registry:
    gymnasium.register("FaultCartPole-v0", entry_point=FaultCartPole)
