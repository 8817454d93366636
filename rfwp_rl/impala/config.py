"""Defaults of ``rfwp-rl train``: the IMPALA settings of the RFWP paper (App. C).

RMSProp (lr 6e-4, alpha 0.99, eps 0.01, no momentum), learning rate decayed linearly to 0
over ``total_steps``, gradient-norm clipping at 40, entropy cost 0.01, baseline cost 0.5,
discount 0.99, batch 32 rollouts of unroll 50, rewards clipped to [-1, 1], V-trace with
rho-bar = c-bar = 1, 48 actors (environments). Only the number of environment worker
processes (one per CPU core, at most 8) and torch's thread count are chosen for the machine.

These are the ``atari`` profile (why: ``docs/profiles/atari.md``). Environments with vector
observations get the ``vector`` or ``control`` profile (:mod:`rfwp_rl.impala.profiles`) for the
options the command line leaves unset.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass
class ImpalaConfig:
    # what to train
    env: str = "ALE/Pong-v5"
    seed: int = 1
    total_steps: int = 50_000_000  # environment steps consumed by the learner (T x B per update)
    # actors
    num_actors: int = 48  # environments, split into num_env_batches batches stepped alternately
    num_env_batches: int = 2  # 2 = double buffering: one batch steps while the other is inferred
    num_env_processes: int = dataclasses.field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 8)))
    env_backend: str = "moolib"  # moolib (EnvPool worker processes) or local (in this process)
    listen: str = ""  # HOST:PORT: also take rollouts from remote actors (rfwp-rl actor --connect)
    # several learners (rfwp_rl.impala.multi_learner): the moolib broker's HOST:PORT and the group name;
    # learners of one group average their gradients before every optimizer step
    broker: str = ""
    group: str = ""
    auth_key_file: str = ""  # the shared key of --listen/--broker peers (rfwp_rl.impala.wire.resolve_key)
    # moolib: seconds without a result from an env batch before the pool counts as broken (a hung
    # env is handled like a dead worker process: checkpoint, end the workers, restart)
    env_timeout: float = 600.0
    # learner
    batch_size: int = 32
    unroll_length: int = 50
    learning_rate: float = 6e-4
    rmsprop_alpha: float = 0.99
    rmsprop_eps: float = 0.01
    rmsprop_momentum: float = 0.0
    grad_norm_clip: float = 40.0
    entropy_cost: float = 0.01
    baseline_cost: float = 0.5
    bound_cost: float = 1.0  # Box actions: penalty on the Gaussian's mean past the bounds (none for others)
    discount: float = 0.99
    reward_clip: float = 1.0
    clip_rho: float = 1.0
    clip_c: float = 1.0
    vtrace_lambda: float = 1.0  # V-trace trace factor (1: the paper's)
    optimizer: str = "rmsprop"  # rmsprop (paper) or adam
    adam_eps: float = 1e-8
    normalize_advantages: bool = False  # policy-gradient advantages divided by their batch RMS
    advantage_floor: float = 0.1  # that divisor is at least this x the RMS of the V-trace targets
    normalize_value_loss: bool = False  # value errors divided by the same divisor
    normalize_returns: bool = False  # rewards divided by the running RMS of the returns where that is above 1
    epochs: int = 1  # optimizer steps on each batch (PPO's epochs); V-trace corrects for the policy moving between them
    max_kl: float = 0.0  # trust region: each update moves the policy at most this mean KL from mu; 0 = off
    profile: str = "atari"  # which defaults filled the options the command line left unset
    device: str = "cpu"
    learner_thread: bool = False  # updates in a thread; actors act with a copy of the model meanwhile
    precision: str = "fp32"  # bf16: autocast of the torso in acting and learning (fp32 weights, optimizer, losses)
    torch_threads: int = 0  # 0: chosen from the cores and env processes (rfwp_rl.perf.choose_torch_threads)
    # bookkeeping
    checkpoint_every: float = 600.0  # seconds between periodic checkpoints
    snapshot_steps: tuple[int, ...] = ()
    log_every: float = 5.0  # seconds between TensorBoard scalar writes / console lines
    max_nonfinite: int = 20  # consecutive non-finite updates before the run aborts
    max_env_failures: int = 100  # env failures tolerated over the run; one more checkpoints and stops (exit 1)


DEFAULTS = ImpalaConfig()
ENV_BACKENDS = ("moolib", "local")
OPTIMIZERS = ("rmsprop", "adam")


def trainer_keys() -> list[str]:
    """The settings ``--set KEY=VALUE`` may change besides the agent's: the fields of :class:`ImpalaConfig`
    but ``env`` (which decides the agent's shapes: ``--env``) and ``profile`` (``--profile``)."""
    return [f.name for f in dataclasses.fields(ImpalaConfig) if f.name not in ("env", "profile")]
