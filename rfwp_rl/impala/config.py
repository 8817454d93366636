"""Settings of ``rfwp-rl train``: the IMPALA settings of the RFWP paper (App. C).

RMSProp (lr 6e-4, alpha 0.99, eps 0.01, no momentum), learning rate decayed linearly to 0
over ``total_steps``, gradient-norm clipping at 40, entropy cost 0.01, baseline cost 0.5,
discount 0.99, batch 32 rollouts of unroll 50, rewards clipped to [-1, 1], V-trace with
rho-bar = c-bar = 1, 48 actors (environments). Only the number of environment worker
processes (one per CPU core, at most 8) and torch's thread count are chosen for the machine.

These are the ``atari`` profile (why: ``docs/profiles/atari.md``). Environments with vector
observations get the ``vector`` or ``control`` profile (:mod:`rfwp_rl.impala.profiles`) for the
options the command line leaves unset. Every field is a flag of ``rfwp-rl train`` and a ``--set``
key (:mod:`rfwp_rl.flags`); the learner's :class:`rfwp_rl.impala.loss.LossConfig` is taken from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from rfwp_rl.flags import ENV_STEPS, SECONDS, setting
from rfwp_rl.perf import PRECISIONS

ENV_BACKENDS = ("moolib", "process", "ale", "local")
ACTOR_DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("rmsprop", "adam")


def step_list(text: str) -> tuple[int, ...]:
    """``50000000,2e8`` -> ``(50000000, 200000000)``."""
    try:
        return tuple(int(float(x)) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected step counts, e.g. 50000000 200000000 or 5e7,2e8; got {text!r}"
        ) from None


def _env_processes() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


@dataclasses.dataclass
class ImpalaConfig:
    # what to train
    env: str = setting("ALE/Pong-v5", "gymnasium id, Atari game name or module:EnvId")
    seed: int = setting(1, "of the model, the envs (env i: seed + i) and the actions")
    total_steps: int = setting(50_000_000, "consumed by the learner (T x B per update)", unit=ENV_STEPS)
    # actors
    num_actors: int = setting(
        48,
        "split into --num-env-batches batches stepped alternately; with --listen, 0: "
        "train only on remote actors' rollouts",
    )
    num_env_batches: int = setting(
        2, "env batches stepped alternately (2: double buffering, one batch steps while the other is inferred)"
    )
    num_env_processes: int = setting(
        default_factory=_env_processes, help="moolib EnvPool worker processes (default: the CPU cores, at most 8)"
    )
    env_backend: str = setting(
        "moolib",
        "moolib: EnvPool worker processes; process: forked worker processes of our "
        "own (no moolib needed); ale: Atari games in ale-py's vector env, --num-env-processes C++ threads; "
        "local: step the envs in this process (debugging)",
        choices=ENV_BACKENDS,
    )
    listen: str = setting(
        "", "also train on the rollouts of remote actors (rfwp-rl actor --connect HOST:PORT)", metavar="HOST:PORT"
    )
    # several learners (rfwp_rl.impala.multi_learner): learners of one group average their gradients
    broker: str = setting(
        "",
        "join a group of learners that train one model (with --group): the moolib broker's "
        "address (rfwp-rl broker --address HOST:PORT); gradients are averaged before every "
        "optimizer step",
        metavar="HOST:PORT",
    )
    group: str = setting(
        "",
        "the learner group's name at the broker; every learner of a group needs the same env, "
        "agent and learner options, and its own --seed",
        metavar="NAME",
    )
    auth_key_file: str = setting(
        "",
        "the key that remote actors, learners of the group and the broker must prove "
        "(mode 600); empty: $RFWP_AUTH_KEY, else ~/.config/rfwp_rl/auth.key (made by a "
        "--listen learner if missing)",
        metavar="PATH",
    )
    env_timeout: float = setting(
        600.0,
        "moolib backend: seconds without a result from an env batch before the env "
        "is taken as hung and handled like a dead worker process: checkpoint, end the "
        "workers, restart the command (counted as one env failure); must exceed the "
        "slowest env step and the envs' construction (inf: never)",
        metavar="SECONDS",
    )
    max_env_failures: int = setting(
        100,
        "environment failures (an env raised and was replaced, or a worker process "
        "died or hung) tolerated over the whole run; one more saves a checkpoint and "
        "stops (exit 1). An env whose new instances keep failing before their first "
        "observation (rfwp_rl.envs.pool_env.MAX_FAILED_CONSTRUCTIONS in a row) stops the "
        "run at once (exit 1, one line naming the env and its exception)",
    )
    # learner
    batch_size: int = setting(32, "rollouts per optimizer step")
    unroll_length: int = setting(50, "env steps per rollout")
    optimizer: str = setting("rmsprop", choices=OPTIMIZERS)
    learning_rate: float = setting(6e-4, "the initial one, decayed linearly to 0 over --total-steps")
    rmsprop_alpha: float = setting(0.99, "RMSProp's smoothing constant")
    rmsprop_eps: float = setting(0.01, "RMSProp's epsilon")
    rmsprop_momentum: float = setting(0.0, "RMSProp's momentum")
    adam_eps: float = setting(1e-8)
    grad_norm_clip: float = setting(40.0)
    entropy_cost: float = setting(0.01)
    baseline_cost: float = setting(0.5)
    bound_cost: float = setting(
        1.0,
        "Box actions: cost of the Gaussian mean's squared distance past the action "
        "bounds, which keeps the policy from turning deterministic at a bound (0: off; "
        "other action spaces have no such term)",
    )
    recall_cost: float = setting(
        0.25,
        "weight of the recall loss, per step (agents with agent.recall_lags, as the vector presets: "
        "reconstruct the torso features of a step up to that many steps back; rfwp_rl/recall.py)",
    )
    discount: float = setting(0.99)
    reward_clip: float = setting(1.0, "clip rewards to [-x, x]; 0: no clipping")
    clip_rho: float = setting(1.0, "V-trace rho-bar: the importance weights' clip in the targets")
    clip_c: float = setting(1.0, "V-trace c-bar: the traces' clip")
    vtrace_lambda: float = setting(1.0, "V-trace trace factor lambda in [0, 1] (IMPALA Remark 2; 1: the paper's)")
    normalize_advantages: bool = setting(False, "divide the policy-gradient advantages by their batch RMS")
    advantage_floor: float = setting(
        0.1,
        "with --normalize-advantages the divisor is at least this times the RMS of "
        "the V-trace targets, so that noise around a solved task is not blown up "
        "to unit size (0: plain RMS)",
    )
    advantage_min: float = setting(
        0.0,
        "with --normalize-advantages the divisor is also at least this, in the values' units, so that "
        "value noise is not blown up to unit size while the returns are still near 0 (0: no minimum)",
    )
    normalize_value_loss: bool = setting(
        False,
        "with --normalize-advantages, divide the value errors by the same "
        "divisor, so the value loss keeps pace with the policy loss at any "
        "reward scale",
    )
    normalize_returns: bool = setting(
        False,
        "divide rewards by the running RMS of the returns where that exceeds 1, "
        "so that values and value errors stay near unit size in any reward units",
    )
    epochs: int = setting(
        1,
        "optimizer steps on each batch, each on the loss recomputed with the current parameters "
        "(PPO's epochs; V-trace's importance weights correct for the policy having moved; with "
        "--max-kl the total move from the behaviour policy stays bounded); one learner only",
    )
    max_kl: float = setting(
        0.0,
        "trust region: an update that moves the policy further than this mean KL from the "
        "behaviour policy on its batch is shrunk to it (0: off; one learner only)",
    )
    profile: str = setting("atari", "which defaults filled the options the command line left unset")
    device: str = setting("cpu")
    learner_thread: bool | None = setting(
        None,
        "run updates in a learner thread while the actors go on with a copy of the "
        "model (refreshed after each update); --no-learner-thread: act and learn in turn "
        "in one thread; unset: a thread with a GPU learner, none otherwise",
    )
    actor_device: str = setting(
        "auto",
        "where the actors run the model; auto: the learner's device, or with a GPU "
        "learner the faster of CPU and GPU for one acting step, timed at start and "
        "printed",
        choices=ACTOR_DEVICES,
    )
    acting_graph: bool = setting(
        True,
        "actors on a GPU: one acting step is a CUDA graph replay, captured at start and checked against the "
        "eager step (else eager, with the reason printed)",
    )
    precision: str = setting(
        "fp32",
        "bf16: the torso runs under bf16 autocast in acting and learning (CPU with "
        "AVX-512 BF16 or AMX, or CUDA); weights, optimizer state, core and losses stay "
        "fp32",
        choices=PRECISIONS,
    )
    torch_threads: int = setting(0, "0: chosen from the available cores and the env processes, and printed at start")
    # bookkeeping
    checkpoint_every: float = setting(600.0, unit=SECONDS)
    snapshot_steps: tuple[int, ...] = setting(
        (), "extra checkpoints kept at these step counts, e.g. 50000000,200000000", type=step_list
    )
    log_every: float = setting(5.0, "also of TensorBoard's rate scalars", unit=SECONDS)
    max_nonfinite: int = setting(20, "consecutive non-finite updates before the run aborts")


DEFAULTS = ImpalaConfig()


def trainer_keys() -> list[str]:
    """The settings ``--set KEY=VALUE`` may change besides the agent's: the fields of :class:`ImpalaConfig`
    but ``env`` (which decides the agent's shapes: ``--env``) and ``profile`` (``--profile``)."""
    return [f.name for f in dataclasses.fields(ImpalaConfig) if f.name not in ("env", "profile")]
