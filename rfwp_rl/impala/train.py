"""``rfwp-rl train``: IMPALA / V-trace on Atari or any gymnasium env whose spaces the agent supports.

One process holds the model, the actors' inference and the learner (as in TorchBeast's
monobeast and moolib's IMPALA example); the environments run in ``moolib.EnvPool`` worker
processes, stepped in two alternating batches so that env stepping overlaps inference.
:meth:`ImpalaTrainer.train` is the loop, top to bottom: if a full batch is ready, one optimizer
step on it (:meth:`rfwp_rl.impala.learner.Learner.update`) -> else step one env batch and collect
finished rollouts -> log, checkpoint. A learner of a group (``--broker``) first lets the group
finish a round (one optimizer step) and hands its batch's gradients to the group instead
(:mod:`rfwp_rl.impala.multi_learner`). Defaults are the paper's settings
(:mod:`rfwp_rl.impala.config`); the run setup is :mod:`rfwp_rl.impala.run_spec`, the resume
order :mod:`rfwp_rl.scaffold`.

Examples::

    rfwp-rl train --env Pong --core rdn                      # agents/atari_rdn.toml, the --total-steps default
    rfwp-rl train --env CartPole-v1 --core lstm --total-steps 200000 --num-actors 8 \\
        --unroll-length 20 --batch-size 8
    rfwp-rl train --env Pong --preset my_agent.toml --set core_config.hidden_size=64 --set entropy_cost=0.005
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rfwp_rl import flags
from rfwp_rl.agent import count_parameters
from rfwp_rl.checkpoint import add_trust_argument, list_checkpoints
from rfwp_rl.encoders import has_image_torso
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.impala import profiles
from rfwp_rl.impala.actors import Actors, RolloutQueue, choose_actor_device, rollout_spec
from rfwp_rl.impala.config import ACTOR_DEVICES, DEFAULTS, ENV_BACKENDS, OPTIMIZERS, ImpalaConfig, trainer_keys
from rfwp_rl.impala.env_batches import EnvPoolBroken, reexec_argv, shutdown_env_pool
from rfwp_rl.impala.learner import Learner, Learning
from rfwp_rl.impala.multi_learner import LearnerGroup, check_group_args
from rfwp_rl.impala.net import parse_address, resolve_address
from rfwp_rl.impala.rollout_server import NoLocalActors, RolloutServer, compat_info
from rfwp_rl.impala.run_spec import DEFAULT_CORE, RunSpec, add_run_arguments
from rfwp_rl.impala.wire import refused_connections, refused_model_updates, resolve_key, secure_moolib
from rfwp_rl.overrides import apply_to_trainer, typed_like
from rfwp_rl.perf import PRECISIONS, Timers, choose_torch_threads, set_torch_threads
from rfwp_rl.runlog import run_name
from rfwp_rl.safety import GracefulStop, TrainingAborted
from rfwp_rl.scaffold import Trainer, run_trainer

__all__ = ["DEFAULT_CORE", "ImpalaTrainer", "add_arguments", "run", "train"]

METRICS = ("episode/return", "episode/return_mean100")
# Settings every learner of a group must share (checked when a learner joins), besides the env and agent.
GROUP_SETTINGS = (
    "total_steps",
    "batch_size",
    "unroll_length",
    "learning_rate",
    "rmsprop_alpha",
    "rmsprop_eps",
    "rmsprop_momentum",
    "grad_norm_clip",
    "entropy_cost",
    "baseline_cost",
    "bound_cost",
    "recall_cost",
    "discount",
    "reward_clip",
    "clip_rho",
    "clip_c",
    "optimizer",
    "adam_eps",
    "normalize_advantages",
    "advantage_floor",
    "advantage_min",
    "normalize_value_loss",
    "vtrace_lambda",
    "max_kl",
    "normalize_returns",
    "epochs",
)
BEST_WINDOW = 100  # best.pt: the mean return of the last this many episodes, once that many ended since the start
MAX_WAITING_BATCHES = 4  # full batches held while a learner group takes no gradients (joining); older ones are dropped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("what to train")
    add_run_arguments(g)
    flags.add_fields(g, ImpalaConfig, "seed", "total_steps")
    _add_actor_arguments(parser.add_argument_group("actors"))
    _add_learner_arguments(parser.add_argument_group("learner (RFWP paper App. C)"))
    g = parser.add_argument_group("bookkeeping")
    flags.add_run_dir_argument(
        g,
        "runs/impala/<env>_<core>_s<seed>; characters other than letters, digits, . + - "
        "in names become -, e.g. ALE-Pong-v5_delta-rnn_s1",
    )
    flags.add_fields(g, ImpalaConfig, "checkpoint_every", "snapshot_steps", "log_every", "max_nonfinite")
    add_trust_argument(g)


def _add_actor_arguments(g: argparse._ArgumentGroup) -> None:
    flags.add_field(
        g,
        ImpalaConfig,
        "num_actors",
        default=None,
        help=f"{_by_profile('num_actors')}; with --listen, 0: train only on remote actors' rollouts",
    )
    flags.add_fields(
        g,
        ImpalaConfig,
        "num_env_batches",
        "num_env_processes",
        "env_backend",
        "listen",
        "broker",
        "auth_key_file",
        "group",
        "max_env_failures",
        "env_timeout",
    )


def _by_profile(name: str, fmt: str = "{}", control: bool = True) -> str:
    """``atari X, vector Y, control Z``: the profiles' values of a setting the command line leaves unset."""

    def show(value: object) -> str:
        return ("yes" if value else "no") if isinstance(value, bool) else fmt.format(value)

    names = ("atari", "vector", "control") if control else ("atari", "vector")
    return ", ".join(f"{p} {show(getattr(profiles, p.upper())[name])}" for p in names)


def _add_learner_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--profile",
        choices=profiles.PROFILES,
        default="auto",
        help="defaults of the options left unset: atari (the paper's), vector (memory tasks: unroll = "
        "2 x the env's memory horizon, Adam, normalised advantages), control (vector "
        "observations and continuous actions: the vector profile with 4 envs and batch 4 x unroll 16, "
        "return scaling instead of the reward clip, plain advantage RMS, no entropy bonus, no "
        "trust region and no recall task), "
        "auto: by the env's spaces (default %(default)s)",
    )
    unset = {  # settings the profile fills where the command line gives none: their help names each profile's value
        "batch_size": f"atari {profiles.ATARI['batch_size']}; vector: about {profiles.VECTOR_STEPS_PER_UPDATE} env "
        f"steps / unroll, {profiles.MIN_BATCH} to {profiles.VECTOR['batch_size']}; control "
        f"{profiles.CONTROL['batch_size']}",
        "unroll_length": f"atari {profiles.ATARI['unroll_length']}; vector: 2 x the memory horizon the env "
        f"states, {profiles.MIN_UNROLL} to {profiles.MAX_STATED_UNROLL}, else 2 x its episode limit, "
        f"{profiles.MIN_UNROLL} to {profiles.MAX_UNROLL}; control: the same where the env states a "
        f"memory horizon, else {profiles.CONTROL_UNROLL}",
        "optimizer": _by_profile("optimizer", control=False),
        "learning_rate": _by_profile("learning_rate", "{:g}", control=False),
        "entropy_cost": _by_profile("entropy_cost", "{:g}"),
        "vtrace_lambda": _by_profile("vtrace_lambda", "{:g}", control=False),
        "normalize_advantages": _by_profile("normalize_advantages", control=False),
        "normalize_value_loss": _by_profile("normalize_value_loss"),
        "advantage_floor": _by_profile("advantage_floor", "{:g}"),
        "advantage_min": _by_profile("advantage_min", "{:g}"),
        "normalize_returns": _by_profile("normalize_returns"),
        "max_kl": _by_profile("max_kl", "{:g}"),
        "reward_clip": _by_profile("reward_clip", "{:g}"),
        "recall_cost": _by_profile("recall_cost", "{:g}"),
    }
    assert set(unset) == set(profiles.PROFILE_OPTIONS) - {"num_actors"}, "every profile option needs its flag here"
    for f in dataclasses.fields(ImpalaConfig):
        if f.name in unset:
            own = f.metadata["help"]
            flags.add_field(g, ImpalaConfig, f.name, default=None, help=f"{own}; " * bool(own) + unset[f.name])
    flags.add_fields(
        g,
        ImpalaConfig,
        "adam_eps",
        "rmsprop_alpha",
        "rmsprop_eps",
        "rmsprop_momentum",
        "grad_norm_clip",
        "epochs",
        "baseline_cost",
        "bound_cost",
        "discount",
        "clip_rho",
        "clip_c",
        "device",
        "precision",
        "learner_thread",
        "actor_device",
        "acting_graph",
        "torch_threads",
    )


def config_from_args(
    args: argparse.Namespace,
    kind: str = "atari",
    memory_horizon: int | None = None,
    max_episode_steps: int | None = None,
    settings: Iterable = (),
    continuous_actions: bool = False,
    saved: Mapping[str, Any] | None = None,
) -> ImpalaConfig:
    """The run's config, checked (:func:`check_config`): the command line's values, the unset ones
    from ``saved`` (a resumed run's own, :func:`saved_settings`), the rest from the profile of the env's
    ``kind`` (see :mod:`rfwp_rl.impala.profiles`), and on top the ``--set`` trainer ``settings``
    (:class:`rfwp_rl.overrides.Setting`, from :meth:`RunSpec.from_args`)."""
    fields = {f.name for f in dataclasses.fields(ImpalaConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and k != "profile"}
    profile = profiles.profile_for(kind, getattr(args, "profile", "auto"), continuous_actions)
    for k in profiles.PROFILE_OPTIONS:
        given.setdefault(k, None)
    if given.get("group") and given["max_kl"] is None:
        given["max_kl"] = 0.0  # the trust region needs one learner (check_config), also in a resumed run
    given.update({k: v for k, v in (saved or {}).items() if given.get(k) is None})
    cfg = ImpalaConfig(**profiles.fill_unset(given, profile, memory_horizon, max_episode_steps), profile=profile)
    apply_to_trainer(cfg, settings)  # --set batch_size=... wins over flags and profile
    check_config(cfg)
    return cfg


# the number settings' ranges (flags.check_ranges); NaN is in none
NUMBER_RANGES: dict[str, flags.Range] = {
    **flags.shared_ranges("learning_rate", "adam_eps"),
    "rmsprop_eps": flags.Range(closed="()"),
    "rmsprop_alpha": flags.Range(0, 1, "[]"),
    "rmsprop_momentum": flags.Range(0, 1, "[)"),
    **flags.shared_ranges("entropy_cost", "baseline_cost"),
    "recall_cost": flags.Range(note="0: off"),
    "bound_cost": flags.Range(note="0: off"),
    **flags.shared_ranges("discount"),
    "reward_clip": flags.Range(note="0: no clipping"),
    "clip_rho": flags.Range(0, math.inf, "(]", "inf: no clipping"),
    "clip_c": flags.Range(0, math.inf, "(]", "inf: no clipping"),
    "vtrace_lambda": flags.Range(0, 1, "[]"),
    "advantage_floor": flags.Range(),
    "advantage_min": flags.Range(note="0: no minimum"),
    "max_kl": flags.Range(note="0: off"),
    **flags.shared_ranges("grad_norm_clip", "checkpoint_every", "log_every"),
}


def check_config(cfg: ImpalaConfig) -> None:
    """One-line :class:`UserError` for settings that cannot work."""
    for name in ("total_steps", "num_actors", "num_env_batches", "num_env_processes", "batch_size", "unroll_length"):
        if getattr(cfg, name) < (0 if name == "num_actors" and cfg.listen else 1):
            listening = " (>= 0 with --listen: remote actors only)" if name == "num_actors" else ""
            value = getattr(cfg, name)
            raise UserError(f"--{name.replace('_', '-')} {value} is invalid; allowed: an integer >= 1{listening}")
    if cfg.listen:
        parse_address(cfg.listen, "--listen")
    check_group_args(cfg.broker, cfg.group)
    check_choice("env backend", cfg.env_backend, ENV_BACKENDS)
    check_choice("actor device", cfg.actor_device, ACTOR_DEVICES)
    check_choice("precision", cfg.precision, PRECISIONS)
    check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
    flags.check_ranges(cfg, NUMBER_RANGES)
    if cfg.group and cfg.max_kl > 0:
        raise UserError(
            f"--max-kl {cfg.max_kl:g} needs one learner: each learner of a group would shrink the "
            "group's step by its own batch; with --group use --max-kl 0"
        )
    if cfg.epochs < 1:
        raise UserError(f"--epochs {cfg.epochs} is invalid; allowed: an integer >= 1")
    if cfg.group and cfg.epochs > 1:
        raise UserError(
            f"--epochs {cfg.epochs} needs one learner: a group averages one gradient per batch "
            "and member; with --group use --epochs 1"
        )
    if not cfg.env_timeout > 0:
        raise UserError(f"--env-timeout {cfg.env_timeout:g} is invalid; allowed: seconds > 0 (inf: never time out)")
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise UserError(f"--device {cfg.device!r} is invalid; allowed: cpu, cuda, cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {cfg.device!r}: this torch build or machine has no CUDA device; use --device cpu")
    if cfg.actor_device == "cuda" and not torch.cuda.is_available():
        raise UserError("--actor-device 'cuda': this torch build or machine has no CUDA device; use cpu or auto")


def saved_settings(run_dir: Path) -> dict:
    """The profile options a run that has a checkpoint was trained with (its ``config.json``), so that a resume
    keeps them where the command line gives none, whatever the profile's defaults have become since; ``{}``
    for a run without a checkpoint or without the file. A value of the wrong type is a one-line UserError."""
    path = run_dir / "config.json"
    if not list_checkpoints(run_dir) or not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path}: not the run's config ({e}); give the run's settings on the command line") from None
    if not isinstance(saved, dict):
        raise UserError(f"{path}: not the run's config (a {type(saved).__name__}, not an object)")
    kept = {}
    for name in profiles.PROFILE_OPTIONS:
        if name not in saved:
            continue  # an option added since the run was saved: the profile's value
        default = getattr(DEFAULTS, name)
        ok, value = typed_like(saved[name], default)
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            raise UserError(f"{path}: {name} is {saved[name]!r}; allowed: a {type(default).__name__}")
        kept[name] = value
    return kept


def run(args: argparse.Namespace) -> int:
    run_spec = RunSpec.from_args(args, trainer_keys())
    run_dir = (
        Path(args.run_dir)
        if args.run_dir
        else Path("runs") / "impala" / _run_name(run_spec.env.rpartition(":")[2], run_spec.preset.core, args.seed)
    )

    def config(saved: Mapping[str, Any]) -> ImpalaConfig:
        return config_from_args(
            args,
            run_spec.kind,
            run_spec.memory_horizon,
            run_spec.max_episode_steps,
            run_spec.trainer_settings,
            continuous_actions=run_spec.action_space.get("type") == "Box",
            saved=saved,
        )

    saved = saved_settings(run_dir)
    cfg = config(saved)
    today = config({}) if saved else cfg
    kept = [
        f"{k} {getattr(cfg, k)} (the profile's: {getattr(today, k)})"
        for k in saved
        if getattr(cfg, k) != getattr(today, k)
    ]
    if kept:
        print(f"resuming with the run's own settings where the command line gives none: {', '.join(kept)}", flush=True)
    return train(cfg, run_spec, run_dir, trust_checkpoint=args.trust_checkpoint)


def _run_name(env: str, core: str, seed: int) -> str:
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
        self.cfg, self.run, self.run_dir = cfg, run, Path(run_dir)
        self.total, self.log_every = cfg.total_steps, cfg.log_every
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.device = torch.device(cfg.device)
        agent = run.build_agent(self.device)
        env_processes = cfg.num_env_processes if cfg.num_actors and cfg.env_backend != "local" else 0
        self.threads, why = choose_torch_threads(
            cfg.torch_threads, env_processes, has_image_torso(agent.torso), gpu=self.device.type == "cuda"
        )
        set_torch_threads(self.threads)
        self.threads_note = f"{self.threads} torch thread(s) ({why})"
        self.learner = Learner(agent, cfg)
        self.meta = run.meta(agent)
        self.counts = {
            "actor_steps": 0,
            "episodes": 0,
            "train_seconds": 0.0,
            "env_failures": 0,
            "best_return": None,  # none yet: no window of episodes has filled (no infinity in a checkpoint)
        }
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
        self.counts.update({k: state["counters"][k] for k in self.counts})
        print(f"resuming {self.run_dir} from step {self.step:,} ({path.name})", flush=True)

    def state_dict(self) -> dict:
        with self.learner.lock:
            state = self.learner.state_dict()
            state["counters"].update(
                self.counts,
                actor_steps=self.actor_steps0 + self.actors.env_steps,
                train_seconds=time.monotonic() - self.start_time,
                env_failures=self.actors.env_failures,
            )
            state["config"] = dataclasses.asdict(self.cfg)
        return state

    # ---- start: env pool (moolib forks its workers here, before any thread), remote actors, group
    def prepare(self) -> str | None:
        cfg, learner = self.cfg, self.learner
        if learner.step >= cfg.total_steps:
            return (
                f"{self.run_dir} already reached {learner.step:,} >= --total-steps {cfg.total_steps:,} steps; "
                "nothing to do"
            )
        env_seed = cfg.seed + 1000 * learner.updates  # fresh episodes (local backend: new seeds) on resume
        if cfg.num_actors and self.pool is None:
            self.pool = self.run.make_env_pool(
                cfg.env_backend, env_seed, cfg.num_actors, cfg.num_env_batches, cfg.num_env_processes
            )
        info = compat_info(self.run, learner.agent)
        if cfg.listen or cfg.broker:  # every peer proves the shared key (before any Rpc exists)
            key = resolve_key(cfg.auth_key_file, create=not cfg.broker, role="a learner joining a group")
            secure_moolib(
                key,
                [resolve_address(cfg.listen, "--listen")] if cfg.listen else [],
                [resolve_address(cfg.broker, "--broker")] if cfg.broker else [],
            )
        try:
            if cfg.listen:  # an Rpc endpoint, opened after the pool has forked
                agent = learner.agent
                self.server = RolloutServer(
                    cfg.listen,
                    learner,
                    info,
                    max_pending=2 * cfg.batch_size,
                    layout=rollout_spec(agent.obs_space, agent.action_dist),
                    actions_ok=agent.action_dist.valid,
                    reward_range=self.run.reward_range,
                )
                print(f"listening for remote actors on {cfg.listen}", flush=True)
            if cfg.broker:
                settings = {**info, **{k: getattr(cfg, k) for k in GROUP_SETTINGS}}
                self.group = LearnerGroup(cfg.broker, cfg.group, learner, settings, cfg.seed, cfg.total_steps)
        except BaseException:  # e.g. a learner group that refuses this learner: no worker outlives it
            if self.server is not None:
                self.server.close(grace=0.0)
            shutdown_env_pool(self.pool)
            raise
        self.actor_device, why = choose_actor_device(
            cfg.actor_device, learner.agent, self.device, max(1, cfg.num_actors // cfg.num_env_batches)
        )
        self.actor_device_note = f"actors on {self.actor_device} ({why})"
        # by default, with a GPU learner acting goes on while it learns (the GPU works while the CPU steps envs)
        thread = self.device.type == "cuda" if cfg.learner_thread is None else cfg.learner_thread
        self.learning = Learning(learner, self.group, thread=thread, acting_device=self.actor_device)
        self.actor_device_note += ", learning in its own thread" if thread else ""
        if self.pool is None:
            self.actors = NoLocalActors(self.counts["env_failures"])
        else:
            self.actors = Actors(
                self.pool,
                self.learning.acting_agent,
                cfg.num_actors,
                cfg.num_env_batches,
                cfg.unroll_length,
                self.actor_device,
                max_env_failures=cfg.max_env_failures,
                env_failures=self.counts["env_failures"],
                env_timeout=cfg.env_timeout,
                precision=cfg.precision,
                timers=self.timers,
                acting_graph=cfg.acting_graph,
            )
            if self.actor_device.type == "cuda":
                self.actor_device_note += f", CUDA graph: {self.actors.graph_note}"
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
        self.refused_updates = 0
        self.last_stats: dict[str, float] = {}

    def upgrade_meta(self, saved: dict) -> dict:
        return RunSpec.upgrade_meta(saved)

    def hparams(self) -> dict:
        agent, cfg = self.learner.agent, self.cfg
        num_params = count_parameters(agent)
        recall = ""
        if agent.recall is not None and cfg.recall_cost > 0:
            symbols = " (features and the grid's symbols)" if agent.recall.symbols is not None else ""
            recall = f"; recall task{symbols} over up to {agent.recall.lags} steps, cost {cfg.recall_cost:g}"
        print(
            f"IMPALA {self.run.env} ({self.run.num_actions} actions), core {self.run.preset.core} "
            f"({num_params:,} parameters{recall}), {cfg.num_actors} envs [{cfg.env_backend}], batch {cfg.batch_size} x "
            f"unroll {cfg.unroll_length}, {cfg.precision}, {self.threads_note}, {self.actor_device_note}; "
            f"run dir {self.run_dir}",
            flush=True,
        )
        print(profiles.describe(cfg, self.run.preset.source, agent.action_dist.has_bounds), flush=True)
        return {
            **dataclasses.asdict(cfg),
            "core": self.run.preset.core,
            **{f"core_config.{k}": v for k, v in agent.core.config.items()},
            **{f"agent.{k}": v for k, v in agent.config.to_dict().items()},
            "env_options": self.run.env_options,
            "num_actions": self.run.num_actions,
            "num_params": num_params,
        }

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
            print(
                f"error: environment pool broken ({e}); saving a checkpoint and restarting", file=sys.stderr, flush=True
            )
        finally:
            self.learning.close()  # a learner thread's error (TrainingAborted) is raised here

    def iterate(self) -> None:
        """One pass of the loop: a full batch becomes an update, and otherwise the actors act. In a
        learner group, the group first finishes its rounds (optimizer steps), and a full batch becomes
        this learner's share of a round when the group takes gradients."""
        cfg, group = self.cfg, self.group
        if group is not None:
            group.sync()  # a finished round is one optimizer step here
        if self.queue.ready() and (group is None or group.wants_gradients()) and self.handed_in() < cfg.total_steps:
            with self.timers("learning"):
                self.learning.submit(self.queue.get())
        else:
            self.collect()  # one env step of one env batch, and the remote actors' rollouts
        if group is not None:
            group.idle()  # nothing handed in: the group's round goes on without this learner
        self.drop_stale_batches()
        if self.learning.thread is not None and self.handed_in() >= cfg.total_steps:
            self.learning.wait_idle()

    def handed_in(self) -> int:
        """Env steps trained, plus those handed to the learner thread or to the group's round under way."""
        in_flight = self.group.in_flight if self.group is not None else 0
        return self.learner.step + in_flight + self.learning.pending_steps

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
        self.logger.log(
            step,
            {
                "perf/env_sps": env_sps,
                "perf/learner_steps_per_s": ups,
                "perf/train_sps": ups * self.learner.steps_per_update,
                "learner/skipped_total": skipped,
                "train/skipped_updates": skipped,
                "perf/train_minutes": (now - self.start_time) / 60.0,
            },
        )
        extra: dict = {"env_sps": round(env_sps), "episodes": self.counts["episodes"]}
        if self.returns:
            extra["return(100)"] = float(np.mean(self.returns))
            self.logger.log(step, {"episode/return_mean100": extra["return(100)"]})
            self.keep_best(extra["return(100)"])
        group_stats = self.group.stats() if self.group is not None else {}
        if group_stats:
            self.logger.log(step, {**group_stats, "group/dropped_batches": self.dropped_batches})
            extra["learners"] = int(group_stats["group/size"])
        if self.server is not None:
            remote = self.server.stats(now)
            self.logger.log(step, remote)
            extra.update(
                remote_actors=int(remote["remote/actors"]),
                remote_sps=round(remote["remote/env_sps"]),
                policy_lag=remote["remote/policy_lag"],
            )
        if self.server is not None or self.cfg.broker:  # peers that failed the key handshake (moolib drops them)
            refused = refused_connections()
            self.logger.log(step, {"net/refused_connections": float(refused)})
            if refused > self.refused_connections:
                print(
                    f"warning: {refused - self.refused_connections} connection(s) without the shared key refused "
                    f"({refused} in all)",
                    file=sys.stderr,
                    flush=True,
                )
            self.refused_connections = refused
        if self.group is not None:  # model updates from key holders that moolib refused (see LearnerGroup)
            counts = refused_model_updates()
            refused = sum(counts.values())
            self.logger.log(step, {"net/refused_model_updates": float(refused)})
            if refused > self.refused_updates:
                detail = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items()) if n)
                print(
                    f"warning: {refused - self.refused_updates} model update(s) from the group refused "
                    f"({detail} in all)",
                    file=sys.stderr,
                    flush=True,
                )
            self.refused_updates = refused
        if "loss/total" in self.last_stats:
            extra["loss"] = self.last_stats["loss/total"]
        self.logger.progress(step, **extra)
        self.rate = (now, self.actors.env_steps, self.learner.updates)

    def keep_best(self, mean_return: float) -> None:
        """``best.pt`` when the mean return of the last :data:`BEST_WINDOW` episodes beats every
        earlier one (of this run, resumes included; only once the window is full)."""
        best = self.counts["best_return"]
        if len(self.returns) == BEST_WINDOW and (best is None or mean_return > best):
            self.counts["best_return"] = mean_return
            self.save_best(mean_return)

    # ---- the end
    def aborted(self, error: TrainingAborted, saved: Path | None) -> None:
        print(f"error: training aborted: {error}; the last good model is saved", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Leave the group, stop serving remote actors, end the env workers (all of them on a restart)."""
        if self.logger is not None and self.actors is not None:
            self.logger.progress(
                self.step,
                force=True,
                episodes=self.counts["episodes"],
                **({"return(100)": float(np.mean(self.returns))} if self.returns else {}),
            )
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
        step, limit = self.step, self.cfg.max_env_failures
        if self.restart and saved is not None:
            if self.actors.env_failures > limit:
                print(
                    f"error: {self.actors.env_failures} environment failures (limit --max-env-failures {limit}); "
                    f"stopped at step {step:,}; checkpoint {saved}",
                    file=sys.stderr,
                )
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
