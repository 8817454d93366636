"""``rfwp-rl train``: IMPALA / V-trace on Atari or any gymnasium env whose spaces the agent supports.

One process holds the model, the actors' inference and the learner (as in TorchBeast's
monobeast and moolib's IMPALA example); the environments run in ``moolib.EnvPool`` worker
processes, stepped in two alternating batches so that env stepping overlaps inference.
:meth:`ImpalaTrainer.train` is the loop, top to bottom: let the learner group finish a round
(one optimizer step) -> if a full batch is ready and the group takes gradients, compute them ->
else step one env batch and collect finished rollouts -> log, checkpoint. Defaults are the
paper's settings (:mod:`rfwp_rl.impala.config`); the run setup is :mod:`rfwp_rl.impala.setup`,
the resume order :mod:`rfwp_rl.scaffold`.

Examples::

    rfwp-rl train --env Pong --core rdn                      # agents/atari_rdn.toml, 50M steps
    rfwp-rl train --env CartPole-v1 --core lstm --total-steps 200000 --num-actors 8 \\
        --unroll-length 20 --batch-size 8
    rfwp-rl train --env Pong --preset my_agent.toml --set core_config.hidden_size=64 --set entropy_cost=0.005
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from rfwp_rl.checkpoint import add_trust_argument
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.impala import profiles
from rfwp_rl.impala.config import DEFAULTS, ENV_BACKENDS, OPTIMIZERS, ImpalaConfig
from rfwp_rl.impala.env_pool import EnvPoolBroken
from rfwp_rl.impala.setup import DEFAULT_CORE, RunSpec, add_run_arguments
from rfwp_rl.perf import PRECISIONS, Timers, choose_torch_threads, set_torch_threads
from rfwp_rl.safety import GracefulStop, TrainingAborted
from rfwp_rl.scaffold import Trainer, run_trainer

__all__ = ["DEFAULT_CORE", "ImpalaTrainer", "add_arguments", "run", "train"]

METRICS = ("episode/return", "episode/return_mean100")
# Settings every learner of a group must share (checked when a learner joins), besides the env and agent.
GROUP_SETTINGS = ("total_steps", "batch_size", "unroll_length", "learning_rate", "rmsprop_alpha", "rmsprop_eps",
                  "rmsprop_momentum", "grad_norm_clip", "entropy_cost", "baseline_cost", "bound_cost", "discount",
                  "reward_clip", "clip_rho", "clip_c", "optimizer", "adam_eps", "normalize_advantages",
                  "advantage_floor", "normalize_value_loss", "vtrace_lambda", "max_kl", "normalize_returns", "epochs")
BEST_WINDOW = 100  # best.pt: the mean return of the last this many episodes, once that many ended since the start
MAX_WAITING_BATCHES = 4  # full batches held while a learner group takes no gradients (joining); older ones are dropped


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(float(x)) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated step counts, e.g. 50000000,200000000; got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    g = parser.add_argument_group("what to train")
    add_run_arguments(g, d.env)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--total-steps", type=lambda s: int(float(s)), default=d.total_steps,
                   help="environment steps consumed by the learner (default %(default)s)")
    _add_actor_arguments(parser.add_argument_group("actors"))
    _add_learner_arguments(parser.add_argument_group("learner (RFWP paper App. C)"))
    g = parser.add_argument_group("bookkeeping")
    g.add_argument("--run-dir", default=None, help="run directory (default runs/impala/<env>_<core>_s<seed>; "
                   "characters other than letters, digits, . + - in names become -, e.g. ALE-Pong-v5_delta-rnn_s1)")
    g.add_argument("--checkpoint-every", type=float, default=d.checkpoint_every, help="seconds (default %(default)s)")
    add_trust_argument(g)
    g.add_argument("--snapshot-steps", type=_int_list, default=d.snapshot_steps,
                   help="extra checkpoints kept at these step counts, e.g. 50000000,200000000")
    g.add_argument("--log-every", type=float, default=d.log_every, help="seconds between console lines")


def _add_actor_arguments(g: argparse._ArgumentGroup) -> None:
    d = DEFAULTS
    g.add_argument("--num-actors", type=int, default=None,
                   help=f"environments (default: {d.num_actors} for Atari, {profiles.VECTOR['num_actors']} for vector envs, "
                        f"{profiles.CONTROL['num_actors']} in the control profile)")
    g.add_argument("--num-env-batches", type=int, default=d.num_env_batches,
                   help="env batches stepped alternately (2 = double buffering)")
    g.add_argument("--num-env-processes", type=int, default=d.num_env_processes,
                   help="moolib EnvPool worker processes (default: CPU cores, at most 8)")
    g.add_argument("--env-backend", choices=ENV_BACKENDS, default=d.env_backend,
                   help="moolib: EnvPool worker processes; local: step envs in this process (debugging)")
    g.add_argument("--listen", default=d.listen, metavar="HOST:PORT",
                   help="also train on rollouts of remote actors (rfwp-rl actor --connect HOST:PORT); "
                        "with --num-actors 0 only on theirs")
    g.add_argument("--broker", default=d.broker, metavar="HOST:PORT",
                   help="join a group of learners that train one model (with --group): the moolib broker's address "
                        "(rfwp-rl broker --address HOST:PORT); gradients are averaged before every optimizer step")
    g.add_argument("--auth-key-file", default=d.auth_key_file, metavar="PATH",
                   help="the key that remote actors, learners of the group and the broker must prove (mode 600); "
                        "default: $RFWP_AUTH_KEY, else ~/.config/rfwp_rl/auth.key (made by a --listen learner "
                        "if missing)")
    g.add_argument("--group", default=d.group, metavar="NAME",
                   help="the learner group's name at the broker; every learner of a group needs the same env, "
                        "agent and learner options, and its own --seed")
    g.add_argument("--max-env-failures", type=int, default=d.max_env_failures,
                   help="environment failures (an env raised and was replaced, or a worker process died "
                        "or hung) tolerated over the whole run; one more saves a checkpoint and stops (exit 1). "
                        "An env whose new instances keep failing before their first observation "
                        "(rfwp_rl.envs.pool.MAX_FAILED_CONSTRUCTIONS in a row) stops the run at once "
                        "(exit 1, one line naming the env and its exception)")
    g.add_argument("--env-timeout", type=float, default=d.env_timeout, metavar="SECONDS",
                   help="moolib backend: seconds without a result from an env batch before the env is taken "
                        "as hung and handled like a dead worker process: checkpoint, end the workers, restart "
                        "the command (counted as one env failure); must exceed the slowest env step and the "
                        "envs' construction (default %(default)g; inf: never)")


def _add_learner_arguments(g: argparse._ArgumentGroup) -> None:
    d = DEFAULTS
    g.add_argument("--profile", choices=profiles.PROFILES, default="auto",
                   help="defaults of the options left unset: atari (the paper's), vector (memory tasks: unroll = "
                        "2 x the env's memory horizon, Adam, normalised advantages), control (vector "
                        "observations and continuous actions: the vector profile with 4 envs and batch 4 x unroll 16, "
                        "return scaling instead of the reward clip, plain advantage RMS, no entropy bonus and no "
                        "trust region), "
                        "auto: by the env's spaces")
    g.add_argument("--batch-size", type=int, default=None,
                   help=f"rollouts per update (atari {d.batch_size}; vector: about "
                        f"{profiles.VECTOR_STEPS_PER_UPDATE} env steps / unroll, {profiles.MIN_BATCH} to "
                        f"{profiles.VECTOR['batch_size']}; control {profiles.CONTROL['batch_size']})")
    g.add_argument("--unroll-length", type=int, default=None,
                   help=f"steps per rollout (atari {d.unroll_length}; vector: 2 x the env's memory horizon, "
                        f"{profiles.MIN_UNROLL} to {profiles.MAX_UNROLL}; control: the same where the env "
                        f"states a memory horizon, else {profiles.CONTROL_UNROLL})")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="atari rmsprop, vector adam")
    g.add_argument("--learning-rate", "--lr", type=float, default=None,
                   help=f"initial learning rate, decayed linearly to 0 (atari {d.learning_rate:g}, vector "
                        f"{profiles.VECTOR['learning_rate']:g})")
    g.add_argument("--adam-eps", type=float, default=d.adam_eps)
    g.add_argument("--rmsprop-alpha", type=float, default=d.rmsprop_alpha)
    g.add_argument("--rmsprop-eps", type=float, default=d.rmsprop_eps)
    g.add_argument("--grad-norm-clip", type=float, default=d.grad_norm_clip)
    g.add_argument("--entropy-cost", type=float, default=None,
                   help=f"atari {d.entropy_cost:g}, vector {profiles.VECTOR['entropy_cost']:g}, control "
                        f"{profiles.CONTROL['entropy_cost']:g}")
    g.add_argument("--vtrace-lambda", type=float, default=None,
                   help=f"V-trace trace factor lambda in [0, 1] (IMPALA Remark 2): atari {d.vtrace_lambda:g} (the "
                        f"paper), vector {profiles.VECTOR['vtrace_lambda']:g}")
    g.add_argument("--normalize-advantages", action=argparse.BooleanOptionalAction, default=None,
                   help="divide the policy-gradient advantages by their batch RMS (atari no, vector yes)")
    g.add_argument("--normalize-value-loss", action=argparse.BooleanOptionalAction, default=None,
                   help="with --normalize-advantages, divide the value errors by the same divisor, so "
                        "the value loss keeps pace with the policy loss at any reward scale")
    g.add_argument("--advantage-floor", type=float, default=None,
                   help="with --normalize-advantages the divisor is at least this times the RMS of the "
                        "V-trace targets, so that noise around a solved task is not blown up to unit "
                        f"size (vector {profiles.VECTOR['advantage_floor']:g}, control "
                        f"{profiles.CONTROL['advantage_floor']:g}; 0: plain RMS)")
    g.add_argument("--normalize-returns", action=argparse.BooleanOptionalAction, default=None,
                   help="divide rewards by the running RMS of the returns where that exceeds 1, so that "
                        "values and value errors stay near unit size in any reward units (atari and vector no: "
                        "rewards are clipped; control yes, without the clip)")
    g.add_argument("--max-kl", type=float, default=None,
                   help="trust region: an update that moves the policy further than this mean KL from the "
                        f"behaviour policy on its batch is shrunk to it (atari {d.max_kl:g}, vector "
                        f"{profiles.VECTOR['max_kl']:g}, control {profiles.CONTROL['max_kl']:g}; 0: off; "
                        "one learner only)")
    g.add_argument("--epochs", type=int, default=d.epochs,
                   help="optimizer steps on each batch, each on the loss recomputed with the current "
                        "parameters (PPO's epochs; V-trace's importance weights correct for the policy "
                        "having moved; with --max-kl the total move from the behaviour policy stays bounded); "
                        "one learner only")
    g.add_argument("--baseline-cost", type=float, default=d.baseline_cost)
    g.add_argument("--bound-cost", type=float, default=d.bound_cost,
                   help="Box actions: cost of the Gaussian mean's squared distance past the action bounds, "
                        "which keeps the policy from turning deterministic at a bound (0: off; other "
                        "action spaces have no such term)")
    g.add_argument("--discount", type=float, default=d.discount)
    g.add_argument("--reward-clip", type=float, default=None,
                   help=f"clip rewards to [-x, x]; 0 disables clipping (atari {d.reward_clip:g}, vector "
                        f"{profiles.VECTOR['reward_clip']:g}, control {profiles.CONTROL['reward_clip']:g})")
    g.add_argument("--device", default=d.device, help="cpu, cuda, cuda:1 ...")
    g.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="bf16: the torso runs under bf16 autocast in acting and learning (CPU with AVX-512 BF16 "
                        "or AMX, or CUDA); weights, optimizer state, core and losses stay fp32")
    g.add_argument("--learner-thread", action="store_true",
                   help="run updates in a learner thread while the actors go on with a copy of the model "
                        "(refreshed after each update); default: act and learn in turn in one thread")
    g.add_argument("--torch-threads", type=int, default=d.torch_threads,
                   help="torch intra-op threads of this process (default 0: chosen from the available cores "
                        "and the env processes, and printed at start)")


def config_from_args(args: argparse.Namespace, kind: str = "atari", memory_horizon: int | None = None,
                     max_episode_steps: int | None = None, settings: Iterable = (),
                     continuous_actions: bool = False) -> ImpalaConfig:
    """The run's config, checked (:func:`check_config`): the command line's values, the unset ones
    from the profile of the env's ``kind`` (see :mod:`rfwp_rl.impala.profiles`), and on top the
    ``--set`` trainer ``settings`` (:class:`rfwp_rl.overrides.Setting`, from :meth:`RunSpec.from_args`)."""
    from rfwp_rl.overrides import apply_to_trainer

    fields = {f.name for f in dataclasses.fields(ImpalaConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and k != "profile"}
    profile = profiles.profile_for(kind, getattr(args, "profile", "auto"), continuous_actions)
    for k in profiles.PROFILE_OPTIONS:
        given.setdefault(k, None)
    if given.get("group") and given["max_kl"] is None:
        given["max_kl"] = 0.0  # the trust region needs one learner (check_config)
    cfg = ImpalaConfig(**profiles.fill_unset(given, profile, memory_horizon, max_episode_steps), profile=profile)
    apply_to_trainer(cfg, settings)  # --set batch_size=... wins over flags and profile
    check_config(cfg)
    return cfg


def check_config(cfg: ImpalaConfig) -> None:
    """One-line :class:`UserError` for settings that cannot work."""
    from rfwp_rl.impala.multi_learner import check_group_args
    from rfwp_rl.impala.net import parse_address

    for name in ("total_steps", "num_actors", "num_env_batches", "num_env_processes", "batch_size", "unroll_length"):
        if getattr(cfg, name) < (0 if name == "num_actors" and cfg.listen else 1):
            raise UserError(f"--{name.replace('_', '-')} {getattr(cfg, name)} is invalid; allowed: an integer >= 1 "
                            "(>= 0 with --listen)")
    if cfg.listen:
        parse_address(cfg.listen, "--listen")
    check_group_args(cfg.broker, cfg.group)
    check_choice("env backend", cfg.env_backend, ENV_BACKENDS)
    check_choice("precision", cfg.precision, PRECISIONS)
    check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
    if not 0.0 <= cfg.advantage_floor < float("inf"):
        raise UserError(f"--advantage-floor {cfg.advantage_floor:g} is invalid; allowed: a number >= 0")
    if not 0.0 <= cfg.bound_cost < float("inf"):
        raise UserError(f"--bound-cost {cfg.bound_cost:g} is invalid; allowed: a number >= 0 (0: off)")
    if not 0.0 <= cfg.max_kl < float("inf"):
        raise UserError(f"--max-kl {cfg.max_kl:g} is invalid; allowed: a number >= 0 (0: off)")
    if cfg.group and cfg.max_kl > 0:
        raise UserError(f"--max-kl {cfg.max_kl:g} needs one learner: each learner of a group would shrink the "
                        "group's step by its own batch; with --group use --max-kl 0")
    if cfg.epochs < 1:
        raise UserError(f"--epochs {cfg.epochs} is invalid; allowed: an integer >= 1")
    if cfg.group and cfg.epochs > 1:
        raise UserError(f"--epochs {cfg.epochs} needs one learner: a group averages one gradient per batch "
                        "and member; with --group use --epochs 1")
    if not 0.0 <= cfg.vtrace_lambda <= 1.0:
        raise UserError(f"--vtrace-lambda {cfg.vtrace_lambda:g} is invalid; allowed: a number in [0, 1]")
    for name in ("learning_rate", "adam_eps"):
        if not getattr(cfg, name) > 0:
            raise UserError(f"--{name.replace('_', '-')} {getattr(cfg, name):g} is invalid; allowed: a number > 0")
    if not cfg.env_timeout > 0:
        raise UserError(f"--env-timeout {cfg.env_timeout:g} is invalid; allowed: seconds > 0 (inf: never time out)")
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise UserError(f"--device {cfg.device!r} is invalid; allowed: cpu, cuda, cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {cfg.device!r}: this torch build or machine has no CUDA device; use --device cpu")


def run(args: argparse.Namespace) -> int:
    from rfwp_rl.impala.config import trainer_keys

    run_spec = RunSpec.from_args(args, trainer_keys())
    cfg = config_from_args(args, run_spec.kind, run_spec.memory_horizon, run_spec.max_episode_steps,
                           run_spec.trainer_settings, continuous_actions=run_spec.action_space.get("type") == "Box")
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / "impala" / _run_name(
        run_spec.env.rpartition(":")[2], run_spec.preset.core, cfg.seed)
    return train(cfg, run_spec, run_dir, trust_checkpoint=args.trust_checkpoint)


def _run_name(env: str, core: str, seed: int) -> str:
    from rfwp_rl.runlog import run_name

    return run_name(env, core, f"s{seed}")


def train(cfg: ImpalaConfig, run: RunSpec, run_dir: Path, trust_checkpoint: bool = False) -> int:
    """Train until ``cfg.total_steps`` (resuming from ``run_dir``'s newest checkpoint; ``trust_checkpoint``:
    also from one that holds Python objects, see :func:`rfwp_rl.checkpoint.read_checkpoint`). Returns the exit code."""
    trainer = ImpalaTrainer(cfg, run, run_dir)
    trainer.trust_checkpoint = trust_checkpoint
    return run_trainer(trainer)


class ImpalaTrainer(Trainer):
    """The IMPALA trainer in the :mod:`rfwp_rl.scaffold`.

    Faults: a failed env (step, reset or construction raised) is replaced and counted
    (``max_env_failures``); an env that fails ``MAX_FAILED_CONSTRUCTIONS`` times in a row before
    its first observation stops the run (checkpoint, exit 1, one line naming it); a dead moolib
    worker process or a hung env (no result for ``cfg.env_timeout`` s) -> checkpoint, end the
    pool, re-execute this command (moolib cannot make a second EnvPool in one process), which
    resumes; SIGINT/SIGTERM, also while waiting on envs -> checkpoint, exit 0 (workers stuck in
    an env are ended); non-finite updates are skipped.

    With ``cfg.broker``/``cfg.group`` this learner is one of a group (:mod:`rfwp_rl.impala.multi_learner`):
    the learner's step counters and LR schedule are the group's, and each learner writes its own
    run directory (the same model; its own actors' counters).
    """

    unit, metrics = "env steps", METRICS

    def __init__(self, cfg: ImpalaConfig, run: RunSpec, run_dir: Path, pool: object = None):
        """``pool``: an env pool to use (and leave open) instead of making one (the benchmark)."""
        from rfwp_rl.encoders import has_image_torso
        from rfwp_rl.impala.learner import Learner

        self.cfg, self.run, self.run_dir = cfg, run, Path(run_dir)
        self.total, self.print_every = cfg.total_steps, cfg.log_every
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.device = torch.device(cfg.device)
        agent = run.build_agent(self.device)
        env_processes = cfg.num_env_processes if cfg.num_actors and cfg.env_backend == "moolib" else 0
        self.threads, why = choose_torch_threads(cfg.torch_threads, env_processes,
                                                 has_image_torso(agent.torso))
        set_torch_threads(self.threads)
        self.threads_note = f"{self.threads} torch thread(s) ({why})"
        self.learner = Learner(agent, cfg)
        self.meta = run.meta(agent)
        self.legacy_metas = tuple(run.legacy_metas(agent))
        self.counts = {"actor_steps": 0, "episodes": 0, "train_seconds": 0.0, "env_failures": 0,
                       "best_return": -math.inf}
        self.returns: deque[float] = deque(maxlen=BEST_WINDOW)
        self.timers = Timers()
        self.restart = False
        self.pool, self.own_pool = pool, pool is None
        self.server = self.group = self.actors = self.learning = None

    @property
    def step(self) -> int:
        return self.learner.step

    # ---- checkpoints
    def load_state_dict(self, state: dict, path: Path, step: int) -> None:
        self.learner.load_state_dict(state)
        self.counts.update({k: state["counters"][k] for k in self.counts if k in state["counters"]})
        print(f"resuming {self.run_dir} from step {self.step:,} ({path.name})", flush=True)

    def state_dict(self) -> dict:
        with self.learner.lock:
            state = self.learner.state_dict()
            state["counters"].update(self.counts, actor_steps=self.actor_steps0 + self.actors.env_steps,
                                     train_seconds=time.monotonic() - self.start_time,
                                     env_failures=self.actors.env_failures)
            state["config"] = dataclasses.asdict(self.cfg)
        return state

    # ---- start: env pool (moolib forks its workers here, before any thread), remote actors, group
    def prepare(self) -> str | None:
        from rfwp_rl.impala.learner import Learning
        from rfwp_rl.impala.multi_learner import LearnerGroup, Solo
        from rfwp_rl.impala.rollout_server import NoLocalActors, RolloutServer, compat_info

        cfg, learner = self.cfg, self.learner
        if learner.step >= cfg.total_steps:
            return (f"{self.run_dir} already reached {learner.step:,} >= --total-steps {cfg.total_steps:,} steps; "
                    "nothing to do")
        env_seed = cfg.seed + 1000 * learner.updates  # fresh episodes (local backend: new seeds) on resume
        if cfg.num_actors and self.pool is None:
            self.pool = self.run.make_env_pool(cfg.env_backend, env_seed, cfg.num_actors, cfg.num_env_batches,
                                               cfg.num_env_processes)
        info = compat_info(self.run, learner.agent)
        if cfg.listen or cfg.broker:  # every peer proves the shared key (before any Rpc exists)
            from rfwp_rl.impala.net import resolve_address
            from rfwp_rl.impala.wire import resolve_key, secure_moolib

            key = resolve_key(cfg.auth_key_file, create=not cfg.broker, role="a learner joining a group")
            secure_moolib(key, [resolve_address(cfg.listen, "--listen")] if cfg.listen else [],
                          [resolve_address(cfg.broker, "--broker")] if cfg.broker else [])
        try:
            if cfg.listen:  # an Rpc endpoint, opened after the pool has forked
                from rfwp_rl.impala.actors import rollout_spec

                agent = learner.agent
                self.server = RolloutServer(cfg.listen, learner, info, max_pending=2 * cfg.batch_size,
                                            layout=rollout_spec(agent.obs_space, agent.action_dist),
                                            actions_ok=agent.action_dist.valid)
                print(f"listening for remote actors on {cfg.listen}", flush=True)
            if cfg.broker:
                settings = {**info, **{k: getattr(cfg, k) for k in GROUP_SETTINGS}}
                self.group = LearnerGroup(cfg.broker, cfg.group, learner, settings, cfg.seed, cfg.total_steps)
            else:
                self.group = Solo(learner)
        except BaseException:  # e.g. a learner group that refuses this learner: no worker outlives it
            from rfwp_rl.impala.env_pool import shutdown_env_pool

            if self.server is not None:
                self.server.close(grace=0.0)
            shutdown_env_pool(self.pool)
            raise
        self.learning = Learning(learner, self.group, thread=cfg.learner_thread)
        if self.pool is None:
            self.actors = NoLocalActors(self.counts["env_failures"])
        else:
            from rfwp_rl.impala.actors import Actors

            self.actors = Actors(self.pool, self.learning.acting_agent, cfg.num_actors, cfg.num_env_batches,
                                 cfg.unroll_length, self.device, max_env_failures=cfg.max_env_failures,
                                 env_failures=self.counts["env_failures"], env_timeout=cfg.env_timeout,
                                 precision=cfg.precision, timers=self.timers)
        from rfwp_rl.impala.actors import RolloutQueue

        self.queue = RolloutQueue(cfg.batch_size)
        self._start_clocks()
        return None

    def _start_clocks(self) -> None:
        now = time.monotonic()
        self.actor_steps0 = self.counts["actor_steps"]
        self.start_time = now - self.counts["train_seconds"]
        self.last_checkpoint = now
        self.rate = (now, 0, self.learner.updates)  # time, actor env steps, updates at the last console line
        self.snapshots_due = sorted(s for s in self.cfg.snapshot_steps if s > self.learner.step)
        self.adoptions = self.learner.adoptions
        self.dropped_batches = 0
        self.refused_connections = 0
        self.last_stats: dict[str, float] = {}

    def hparams(self) -> dict:
        agent, cfg = self.learner.agent, self.cfg
        num_params = sum(p.numel() for p in agent.parameters())
        print(f"IMPALA {self.run.env} ({self.run.num_actions} actions), core {self.run.preset.core} "
              f"({num_params:,} parameters), {cfg.num_actors} envs [{cfg.env_backend}], batch {cfg.batch_size} x "
              f"unroll {cfg.unroll_length}, {cfg.precision}, {self.threads_note}; run dir {self.run_dir}", flush=True)
        print(profiles.describe(cfg, self.run.preset.source), flush=True)
        return {**dataclasses.asdict(cfg), "core": self.run.preset.core,
                **{f"core_config.{k}": v for k, v in agent.core.config.items()},
                **{f"agent.{k}": v for k, v in agent.config.to_dict().items()},
                "env_options": self.run.env_options, "num_actions": self.run.num_actions, "num_params": num_params}

    # ---- the loop
    def train(self, stop: GracefulStop) -> None:
        """Until the step target or a stop request: :meth:`iterate`, then logs and checkpoints."""
        self.actors.should_stop = stop.is_requested  # also while waiting on envs
        try:
            while self.learner.step < self.cfg.total_steps and not stop.requested:
                self.iterate()
                self.bookkeeping()
            self.report(time.monotonic())  # the last step's return and rates (a run may end between reports)
        except EnvPoolBroken as e:
            self.restart = True
            self.actors.env_failures += 1  # the dead worker counts as one env failure
            print(f"error: environment pool broken ({e}); saving a checkpoint and restarting", file=sys.stderr,
                  flush=True)
        finally:
            self.learning.close()  # a learner thread's error (TrainingAborted) is raised here

    def iterate(self) -> None:
        """One pass of the loop: the group finishes rounds (optimizer steps), a full batch becomes
        gradients, and otherwise the actors act."""
        cfg, group = self.cfg, self.group
        group.sync()  # alone: nothing; in a group: a finished round is one optimizer step here
        if self.queue.ready() and group.wants_gradients() and self.handed_in() < cfg.total_steps:
            with self.timers("learning"):
                self.learning.submit(self.queue.get())  # alone: one update; in a group: this round's share
        else:
            self.collect()  # one env step of one env batch, and the remote actors' rollouts
        group.idle()  # nothing handed in: the group's round goes on without this learner
        self.drop_stale_batches()
        if self.learning.thread is not None and self.handed_in() >= cfg.total_steps:
            self.learning.wait_idle()

    def handed_in(self) -> int:
        """Env steps trained, plus those handed to the learner thread or to the group's round under way."""
        return self.learner.step + self.group.in_flight + self.learning.pending_steps

    def collect(self) -> None:
        """One env step of the next local env batch, plus the remote actors' rollouts: finished
        rollouts go to the queue of learner batches, finished episodes to the statistics."""
        with self.learning.acting_lock:
            rollouts, episodes = self.actors.step()
        if self.server is not None:  # remote actors' rollouts join the same learner batches
            remote, remote_episodes = self.server.take(wait=0.0 if self.pool is not None else 0.05)
            rollouts, episodes = rollouts + remote, episodes + remote_episodes
        for ret, length in episodes:
            self.counts["episodes"] += 1
            self.returns.append(ret)
            self.logger.log(self.learner.step, {"episode/return": ret, "episode/length": length})
        for r in rollouts:
            self.queue.put(r)

    def drop_stale_batches(self) -> None:
        """While a learner group takes no gradients (joining), keep only the newest few batches."""
        while self.queue.size > MAX_WAITING_BATCHES * self.cfg.batch_size:
            self.queue.get()
            self.dropped_batches += 1

    # ---- bookkeeping: TensorBoard, console, snapshots, periodic checkpoints
    def bookkeeping(self) -> None:
        while not self.learner.learned.empty():
            step, stats = self.learner.learned.get()
            self.logger.log(step, {k: v for k, v in stats.items() if math.isfinite(v)})
            self.last_stats = stats
        if self.learner.adoptions != self.adoptions:  # took a group's model: its step count, no snapshots between
            self.adoptions = self.learner.adoptions
            self.snapshots_due = [s for s in self.snapshots_due if s > self.learner.step]
        while self.snapshots_due and self.learner.step >= self.snapshots_due[0]:
            self.snapshots_due.pop(0)
            self.save(snapshot_step=self.learner.step)
        now = time.monotonic()
        if now - self.rate[0] >= self.cfg.log_every:
            self.report(now)
        if now - self.last_checkpoint >= self.cfg.checkpoint_every:
            self.save()
            self.last_checkpoint = now

    def report(self, now: float) -> None:
        """Rates, returns, group and remote-actor statistics: to TensorBoard and one console line."""
        step, (t, actor_steps, updates) = self.learner.step, self.rate
        env_sps = (self.actors.env_steps - actor_steps) / max(now - t, 1e-9)
        ups = (self.learner.updates - updates) / max(now - t, 1e-9)
        skipped = self.learner.guard.skipped
        self.logger.log(step, {"perf/env_sps": env_sps, "perf/learner_steps_per_s": ups,
                               "perf/train_sps": ups * self.learner.steps_per_update,
                               "learner/skipped_total": skipped, "train/skipped_updates": skipped,
                               "perf/train_minutes": (now - self.start_time) / 60.0})
        extra: dict = {"env_sps": round(env_sps), "episodes": self.counts["episodes"]}
        if self.returns:
            extra["return(100)"] = float(np.mean(self.returns))
            self.logger.log(step, {"episode/return_mean100": extra["return(100)"]})
            self.keep_best(extra["return(100)"])
        group_stats = self.group.stats()
        if group_stats:
            self.logger.log(step, {**group_stats, "group/dropped_batches": self.dropped_batches})
            extra["learners"] = int(group_stats["group/size"])
        if self.server is not None:
            remote = self.server.stats(now)
            self.logger.log(step, remote)
            extra.update(remote_actors=int(remote["remote/actors"]), remote_sps=round(remote["remote/env_sps"]),
                         policy_lag=remote["remote/policy_lag"])
        if self.server is not None or self.cfg.broker:  # peers that failed the key handshake (moolib drops them)
            from rfwp_rl.impala.wire import refused_connections

            refused = refused_connections()
            self.logger.log(step, {"net/refused_connections": float(refused)})
            if refused > self.refused_connections:
                print(f"warning: {refused - self.refused_connections} connection(s) without the shared key refused "
                      f"({refused} in all)", file=sys.stderr, flush=True)
            self.refused_connections = refused
        if "loss/total" in self.last_stats:
            extra["loss"] = self.last_stats["loss/total"]
        self.logger.progress(step, **extra)
        self.rate = (now, self.actors.env_steps, self.learner.updates)

    def keep_best(self, mean_return: float) -> None:
        """``best.pt`` when the mean return of the last :data:`BEST_WINDOW` episodes beats every
        earlier one (of this run, resumes included; only once the window is full)."""
        if len(self.returns) == BEST_WINDOW and mean_return > self.counts["best_return"]:
            self.counts["best_return"] = mean_return
            self.save_best(mean_return)

    # ---- the end
    def aborted(self, error: TrainingAborted, saved: Path | None) -> None:
        print(f"error: training aborted: {error}; the last good model is saved", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Leave the group, stop serving remote actors, end the env workers (all of them on a restart)."""
        from rfwp_rl.impala.env_pool import shutdown_env_pool

        if self.logger is not None and self.actors is not None:
            self.logger.progress(self.step, force=True, episodes=self.counts["episodes"],
                                 **({"return(100)": float(np.mean(self.returns))} if self.returns else {}))
        if self.group is not None:
            self.group.close(finished=self.step >= self.cfg.total_steps)
        if self.server is not None:
            self.server.close()
        if not self.own_pool:
            return
        if self.restart:
            shutdown_env_pool(self.pool)
        else:
            if self.actors is not None:  # a hung env's worker must not outlive this process
                self.actors.release()
            if hasattr(self.pool, "close"):
                self.pool.close()
        self.pool = None

    def finish(self, code: int, saved: Path | None) -> int:
        from rfwp_rl.impala.env_pool import reexec_argv

        step, limit = self.step, self.cfg.max_env_failures
        if self.restart and saved is not None:
            if self.actors.env_failures > limit:
                print(f"error: {self.actors.env_failures} environment failures (limit --max-env-failures {limit}); "
                      f"stopped at step {step:,}; checkpoint {saved}", file=sys.stderr)
                return 1
            argv = reexec_argv()
            if argv is None:
                print(f"stopped at step {step:,}; checkpoint {saved}; re-run to resume", file=sys.stderr)
                return 1
            print(f"restarting at step {step:,}: {' '.join(argv)}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os.execv(sys.executable, argv)
        status = "stopped" if step < self.cfg.total_steps else "finished"
        print(f"{status} at step {step:,}; checkpoint {saved or '(not written)'}", flush=True)
        return code
