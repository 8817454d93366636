"""The memory-task suite: tasks, levels, and the reference numbers of every registered id.

Ids are ``rfwp/<Task>-<level>-v0`` with ``level`` in ``easy``, ``medium``, ``hard``.
For each id, :data:`SUITE` holds

* ``random_return``: expected return of the uniformly random policy (exact; see each
  task's class docstring for the formula);
* ``optimal_return``: return of the policy that always takes the env's
  ``optimal_action()``, in every episode (exact);
* ``max_episode_steps``: the most steps an episode has (sequence tasks: always exactly that
  many; CueGrid: the step limit, where it is truncated);
* ``memory_horizon``: the most steps an item must be kept, i.e. the largest distance
  between the step that shows an item and a step whose action depends on it (an unroll
  must span ``memory_horizon + 1`` steps to see both ends);
* a one-line description.

Tests check every number against the envs (formula, scripted optimal policy, a random
policy over many episodes). This module imports nothing but gymnasium (in
:func:`register`), so registering the ids is cheap in any process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rfwp_rl.errors import UserError, check_choice

NAMESPACE = "rfwp"
LEVELS = ("easy", "medium", "hard")

#: task name -> "module:Class" (lazy gymnasium entry point)
ENTRY_POINTS: dict[str, str] = {
    "DelayedRecall": "rfwp_rl.memory.delayed_recall:DelayedRecall",
    "RepeatPrevious": "rfwp_rl.memory.repeat_previous:RepeatPrevious",
    "CountRecall": "rfwp_rl.memory.count_recall:CountRecall",
    "AssociativeRecall": "rfwp_rl.memory.associative_recall:AssociativeRecall",
    "AssociativeRecallReassign": "rfwp_rl.memory.associative_recall:AssociativeRecallReassign",
    "CueGrid": "rfwp_rl.memory.cue_grid:CueGrid",
}

#: task -> level -> parameters (any of them can be overridden by a keyword argument)
LEVEL_PARAMS: dict[str, dict[str, dict[str, Any]]] = {
    "DelayedRecall": {
        "easy": {"n_symbols": 4, "n_distractors": 4, "delay": 8},
        "medium": {"n_symbols": 8, "n_distractors": 8, "delay": 32},
        "hard": {"n_symbols": 16, "n_distractors": 16, "delay": 128},
    },
    "RepeatPrevious": {
        "easy": {"n_symbols": 4, "k": 2, "length": 16},
        "medium": {"n_symbols": 8, "k": 6, "length": 40},
        "hard": {"n_symbols": 16, "k": 24, "length": 96},
    },
    "CountRecall": {
        "easy": {"n_symbols": 4, "max_count": 3, "n_show": 10, "n_queries": 2},
        "medium": {"n_symbols": 6, "max_count": 5, "n_show": 30, "n_queries": 4},
        "hard": {"n_symbols": 10, "max_count": 8, "n_show": 80, "n_queries": 8},
    },
    "AssociativeRecall": {
        "easy": {"n_keys": 8, "n_values": 4, "n_pairs": 4, "n_queries": 4},
        "medium": {"n_keys": 32, "n_values": 8, "n_pairs": 16, "n_queries": 8},
        "hard": {"n_keys": 48, "n_values": 16, "n_pairs": 48, "n_queries": 16},
    },
    "AssociativeRecallReassign": {
        "easy": {"n_keys": 4, "n_values": 4, "n_pairs": 6, "n_reassign": 2, "n_queries": 3},
        "medium": {"n_keys": 8, "n_values": 8, "n_pairs": 12, "n_reassign": 4, "n_queries": 4},
        "hard": {"n_keys": 48, "n_values": 16, "n_pairs": 64, "n_reassign": 16, "n_queries": 16},
    },
    "CueGrid": {
        "easy": {"size": 5, "n_goals": 2, "max_steps": 20},
        "medium": {"size": 7, "n_goals": 4, "max_steps": 40},
        "hard": {"size": 11, "n_goals": 4, "max_steps": 80},
    },
    # control with hidden velocities (CONTROL below, not a sequence task of SUITE)
    "PositionOnlyCartPole": {
        "easy": {"max_steps": 200},
        "medium": {"max_steps": 400},
        "hard": {"max_steps": 600},
    },
}

DESCRIPTIONS: dict[str, str] = {
    "DelayedRecall": "a cue shown at the first step must be named after `delay` distractor steps",
    "RepeatPrevious": "every step from k on, name the symbol shown k steps earlier",
    "CountRecall": "after a stream of symbols, say how often each queried symbol was shown",
    "AssociativeRecall": "(key, value) pairs, then keys to answer with their value",
    "AssociativeRecallReassign": "associative recall where keys get new values; only the newest scores",
    "CueGrid": "walk to the corner goal that a cue shown at the first step pointed at",
}


@dataclass(frozen=True)
class SuiteEntry:
    """Reference numbers of one registered id (see the module docstring)."""

    env_id: str
    task: str
    level: str
    random_return: float
    optimal_return: float
    max_episode_steps: int
    memory_horizon: int
    description: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(LEVEL_PARAMS[self.task][self.level])


def env_id(task: str, level: str) -> str:
    """``rfwp/<task>-<level>-v0``."""
    return f"{NAMESPACE}/{task}-{level}-v0"


# (task, level, random_return, optimal_return, max_episode_steps, memory_horizon)
_NUMBERS: list[tuple[str, str, float, float, int, int]] = [
    # DelayedRecall: random 1/n_symbols, optimal 1, length delay + 2, horizon delay + 1
    ("DelayedRecall", "easy", 1 / 4, 1.0, 10, 9),
    ("DelayedRecall", "medium", 1 / 8, 1.0, 34, 33),
    ("DelayedRecall", "hard", 1 / 16, 1.0, 130, 129),
    # RepeatPrevious: random 1/n_symbols, optimal 1, length fixed, horizon k
    ("RepeatPrevious", "easy", 1 / 4, 1.0, 16, 2),
    ("RepeatPrevious", "medium", 1 / 8, 1.0, 40, 6),
    ("RepeatPrevious", "hard", 1 / 16, 1.0, 96, 24),
    # CountRecall: random 1/(max_count + 1), optimal 1, length n_show + n_queries, horizon length - 1
    ("CountRecall", "easy", 1 / 4, 1.0, 12, 11),
    ("CountRecall", "medium", 1 / 6, 1.0, 34, 33),
    ("CountRecall", "hard", 1 / 9, 1.0, 88, 87),
    # AssociativeRecall: random 1/n_values, optimal 1, length n_pairs + n_queries, horizon length - 1
    ("AssociativeRecall", "easy", 1 / 4, 1.0, 8, 7),
    ("AssociativeRecall", "medium", 1 / 8, 1.0, 24, 23),
    ("AssociativeRecall", "hard", 1 / 16, 1.0, 64, 63),
    # AssociativeRecallReassign: as AssociativeRecall
    ("AssociativeRecallReassign", "easy", 1 / 4, 1.0, 9, 8),
    ("AssociativeRecallReassign", "medium", 1 / 8, 1.0, 16, 15),
    ("AssociativeRecallReassign", "hard", 1 / 16, 1.0, 80, 79),
    # CueGrid: random 0 exactly (wrong goal -1/(n_goals-1)), optimal 1, step limit max_steps
    # (truncated there), horizon max_steps - 1
    ("CueGrid", "easy", 0.0, 1.0, 20, 19),
    ("CueGrid", "medium", 0.0, 1.0, 40, 39),
    ("CueGrid", "hard", 0.0, 1.0, 80, 79),
]

#: env id -> reference numbers, in task order (easy, medium, hard per task)
SUITE: dict[str, SuiteEntry] = {
    env_id(task, level): SuiteEntry(
        env_id(task, level), task, level, rnd, opt, steps, horizon, f"{task} ({level}): {DESCRIPTIONS[task]}"
    )
    for task, level, rnd, opt, steps, horizon in _NUMBERS
}


# Dense-reward control that needs a short memory (velocities from successive positions). Its
# random return has no closed form: the random policy's mean episode length, measured by playing it
# (results/memory/random_cartpole/), over the step limit. Optimal: balanced to the step limit.
CONTROL_ENTRY_POINTS: dict[str, str] = {
    "PositionOnlyCartPole": "rfwp_rl.memory.position_cartpole:PositionOnlyCartPole",
}
RANDOM_CARTPOLE_STEPS = 22.28
CONTROL: dict[str, SuiteEntry] = {
    env_id("PositionOnlyCartPole", level): SuiteEntry(
        env_id("PositionOnlyCartPole", level),
        "PositionOnlyCartPole",
        level,
        RANDOM_CARTPOLE_STEPS / steps,
        1.0,
        steps,
        1,
        f"PositionOnlyCartPole ({level}): CartPole with the velocities zeroed in the observation, "
        f"reward 1/{steps} a step (1.0 = balanced for {steps} steps)",
    )
    for level, steps in (("easy", 200), ("medium", 400), ("hard", 600))
}
#: every id with reference numbers (the memory suite, then the control tasks)
ALL: dict[str, SuiteEntry] = {**SUITE, **CONTROL}


def suite_ids(level: str | None = None) -> list[str]:
    """Every registered id, or those of one level (``easy``, ``medium``, ``hard``)."""
    if level is None:
        return list(SUITE)
    check_choice("level", level, LEVELS)
    return [i for i, e in SUITE.items() if e.level == level]


def entry(env_id: str) -> SuiteEntry:
    """The reference numbers of a suite or control id (unknown id: one-line UserError)."""
    check_choice("memory-suite id", env_id, ALL)
    return ALL[env_id]


def normalized_return(env_id: str, value: float) -> float:
    """``(value - random) / (optimal - random)``: 0 for the random policy, 1 for the optimum."""
    e = entry(env_id)
    span = e.optimal_return - e.random_return
    if span <= 0:  # impossible for the registered levels; kept as a guard for edits
        raise UserError(f"{env_id}: optimal return {e.optimal_return} is not above random {e.random_return}")
    return (float(value) - e.random_return) / span


def register() -> None:
    """Register every suite id with gymnasium (idempotent; imports no task module).

    Episodes bound themselves (sequence tasks terminate after a fixed length, CueGrid
    truncates at its ``max_steps``), so no TimeLimit is registered: a keyword override such
    as ``delay=20`` changes the length consistently. Each env reports its bound as the
    attribute ``max_episode_steps``.
    """
    import gymnasium

    for env_id_, e in ALL.items():
        if env_id_ not in gymnasium.registry:
            entry_point = ENTRY_POINTS.get(e.task) or CONTROL_ENTRY_POINTS[e.task]
            gymnasium.register(id=env_id_, entry_point=entry_point, kwargs={"level": e.level})
