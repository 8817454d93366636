"""The extended comparison of memory cores: its envs, and the reference returns of the envs outside the suite.

Envs (:data:`ENVS`, in the order the launcher trains them, the cheap ones first): the memory suite's easy and
medium ids (:func:`rfwp_rl.memory.suite.suite_ids`: the sequence tasks and CueGrid, not the position-only
cart-pole), popgym's four easy memory tasks (:data:`POPGYM_EASY`) and MiniGrid-MemoryS7
(:data:`MINIGRID_MEMORY_S7`). The external ids are written as ``rfwp-rl train --env`` takes them
(``module:EnvId``; ``pip install '.[envs]'``), which is the ``env`` of each run's ``config.json``.

Every reference number is derived from the env's source (popgym 1.0.7, minigrid 3.2.0), not measured; the
comment above each one says how. Normalised return: ``(R - random) / (optimal - random)``
(:func:`normalized_return`). This module imports neither popgym nor minigrid.
"""

from __future__ import annotations

from dataclasses import dataclass

from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.memory import suite


@dataclass(frozen=True)
class Reference:
    """Reference returns of an env outside the suite: ``random_return`` scores 0, ``optimal_return`` 1."""

    env_id: str
    task: str  # as the tables name it: source and task, so that suite and popgym tasks of one name differ
    level: str
    random_return: float
    optimal_return: float
    description: str


def guessing_return(n_actions: int) -> float:
    """Expected return of the uniformly random policy on a task whose scored steps each pay +s for the one
    right action of ``n_actions`` and -s for any other, the scales s summing to 1 over an episode (every
    popgym memory task below): ``sum s * (1/n - (n-1)/n) = 2/n - 1``; the policy that is always right
    gets ``sum s = 1``."""
    return 2 / n_actions - 1


POPGYM_DECK = 52  # popgym/core/deck.py: DECK_SIZE; every easy level uses one deck (num_decks=1)
POPGYM_SUITS = 4  # popgym/core/deck.py: SUITS, the actions of the suit-naming tasks (get_obs_space(["suits"]))


def _popgym(task: str, n_actions: int, description: str) -> Reference:
    return Reference(
        f"popgym:popgym-{task}Easy-v0", f"popgym {task}", "easy", guessing_return(n_actions), 1.0, description
    )


#: popgym's easy memory tasks (popgym/envs/__init__.py: DIAGNOSTIC_EASY), in its order
POPGYM_EASY: dict[str, Reference] = {
    r.env_id: r
    for r in (
        # repeat_first.py: reset deals 1 card; each step deals 1 and the step that finds 1 card left ends the
        # episode (step: terminated = len(deck) == 1): 52 - 1 = 51 steps, each +-1/51 (reward_scale =
        # 1/(num_cards - 1)) for naming the first card's suit or not: random 2/4 - 1 = -1/2, optimal 1.
        _popgym("RepeatFirst", POPGYM_SUITS, "name the suit of the episode's first card at every step"),
        # repeat_previous.py (RepeatPreviousEasy: k=4): 51 steps as RepeatFirst; a step scores once the hand
        # holds k cards (hand_size >= k), steps 4 to 51: 48 steps of +-1/48 (reward_scale = 1/(num_cards - k))
        # for the suit of the k-th last card shown (deck["player"][-k]): random -1/2, optimal 1.
        _popgym("RepeatPrevious", POPGYM_SUITS, "name the suit of the fourth-last card shown"),
        # count_recall.py (CountRecallEasy: deck_type colors): 2 colours of 26 cards (max_card_count), 27
        # actions (Discrete(max_card_count + 1)); reset deals 1 value and 1 query card, each step 1 of each and
        # ends when the value deck is empty: 51 steps of +-1/51 (reward_scale = 1/max_episode_length) for the
        # count of the last query's colour among the value cards shown: random 2/27 - 1 = -25/27, optimal 1.
        _popgym("CountRecall", 26 + 1, "say how many cards of the queried colour have been shown"),
        # autoencode.py: reset deals 1 card, each watch step 1 more until the deck is empty (51 steps, reward
        # 0), then 52 play steps of +-1/52 (reward_scale = 1/num_cards; terminated when 1 card is left to
        # recite) for the suits in reverse order: 103 steps, random 2/4 - 1 = -1/2 (watch steps pay 0 to any
        # action), optimal 1.
        _popgym("Autoencode", POPGYM_SUITS, "watch 52 cards, then name their suits in reverse order"),
    )
}

# minigrid/envs/memory.py (MemoryEnv, size=7: MiniGrid-MemoryS7-v0 in minigrid/__init__.py). A success pays
# 1 - 0.9 * step_count / max_steps (MiniGridEnv._reward) and ends the episode, as does stepping next to the
# other object (reward 0); max_steps = 5 * size**2 = 245. The layout (_gen_grid): hallway_end = size - 3 = 4,
# the agent starts at (x, 3) facing east with x uniform in 1..4 (_rand_int(1, hallway_end + 1)), the cue
# object at (1, 2), the junction at (5, 3), the goal cells (5, 2) and (5, 4) beside the end objects.
MEMORY_S7_SIZE = 7
MEMORY_S7_MAX_STEPS = 5 * MEMORY_S7_SIZE**2
MEMORY_S7_HALLWAY_END = MEMORY_S7_SIZE - 3
MEMORY_S7_STARTS = tuple(range(1, MEMORY_S7_HALLWAY_END + 1))


def memory_s7_shortest_success(start_x: int) -> int:
    """Fewest steps of an S7 episode that succeeds whichever end matches, from start column ``start_x``: the
    forward moves to the junction (``hallway_end + 1 - x``), a turn and a step into the goal cell, and, from
    ``x > 1``, a turn away and back to see the cue (the 7x7 view faces east; only from ``x = 1`` is the cue,
    one cell to the left, in view at the start). The end objects come into view on the way to the junction.
    ``tests/test_memory_comparison.py`` checks these lengths by a breadth-first search over the installed
    env's moves and view."""
    if start_x not in MEMORY_S7_STARTS:
        raise UserError(f"MemoryS7 start column {start_x} is invalid; allowed: {', '.join(map(str, MEMORY_S7_STARTS))}")
    look_back = 0 if start_x == 1 else 2
    return (MEMORY_S7_HALLWAY_END + 1 - start_x) + 2 + look_back


def memory_s7_success_return(steps: int) -> float:
    """The return of an S7 episode that succeeds at step ``steps`` (MiniGridEnv._reward)."""
    return 1 - 0.9 * steps / MEMORY_S7_MAX_STEPS


#: MiniGrid-MemoryS7 (Chevalier-Boisvert et al.): 0 is no success (a failed or timed-out episode), not the
#: random policy's return (which is above 0: a random walk reaches an end now and then); 1 is the expected
#: return of the fastest policy that always succeeds, the mean of memory_s7_success_return over the four
#: start columns. A policy without memory must guess at the junction, succeeds in half the episodes and so
#: reaches about half.
MINIGRID_MEMORY_S7 = Reference(
    "minigrid:MiniGrid-MemoryS7-v0",
    "MiniGrid Memory",
    "S7",
    0.0,
    sum(memory_s7_success_return(memory_s7_shortest_success(x)) for x in MEMORY_S7_STARTS) / len(MEMORY_S7_STARTS),
    "remember the object in the start room and walk to its twin at the end of the hallway",
)

#: every env outside the suite, by id
EXTERNAL: dict[str, Reference] = {**POPGYM_EASY, MINIGRID_MEMORY_S7.env_id: MINIGRID_MEMORY_S7}
#: the comparison's envs: the suite's easy then medium ids, popgym's easy memory tasks, MiniGrid-MemoryS7
ENVS: tuple[str, ...] = (*suite.suite_ids("easy"), *suite.suite_ids("medium"), *EXTERNAL)


def describe(env_id: str) -> tuple[str, str]:
    """``(task, level)`` of one of :data:`ENVS` (unknown id: one-line UserError)."""
    check_choice("comparison env", env_id, ENVS)
    if env_id in EXTERNAL:
        return EXTERNAL[env_id].task, EXTERNAL[env_id].level
    e = suite.entry(env_id)
    return e.task, e.level


def normalized_return(env_id: str, value: float) -> float:
    """``(value - random) / (optimal - random)`` for one of :data:`ENVS`: 0 at the reference of no skill,
    1 at the optimum (suite ids: :func:`rfwp_rl.memory.suite.normalized_return`)."""
    check_choice("comparison env", env_id, ENVS)
    if env_id not in EXTERNAL:
        return suite.normalized_return(env_id, value)
    r = EXTERNAL[env_id]
    return (float(value) - r.random_return) / (r.optimal_return - r.random_return)
