"""Learner defaults by kind of environment: ``rfwp-rl train`` fills every option the command line
leaves unset from one profile, chosen from the env's spaces. Why each value is what it is, and the
measurements behind it: one page per profile under ``docs/profiles/``. The values are in the dicts
below (``VECTOR``, ``CONTROL``) and in :mod:`rfwp_rl.impala.config` (``ATARI``).

- ``atari`` (image observations): the RFWP paper's App. C settings; ``docs/profiles/atari.md``.
- ``vector`` (vector observations, discrete actions: the ``rfwp/`` memory tasks, CartPole, a user's
  env), for recurrent agents that must learn to remember; ``docs/profiles/vector.md``:

  - the unroll is twice the memory horizon the env states (up to ``MAX_STATED_UNROLL``), else twice
    its episode limit (up to ``MAX_UNROLL``), at least ``MIN_UNROLL``: gradients stop at unroll
    boundaries, and a span of h steps placed uniformly fits in an unroll of U steps with probability
    (U - h) / U, at least one half for U = 2h and none for U < h; an episode limit is no stated span;
  - a batch holds about ``VECTOR_STEPS_PER_UPDATE`` env steps whatever the unroll, so that a long
    unroll does not cost updates;
  - Adam; advantages divided by their RMS, not centred, so that a sparse +-1 is not drowned by the
    entropy bonus; the divisor at least ``advantage_floor`` x the RMS of the value targets, so that
    value noise around a solved task is not blown up to unit-sized policy steps, and at least
    ``advantage_min``, so that neither is it while a sparse reward has not been found;
  - an entropy cost above Atari's, which keeps the policy from saturating on one action against
    unit-sized advantages; V-trace lambda below 1, which cuts the noise of later rewards in each
    advantage;
  - rewards clipped to [-1, 1], then divided by the running RMS of the returns where that exceeds 1
    (``normalize_returns``), so that a dense reward's values (CartPole's +1 per step) do not swamp the
    policy's gradient in the shared layers; returns within [-1, 1] (every memory task) are left as
    they are;
  - a trust-region step on every update (``max_kl``, :mod:`rfwp_rl.impala.trust_region`), which bounds
    how far one batch moves the policy; a learner group runs without it (each member would shrink
    the shared step by its own batch);
  - the agent preset ``agents/vector_<core>.toml`` (MLP torso, the previous action as an input except
    for ``ff``).
- ``control`` (vector observations, continuous ``Box`` actions, e.g. Pendulum;
  ``docs/profiles/control.md``): the vector profile with on-policy continuous-control practice:
  rewards scaled by the returns' RMS but not clipped, many small on-policy updates
  (few envs, small batches; the unroll is 2 x the memory horizon where the env states one),
  advantages divided by their plain RMS (no floor), no entropy bonus (its gradient is a constant
  push on the Gaussian's log-std) and no trust region (not measured there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rfwp_rl.errors import check_choice
from rfwp_rl.impala.config import DEFAULTS

PROFILES = ("auto", "atari", "vector", "control")
# The vector profile's values (unroll_length: from the env, see vector_unroll_length); its keys are
# the options every profile sets, the command line's value winning wherever it gives one.
VECTOR = {
    "num_actors": 32,
    "batch_size": 16,
    "unroll_length": None,
    "optimizer": "adam",
    "learning_rate": 5e-4,
    "entropy_cost": 0.03,
    "normalize_advantages": True,
    "advantage_floor": 0.3,
    "advantage_min": 0.1,
    "normalize_value_loss": False,
    "reward_clip": 1.0,
    "normalize_returns": True,
    "vtrace_lambda": 0.9,
    "max_kl": 0.01,
    "recall_cost": 0.25,  # agents with a recall head (the vector presets): results/memory/cure/
}
PROFILE_OPTIONS = tuple(VECTOR)
ATARI = {k: getattr(DEFAULTS, k) for k in PROFILE_OPTIONS}
CONTROL = dict(
    VECTOR,
    num_actors=4,
    batch_size=4,
    entropy_cost=0.0,
    reward_clip=0.0,
    normalize_returns=True,
    advantage_floor=0.0,
    advantage_min=0.0,
    max_kl=0.0,
    recall_cost=0.0,
)  # no trust region, no recall task and no advantage minimum: none measured on continuous control
CONTROL_UNROLL = 16  # without a stated memory horizon
MIN_UNROLL, MAX_UNROLL = 20, 128
MAX_STATED_UNROLL = 1024  # a memory horizon the env states is spanned past MAX_UNROLL (docs/profiles/vector.md)
# A long unroll must not cost updates: the vector profile holds the env steps per update near
# 16 x 20 whatever the unroll, with at least MIN_BATCH unrolls per batch (docs/profiles/vector.md).
VECTOR_STEPS_PER_UPDATE, MIN_BATCH = 320, 4
UNKNOWN_HORIZON = 50  # steps assumed when the env states neither a memory horizon nor an episode limit


def vector_unroll_length(memory_horizon: int | None, max_episode_steps: int | None) -> int:
    """Twice the steps a memory must span: the env's ``memory_horizon``, within [MIN_UNROLL,
    MAX_STATED_UNROLL], else its episode limit (or ``UNKNOWN_HORIZON``), within [MIN_UNROLL, MAX_UNROLL]."""
    if memory_horizon:
        return max(MIN_UNROLL, min(MAX_STATED_UNROLL, 2 * int(memory_horizon)))
    return max(MIN_UNROLL, min(MAX_UNROLL, 2 * int(max_episode_steps or UNKNOWN_HORIZON)))


def vector_batch_size(unroll_length: int) -> int:
    """Unrolls per batch: about ``VECTOR_STEPS_PER_UPDATE`` env steps, at least ``MIN_BATCH``, at most
    the vector profile's 16 (at unroll 20)."""
    batch = round(VECTOR_STEPS_PER_UPDATE / unroll_length)
    return max(MIN_BATCH, min(VECTOR["batch_size"], batch))


def profile_for(kind: str, requested: str = "auto", continuous_actions: bool = False) -> str:
    """``atari`` for image observations, ``control`` for vectors with continuous actions, ``vector``
    for other vectors; ``requested`` other than auto wins."""
    check_choice("profile", requested, PROFILES)
    if requested != "auto":
        return requested
    if kind == "atari":
        return "atari"
    return "control" if continuous_actions else "vector"


def profile_defaults(
    profile: str,
    memory_horizon: int | None = None,
    max_episode_steps: int | None = None,
    unroll_length: int | None = None,
) -> dict[str, Any]:
    """The option values of ``profile`` (``atari``, ``vector`` or ``control``) for an env;
    ``unroll_length``: the one the command line gives, which the vector batch size follows."""
    check_choice("profile", profile, PROFILES[1:])
    if profile == "atari":
        return dict(ATARI)
    if profile == "control":
        unroll = vector_unroll_length(memory_horizon, None) if memory_horizon else CONTROL_UNROLL
        return dict(CONTROL, unroll_length=unroll)
    unroll = vector_unroll_length(memory_horizon, max_episode_steps)
    return dict(VECTOR, unroll_length=unroll, batch_size=vector_batch_size(unroll_length or unroll))


def fill_unset(
    given: dict[str, Any], profile: str, memory_horizon: int | None = None, max_episode_steps: int | None = None
) -> dict[str, Any]:
    """``given`` (option -> value or None for unset) with every None replaced by the profile's value."""
    defaults = profile_defaults(profile, memory_horizon, max_episode_steps, given.get("unroll_length"))
    return {k: (defaults[k] if v is None and k in defaults else v) for k, v in given.items()}


def describe(cfg: Any, preset_source: str, bounded_actions: bool = False) -> str:
    """The effective settings as printed at the start of a run (one line per group); the bound cost only where
    the actions have bounds to keep (``bounded_actions``), the one place it acts."""
    d = dataclasses.asdict(cfg)
    opt = (
        f"adam lr {d['learning_rate']:g} eps {d['adam_eps']:g}"
        if d["optimizer"] == "adam"
        else f"rmsprop lr {d['learning_rate']:g} alpha {d['rmsprop_alpha']:g} eps {d['rmsprop_eps']:g}"
    )
    floor = f"floor {d['advantage_floor']:g} x target RMS" if d["advantage_floor"] > 0 else "plain RMS"
    floor += f", at least {d['advantage_min']:g}" if d["advantage_min"] > 0 else ""
    value_too = ", value loss too" if d["normalize_value_loss"] else ""
    advantages = f"normalised ({floor}{value_too})" if d["normalize_advantages"] else "raw"
    trust = f", trust region {d['max_kl']:g} nats" if d["max_kl"] > 0 else ""
    bound = f", bound cost {d['bound_cost']:g}" if d["bound_cost"] > 0 and bounded_actions else ""
    epochs = f", {d['epochs']} epochs per batch" if d["epochs"] > 1 else ""
    return (
        f"settings ({d['profile']} profile): {d['num_actors']} envs, batch {d['batch_size']} x unroll "
        f"{d['unroll_length']}, {opt} (linear decay to 0), entropy {d['entropy_cost']:g}, baseline "
        f"{d['baseline_cost']:g}, discount {d['discount']:g}, reward clip {d['reward_clip']:g}"
        f"{', returns scaled to RMS <= 1' if d['normalize_returns'] else ''}, advantages "
        f"{advantages}, V-trace lambda {d['vtrace_lambda']:g}, grad clip {d['grad_norm_clip']:g}"
        f"{trust}{bound}{epochs}; "
        f"agent preset {preset_source}"
    )
