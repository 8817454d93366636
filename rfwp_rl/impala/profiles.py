"""Learner defaults by kind of environment: the paper's Atari settings, and settings that let
recurrent agents learn memory tasks with small vector observations.

``rfwp-rl train`` fills every option the command line leaves unset from one profile:

- ``atari`` (image observations): the RFWP paper's App. C settings, :mod:`rfwp_rl.impala.config`.
- ``vector`` (vector observations, e.g. the ``rfwp/`` memory tasks, CartPole, a user's env):
  the unroll covers twice the env's memory horizon, because gradients stop at unroll boundaries
  (truncated BPTT) and a cue is learnable only when one unroll holds both the cue and the step
  that needs it; with unroll U and horizon h a uniformly placed span fits in one unroll with
  probability (U - h) / U, hence U = 2h gives at least one half. Advantages are normalised, so
  that a sparse +-1 at the end of an episode is not drowned by an entropy bonus sized for Atari's
  dense clipped rewards; Adam replaces RMSProp with Atari's large epsilon. The entropy cost is 0.03,
not Atari's 0.01: against unit-sized normalised advantages 0.01 did not keep the policy from
saturating on one action (position-only cart-pole: Recurrent Delta Net 3 of 3 seeds and GRU fell
from 0.76-0.89 to 0.05, a deterministic policy whose gradients vanish; with 0.03 seed 1 ended at
1.00, and the LSTM still solved DelayedRecall-easy within 1M steps). The agent preset is
  ``agents/vector_<core>.toml`` (MLP torso, previous action as input except for ``ff``). A batch
  holds about 320 env steps (16 x unroll 20; 4 x 100 for 100-step unrolls), so that envs with long
  unrolls get as many updates per env step as the short ones.
  Each update is a trust-region step (``max_kl`` 0.01, :mod:`rfwp_rl.impala.learner`): on the
  position-only cart-pole every LSTM and GRU run with torch's gate init that reached 0.9 of the
  optimum ended >= 0.91 (6 of 6; without it 2 of 6 fell to 0.38-0.43), and on DelayedRecall/AssociativeRecall-easy no
  core lost (3 seeds). A learner group runs without it (each member would shrink the shared step
  by its own batch).
  The advantage normaliser's divisor is at least 0.3 x the RMS of the value targets
  (``advantage_floor``): once a dense-reward task is solved its advantages are value noise, a few
  percent of the returns; with a floor of 0.1 the divisor fell to 0.02-0.05 (LSTM on the
  position-only cart-pole) and that noise became unit-sized policy steps that walked the policy
  off the solution. On that task (2M steps) 7 of 11 LSTM, GRU and RDN runs that reached 0.9 kept
  it with 0.1, 10 of 10 with 0.5 and 9 of 9 with 0.3 (each >= 0.92 at the end); on popgym's
  RepeatFirst (dense small rewards, where a high floor slows learning) the LSTM reached >= 0.9
  normalised in 3 of 3 seeds with 0.1 and 0.3 but 1 of 3 with 0.5 (results/memory).
- ``control`` (vector observations, continuous ``Box`` actions, e.g. Pendulum): the vector profile
  with the on-policy continuous-control practice (A2C/PPO implementations): rewards not clipped
  but scaled where the returns exceed 1 in RMS (``normalize_returns``; clipping flattens Pendulum's
  -16..0 per step to -1; on CartPole-v1's +1 per step, a discrete vector env, the scaling measured
  worse than the clip in one seed, 97 against 235 at 100k steps, so the vector profile clips), no
  trust region (not measured there), no entropy bonus (the Gaussian's entropy gradient is a
  constant push on its log-std that the advantages, summed over a batch, do not outweigh: the
  log-std of Pendulum runs stayed at its initial value or grew), many small on-policy updates
  (batch 4 x unroll 16 from 4 envs: one update per 64 env steps, each on the policy that acted;
  with 32 envs a batch waited ~8 updates and V-trace cut most of its correction), and advantages
  divided by their plain RMS (no floor: at discount 0.99 Pendulum's advantages are 0.3-1% of the
  return scale, so the floor shrank the policy gradient 10-30x). Pendulum at discount 0.99, 1M
  steps, 5 seeds: -165, -163, -160, -165, -172 with these settings and the learner's bound cost
  on the Gaussian's mean (every profile's; -198, -190, -732, -714, -776 without it); seed 1 gave
  -1,181 with 32 envs and the floor, -857 with 4 envs and the floor. The unroll is 2 x the memory
  horizon where the env states one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rfwp_rl.errors import check_choice
from rfwp_rl.impala.config import DEFAULTS

PROFILES = ("auto", "atari", "vector", "control")
# The vector profile's values (unroll_length: from the env, see vector_unroll_length); its keys are
# the options every profile sets, the command line's value winning wherever it gives one.
VECTOR = {"num_actors": 32, "batch_size": 16, "unroll_length": None, "optimizer": "adam", "learning_rate": 5e-4,
          "entropy_cost": 0.03, "normalize_advantages": True, "advantage_floor": 0.3, "normalize_value_loss": False, "reward_clip": 1.0,
          "normalize_returns": False, "vtrace_lambda": 0.9, "max_kl": 0.01}
PROFILE_OPTIONS = tuple(VECTOR)
ATARI = {k: getattr(DEFAULTS, k) for k in PROFILE_OPTIONS}
CONTROL = dict(VECTOR, num_actors=4, batch_size=4, entropy_cost=0.0, reward_clip=0.0, normalize_returns=True,
               advantage_floor=0.0, max_kl=0.0)  # the trust region is unmeasured there
CONTROL_UNROLL = 16  # without a stated memory horizon
MIN_UNROLL, MAX_UNROLL = 20, 128
# A long unroll must not cost updates: the vector profile holds the env steps per update near
# 16 x 20 whatever the unroll (RepeatFirst with 100-step unrolls: 16 x 100 gave 625 updates in
# 1M steps and the LSTM stayed near random; 4 x 100 learned), with at least 4 unrolls per batch.
VECTOR_STEPS_PER_UPDATE, MIN_BATCH = 320, 4
UNKNOWN_HORIZON = 50  # steps assumed when the env states neither a memory horizon nor an episode limit


def vector_unroll_length(memory_horizon: int | None, max_episode_steps: int | None) -> int:
    """Twice the steps a memory must span (the env's ``memory_horizon``, else its episode limit),
    within [MIN_UNROLL, MAX_UNROLL]."""
    horizon = memory_horizon or max_episode_steps or UNKNOWN_HORIZON
    return max(MIN_UNROLL, min(MAX_UNROLL, 2 * int(horizon)))


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


def profile_defaults(profile: str, memory_horizon: int | None = None,
                     max_episode_steps: int | None = None, unroll_length: int | None = None) -> dict[str, Any]:
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


def fill_unset(given: dict[str, Any], profile: str, memory_horizon: int | None = None,
               max_episode_steps: int | None = None) -> dict[str, Any]:
    """``given`` (option -> value or None for unset) with every None replaced by the profile's value."""
    defaults = profile_defaults(profile, memory_horizon, max_episode_steps, given.get("unroll_length"))
    return {k: (defaults[k] if v is None and k in defaults else v) for k, v in given.items()}


def describe(cfg: Any, preset_source: str) -> str:
    """The effective settings as printed at the start of a run (one line per group)."""
    d = dataclasses.asdict(cfg)
    opt = (f"adam lr {d['learning_rate']:g} eps {d['adam_eps']:g}" if d["optimizer"] == "adam" else
           f"rmsprop lr {d['learning_rate']:g} alpha {d['rmsprop_alpha']:g} eps {d['rmsprop_eps']:g}")
    return (f"settings ({d['profile']} profile): {d['num_actors']} envs, batch {d['batch_size']} x unroll "
            f"{d['unroll_length']}, {opt} (linear decay to 0), entropy {d['entropy_cost']:g}, baseline "
            f"{d['baseline_cost']:g}, discount {d['discount']:g}, reward clip {d['reward_clip']:g}"
            f"{', returns scaled to RMS <= 1' if d['normalize_returns'] else ''}, advantages "
            f"{'normalised (%s%s)' % ('floor %g x target RMS' % d['advantage_floor'] if d['advantage_floor'] > 0 else 'plain RMS', ', value loss too' if d['normalize_value_loss'] else '') if d['normalize_advantages'] else 'raw'}, V-trace lambda {d['vtrace_lambda']:g}, grad clip {d['grad_norm_clip']:g}"
            f"{', trust region %g nats' % d['max_kl'] if d['max_kl'] > 0 else ''}"
            f"{', bound cost %g' % d['bound_cost'] if d['bound_cost'] > 0 else ''}"
            f"{', %d epochs per batch' % d['epochs'] if d['epochs'] > 1 else ''}; "
            f"agent preset {preset_source}")
