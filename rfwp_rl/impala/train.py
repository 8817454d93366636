"""``rfwp-rl train``: IMPALA / V-trace on Atari or any gymnasium env with a discrete action space.

One process holds the model, the actors' inference and the learner (as in TorchBeast's
monobeast and moolib's IMPALA example); the environments run in ``moolib.EnvPool`` worker
processes, stepped in two alternating batches so that env stepping overlaps inference.
The loop, top to bottom: step one env batch (collect finished rollouts) -> when ``batch_size``
rollouts are ready, one V-trace update -> log, checkpoint. Defaults are the paper's
settings (:mod:`rfwp_rl.impala.config`).

Examples::

    rfwp-rl train --env Pong --core rdn                      # agents/atari_rdn.toml, 50M steps
    rfwp-rl train --env CartPole-v1 --core lstm --total-steps 200000 --num-actors 8 \\
        --unroll-length 20 --batch-size 8
    rfwp-rl train --env Pong --preset my_agent.toml --set core_config.hidden_size=64

Re-running the same command resumes from the newest checkpoint of its run directory
(``runs/impala/<env>_<core>_s<seed>``). Ctrl-C saves a checkpoint and exits 0.

Several learners train one model with ``--broker HOST:PORT --group NAME`` (a moolib broker:
``rfwp-rl broker``): each has its own actors, their gradients are averaged before every optimizer
step (:mod:`rfwp_rl.impala.multi_learner`), and the step counters are the group's.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import queue as stdlib_queue
import random
import sys
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.impala import profiles
from rfwp_rl.impala.config import DEFAULTS, ENV_BACKENDS, OPTIMIZERS, ImpalaConfig

METRICS = ("episode/return", "episode/return_mean100")
DEFAULT_CORE = "rdn"  # the RFWP paper's main agent
# Settings every learner of a group must share (checked when a learner joins), besides the env and agent.
GROUP_SETTINGS = ("total_steps", "batch_size", "unroll_length", "learning_rate", "rmsprop_alpha", "rmsprop_eps",
                  "rmsprop_momentum", "grad_norm_clip", "entropy_cost", "baseline_cost", "discount", "reward_clip",
                  "clip_rho", "clip_c", "optimizer", "adam_eps", "normalize_advantages", "vtrace_lambda")
MAX_WAITING_BATCHES = 4  # full batches held while a learner group takes no gradients (joining); older ones are dropped


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(float(x)) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated step counts, e.g. 50000000,200000000; got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    g = parser.add_argument_group("what to train")
    g.add_argument("--env", default=d.env, help="gymnasium id, Atari game name or module:EnvId (default %(default)s)")
    g.add_argument("--core", default=None, help="core name (rfwp-rl info); Atari envs use agents/atari_<core>.toml "
                   f"(default {DEFAULT_CORE})")
    g.add_argument("--preset", default=None, help="agent preset: a name in agents/ or a .toml file")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset value, e.g. core_config.hidden_size=64 or agent.use_prev_action=true")
    g.add_argument("--detach-state-every-step", action="store_true",
                   help="1-step BPTT through the core state (the reference code's fast-weight agents), for comparison")
    g.add_argument("--env-option", dest="env_options", action="append", default=[], metavar="KEY=VALUE",
                   help="environment option, e.g. repeat_action_probability=0.25 (Atari) or max_episode_steps=200")
    g.add_argument("--env-config", default=None, help="TOML file whose [atari] (Atari) or [env] table holds env options")
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--total-steps", type=lambda s: int(float(s)), default=d.total_steps,
                   help="environment steps consumed by the learner (default %(default)s)")
    g = parser.add_argument_group("actors")
    g.add_argument("--num-actors", type=int, default=None,
                   help=f"environments (default: {d.num_actors} for Atari, {profiles.VECTOR['num_actors']} for vector envs)")
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
    g.add_argument("--group", default=d.group, metavar="NAME",
                   help="the learner group's name at the broker; every learner of a group needs the same env, "
                        "agent and learner options, and its own --seed")
    g.add_argument("--max-env-failures", type=int, default=100,
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
    g = parser.add_argument_group("learner (Atari: RFWP paper App. C; vector envs: rfwp_rl.impala.profiles)")
    g.add_argument("--profile", choices=profiles.PROFILES, default="auto",
                   help="defaults of the options left unset: atari (the paper's), vector (memory tasks: unroll = "
                        "2 x the env's memory horizon, Adam, normalised advantages), auto: by observation kind")
    g.add_argument("--batch-size", type=int, default=None,
                   help=f"rollouts per update (atari {d.batch_size}, vector {profiles.VECTOR['batch_size']})")
    g.add_argument("--unroll-length", type=int, default=None,
                   help=f"steps per rollout (atari {d.unroll_length}; vector: 2 x the env's memory horizon, "
                        f"{profiles.MIN_UNROLL} to {profiles.MAX_UNROLL})")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="atari rmsprop, vector adam")
    g.add_argument("--learning-rate", "--lr", type=float, default=None,
                   help=f"initial learning rate, decayed linearly to 0 (atari {d.learning_rate:g}, vector "
                        f"{profiles.VECTOR['learning_rate']:g})")
    g.add_argument("--adam-eps", type=float, default=d.adam_eps)
    g.add_argument("--rmsprop-alpha", type=float, default=d.rmsprop_alpha)
    g.add_argument("--rmsprop-eps", type=float, default=d.rmsprop_eps)
    g.add_argument("--grad-norm-clip", type=float, default=d.grad_norm_clip)
    g.add_argument("--entropy-cost", type=float, default=None,
                   help=f"atari {d.entropy_cost:g}, vector {profiles.VECTOR['entropy_cost']:g}")
    g.add_argument("--vtrace-lambda", type=float, default=None,
                   help=f"V-trace trace factor lambda in [0, 1] (IMPALA Remark 2): atari {d.vtrace_lambda:g} (the "
                        f"paper), vector {profiles.VECTOR['vtrace_lambda']:g}")
    g.add_argument("--normalize-advantages", action=argparse.BooleanOptionalAction, default=None,
                   help="divide the policy-gradient advantages by their batch std (atari no, vector yes)")
    g.add_argument("--baseline-cost", type=float, default=d.baseline_cost)
    g.add_argument("--discount", type=float, default=d.discount)
    g.add_argument("--reward-clip", type=float, default=d.reward_clip, help="0 disables clipping")
    g.add_argument("--device", default=d.device, help="cpu, cuda, cuda:1 ...")
    g.add_argument("--learner-thread", action="store_true",
                   help="run updates in a learner thread while the actors go on with a copy of the model "
                        "(refreshed after each update); default: act and learn in turn in one thread")
    g.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads of this process (default 1: the env workers use the other cores, "
                        "and small per-step inference is much slower with several threads on a busy machine; "
                        "0: torch's default)")
    g = parser.add_argument_group("bookkeeping")
    g.add_argument("--run-dir", default=None, help="run directory (default runs/impala/<env>_<core>_s<seed>; characters other than letters, digits, . + - in names become -, e.g. ALE-Pong-v5_delta-rnn_s1)")
    g.add_argument("--checkpoint-every", type=float, default=d.checkpoint_every, help="seconds (default %(default)s)")
    g.add_argument("--snapshot-steps", type=_int_list, default=d.snapshot_steps,
                   help="extra checkpoints kept at these step counts, e.g. 50000000,200000000")
    g.add_argument("--log-every", type=float, default=d.log_every, help="seconds between console lines")


def config_from_args(args: argparse.Namespace, kind: str = "atari", memory_horizon: int | None = None,
                     max_episode_steps: int | None = None) -> ImpalaConfig:
    """The run's config: the command line's values, the unset ones from the profile of the env's
    ``kind`` (see :mod:`rfwp_rl.impala.profiles`)."""
    fields = {f.name for f in dataclasses.fields(ImpalaConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and k != "profile"}
    profile = profiles.profile_for(kind, getattr(args, "profile", "auto"))
    for k in profiles.PROFILE_OPTIONS:
        given.setdefault(k, None)
    cfg = ImpalaConfig(**profiles.fill_unset(given, profile, memory_horizon, max_episode_steps), profile=profile)
    for name in ("total_steps", "num_actors", "num_env_batches", "num_env_processes", "batch_size", "unroll_length"):
        if getattr(cfg, name) < (0 if name == "num_actors" and cfg.listen else 1):
            raise UserError(f"--{name.replace('_', '-')} {getattr(cfg, name)} is invalid; allowed: an integer >= 1 "
                            "(>= 0 with --listen)")
    if cfg.listen:
        from rfwp_rl.impala.rollout_server import parse_address

        parse_address(cfg.listen, "--listen")
    from rfwp_rl.impala.multi_learner import check_group_args

    check_group_args(cfg.broker, cfg.group)
    check_choice("env backend", cfg.env_backend, ENV_BACKENDS)
    check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
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
    return cfg


def env_options_from_args(args: argparse.Namespace, kind: str) -> dict:
    from rfwp_rl.envs import load_env_config
    from rfwp_rl.presets import parse_value

    options = load_env_config(args.env_config, "atari" if kind == "atari" else "env") if args.env_config else {}
    for item in args.env_options:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--env-option {item!r}: expected key=value, e.g. repeat_action_probability=0.25")
        options[key.strip()] = parse_value(text.strip())
    return options


def run(args: argparse.Namespace) -> int:
    from rfwp_rl import envs
    from rfwp_rl.presets import resolve_preset

    resolved = envs.resolve_env_id(args.env)  # unknown env: one-line error with close matches
    preset = resolve_preset(args.core, args.preset, args.overrides, kind=resolved.kind, default_core=DEFAULT_CORE)
    env_options = env_options_from_args(args, resolved.kind)
    spec = envs.env_spec(args.env, **env_options)
    cfg = config_from_args(args, spec.kind, spec.memory_horizon, spec.max_episode_steps)
    if args.detach_state_every_step:
        from rfwp_rl.cores import available

        if "detach_state_every_step" not in available()[preset.core].defaults:
            raise UserError(f"--detach-state-every-step: core {preset.core!r} has no recurrent state")
        preset.core_config["detach_state_every_step"] = True
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / "impala" / _run_name(spec.gym_id, preset.core, cfg.seed)
    return train(cfg, preset, spec, env_options, run_dir, torch_threads=args.torch_threads,
                 max_env_failures=getattr(args, "max_env_failures", 100))


def _run_name(env: str, core: str, seed: int) -> str:
    from rfwp_rl.runlog import run_name

    return run_name(env, core, f"s{seed}")


def train(cfg: ImpalaConfig, preset, spec, env_options: dict, run_dir: Path, torch_threads: int = 1,
          max_env_failures: int = 100) -> int:
    """Train until ``cfg.total_steps`` (resuming from ``run_dir``'s newest checkpoint). Returns the exit code.

    Faults (issue 8): a failed env (step, reset or construction raised) is replaced and counted
    (``max_env_failures``); an env that fails ``MAX_FAILED_CONSTRUCTIONS`` times in a row before
    its first observation stops the run (checkpoint, exit 1, one line naming it); a dead moolib
    worker process or a hung env (no result for ``cfg.env_timeout`` s) -> checkpoint, end the
    pool, re-execute this command (moolib cannot make a second EnvPool in one process), which
    resumes; SIGINT/SIGTERM, also while waiting on envs -> checkpoint, exit 0 (workers stuck in
    an env are ended); non-finite updates are skipped.

    With ``cfg.broker``/``cfg.group`` this learner is one of a group (:mod:`rfwp_rl.impala.multi_learner`):
    ``counters["step"]``/``["updates"]`` and the LR schedule are the group's, and each learner writes
    its own run directory (the same model; its own actors' counters)."""
    from rfwp_rl.agent import Agent
    from rfwp_rl.checkpoint import Checkpointer, NonFiniteState, lock_run_dir, rng_state, set_rng_state
    from rfwp_rl.impala import learner, multi_learner
    from rfwp_rl.impala.actors import (Actors, EnvPoolBroken, RolloutQueue, make_env_pool, reexec_argv,
                                       shutdown_env_pool)
    from rfwp_rl.runlog import RunLogger
    from rfwp_rl.safety import GracefulStop, NonFiniteGuard, TrainingAborted

    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)

    # ---- model, optimizer, LR schedule (linear decay to 0 over total_steps trained)
    # step, updates: env steps trained and optimizer steps (a learner group's: the same on every learner)
    counters = {"step": 0, "updates": 0, "actor_steps": 0, "episodes": 0, "train_seconds": 0.0, "env_failures": 0,
                "skipped_updates": 0}
    agent = Agent(spec.obs_shape, spec.num_actions, preset.core, preset.core_config, preset.agent).to(device)
    optimizer = learner.make_optimizer(agent, cfg.learning_rate, cfg.rmsprop_alpha, cfg.rmsprop_eps,
                                       cfg.rmsprop_momentum, cfg.optimizer, cfg.adam_eps)
    steps_per_update = cfg.batch_size * cfg.unroll_length
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, learner.linear_decay_of_steps(cfg.total_steps, lambda: counters["step"]))
    loss_cfg = learner.LossConfig(discount=cfg.discount, reward_clip=cfg.reward_clip, baseline_cost=cfg.baseline_cost,
                                  entropy_cost=cfg.entropy_cost, clip_rho=cfg.clip_rho, clip_c=cfg.clip_c,
                                  normalize_advantages=cfg.normalize_advantages, vtrace_lambda=cfg.vtrace_lambda)
    guard = NonFiniteGuard(cfg.max_nonfinite)

    # ---- resume
    meta = {"trainer": "impala", "env": spec.gym_id, "env_options": dict(env_options), "core": preset.core,
            "core_config": dict(agent.core.config), "num_actions": spec.num_actions,
            "obs_shape": list(spec.obs_shape), "agent": agent.config.to_dict()}
    checkpointer = Checkpointer(run_dir, meta)
    loaded = checkpointer.load_latest()
    run_lock = lock_run_dir(run_dir)  # noqa: F841  one trainer per run directory, held until train() returns
    if loaded is not None:
        state = loaded["state"]
        agent.load_state_dict(state["agent"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        counters.update(state["counters"])
        set_rng_state(state["rng"])
        guard.skipped = counters["skipped_updates"]
        print(f"resuming {run_dir} from step {counters['step']:,} ({loaded['path'].name})", flush=True)
    if counters["step"] >= cfg.total_steps:
        print(f"{run_dir} already reached {counters['step']:,} >= --total-steps {cfg.total_steps:,} steps; nothing to do")
        return 0

    # ---- env pool first: moolib forks its workers here, before the logger starts threads
    env_seed = cfg.seed + 1000 * counters["updates"]  # fresh episodes (local backend: new seeds) on resume
    pool = make_env_pool(cfg.env_backend, spec.env_id, env_options, env_seed, cfg.num_actors, cfg.num_env_batches,
                         cfg.num_env_processes, blank_obs=np.zeros(spec.obs_shape, spec.obs_dtype)
                         ) if cfg.num_actors else None
    server = None  # remote actors (--listen): an Rpc endpoint, opened after the pool has forked
    if cfg.listen:
        from rfwp_rl.impala.rollout_server import RolloutServer, compat_info

        server = RolloutServer(cfg.listen, compat_info(spec, env_options, agent), agent, cfg.unroll_length,
                               max_pending=2 * cfg.batch_size, device=device)
        server.publish(agent, counters["updates"])
        print(f"listening for remote actors on {cfg.listen}", flush=True)
    model_lock = threading.Lock()  # agent, optimizer, schedule, counters: updates vs checkpoints vs the group

    # ---- learner group (--broker/--group): what a joining learner takes from the leader besides the
    # parameters and buffers (moolib copies those), and the settings every learner must share
    def share_state() -> dict:
        return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "counters": {"step": counters["step"], "updates": counters["updates"]}}

    def adopt_state(state: dict) -> None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        counters.update(state["counters"])
        snapshots_due[:] = [s for s in snapshots_due if s > counters["step"]]
        model_changed()

    if cfg.broker:
        from rfwp_rl.impala.rollout_server import compat_info

        settings = {**compat_info(spec, env_options, agent), **{k: getattr(cfg, k) for k in GROUP_SETTINGS}}
        try:
            group = multi_learner.LearnerGroup(cfg.broker, cfg.group, agent.parameters(), agent.buffers(),
                                               steps_per_update, settings, share_state, adopt_state,
                                               counters["updates"], cfg.seed, model_lock)
        except BaseException:
            shutdown_env_pool(pool)
            raise
    else:
        group = multi_learner.Solo(agent.parameters())

    num_params = sum(p.numel() for p in agent.parameters())
    hparams = {**{k: v for k, v in dataclasses.asdict(cfg).items()}, "core": preset.core,
               **{f"core_config.{k}": v for k, v in agent.core.config.items()},
               **{f"agent.{k}": v for k, v in agent.config.to_dict().items()},
               "env_options": env_options, "num_actions": spec.num_actions, "num_params": num_params}
    logger = RunLogger(run_dir, hparams, total=cfg.total_steps, start=counters["step"], unit="env steps",
                       metrics=METRICS, print_every=cfg.log_every)
    print(f"IMPALA {spec.gym_id} ({spec.num_actions} actions), core {preset.core} ({num_params:,} parameters), "
          f"{cfg.num_actors} envs [{cfg.env_backend}], batch {cfg.batch_size} x unroll {cfg.unroll_length}; "
          f"run dir {run_dir}", flush=True)
    print(profiles.describe(cfg, preset.source), flush=True)

    # ---- actors (with a learner thread they act with a copy of the model, refreshed after each update)
    acting_agent = copy.deepcopy(agent) if cfg.learner_thread else agent
    if pool is not None:
        actors = Actors(pool, acting_agent, cfg.num_actors, cfg.num_env_batches, cfg.unroll_length, device,
                        max_env_failures=max_env_failures, env_failures=counters["env_failures"],
                        env_timeout=cfg.env_timeout)
    else:
        from rfwp_rl.impala.rollout_server import NoLocalActors

        actors = NoLocalActors(counters["env_failures"])
    queue = RolloutQueue(cfg.batch_size)
    acting_lock = threading.Lock()  # the acting copy: inference vs refresh after an update
    learned: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()  # (step, stats) of updates not logged yet
    loss_stats: dict[str, float] = {}  # of this learner's last batch, logged with the step that used it

    def learn(batch) -> None:
        """This learner's V-trace gradients on one batch, handed to the group (alone: applied at once).
        Runs in the learner thread with --learner-thread."""
        with model_lock:
            loss, stats = learner.compute_gradients(agent, batch.data, batch.state, loss_cfg)
            loss_stats.update(stats)
            group.hand_in(steps_per_update, guard.ok(loss, agent.parameters()), apply)

    def apply(step: multi_learner.GroupStep) -> None:
        """One optimizer step on the gradients in .grad (alone: this learner's; in a group: the
        batch-size-weighted mean of the round's, the same step on every learner). Model lock held."""
        counters["step"] += step.env_steps
        counters["updates"] += 1
        stats = learner.apply_gradients(agent, optimizer, scheduler, cfg.grad_norm_clip, step=step.gradients > 0)
        if step.own_steps:
            stats.update(loss_stats)
        learned.put((counters["step"], stats))
        model_changed()

    def model_changed() -> None:
        """Remote actors and the acting copy follow the learner's new parameters."""
        if server is not None:
            server.publish(agent, counters["updates"])
        if acting_agent is not agent:
            with acting_lock:
                acting_agent.load_state_dict(agent.state_dict())

    def handed_in() -> int:
        """Env steps trained, plus those handed to the learner thread or to the group's round under way."""
        return counters["step"] + group.in_flight + (thread.pending * steps_per_update if thread else 0)

    def save(snapshot_step: int | None = None) -> Path:
        logger.flush()  # TensorBoard is on disk up to the checkpoint (a resume purges what follows)
        with model_lock:
            counters["actor_steps"] = actor_steps0 + actors.env_steps
            counters["train_seconds"] = time.monotonic() - start_time
            counters["env_failures"] = actors.env_failures
            counters["skipped_updates"] = guard.skipped
            state = {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "counters": dict(counters), "rng": rng_state(),
                     "config": dataclasses.asdict(cfg)}
            if snapshot_step is not None:
                return checkpointer.snapshot(state, snapshot_step)
            return checkpointer.save(state, counters["step"])

    thread = learner.LearnerThread(learn) if cfg.learner_thread else None
    returns: deque[float] = deque(maxlen=100)
    last_stats: dict[str, float] = {}
    actor_steps0 = counters["actor_steps"]
    start_time = time.monotonic() - counters["train_seconds"]
    last_ckpt = time.monotonic()
    rate_t, rate_actor, rate_updates = time.monotonic(), 0, counters["updates"]
    snapshots_due = sorted(s for s in cfg.snapshot_steps if s > counters["step"])
    dropped_batches = 0
    code = 0
    restart = False
    with GracefulStop() as stop:  # held through the final save
        try:
            actors.should_stop = lambda: stop.requested  # also while waiting on envs
            while counters["step"] < cfg.total_steps and not stop.requested:
                # -- act: one env batch, one step
                with acting_lock:
                    rollouts, episodes = actors.step()
                if server is not None:  # remote actors' rollouts join the same learner batches
                    remote_rollouts, remote_episodes = server.take(counters["updates"], wait=0.0 if pool is not None else 0.05)
                    rollouts, episodes = rollouts + remote_rollouts, episodes + remote_episodes
                for ret, length in episodes:
                    counters["episodes"] += 1
                    returns.append(ret)
                    logger.log(counters["step"], {"episode/return": ret, "episode/length": length})
                for r in rollouts:
                    queue.put(r)

                # -- learn: the gradients of every full batch of rollouts go to the group (alone: one update
                #    each); each finished round of the group is one optimizer step on every learner
                group.sync(apply)  # also: serve the model to joining learners, or take the leader's
                while queue.ready() and group.wants_gradients() and handed_in() < cfg.total_steps:
                    if thread:
                        thread.submit(queue.get())  # waits while the previous update still runs
                    else:
                        learn(queue.get())
                group.idle()  # nothing handed in: the group's round goes on without this learner
                while queue.size > MAX_WAITING_BATCHES * cfg.batch_size:  # the group takes no gradients yet
                    queue.get()
                    dropped_batches += 1
                if thread and handed_in() >= cfg.total_steps:
                    thread.wait_idle()

                # -- bookkeeping: TensorBoard, console, snapshots, periodic checkpoints
                while not learned.empty():
                    step, stats = learned.get()
                    logger.log(step, {k: v for k, v in stats.items() if math.isfinite(v)})
                    last_stats = stats
                while snapshots_due and counters["step"] >= snapshots_due[0]:
                    snapshots_due.pop(0)
                    save(snapshot_step=counters["step"])
                now = time.monotonic()
                if now - rate_t >= cfg.log_every:
                    env_sps = (actors.env_steps - rate_actor) / (now - rate_t)
                    ups = (counters["updates"] - rate_updates) / (now - rate_t)
                    logger.log(counters["step"], {"perf/env_sps": env_sps, "perf/learner_steps_per_s": ups,
                                                  "perf/train_sps": ups * steps_per_update,
                                                  "learner/skipped_total": guard.skipped,
                                                  "train/skipped_updates": guard.skipped})
                    if returns:
                        logger.log(counters["step"], {"episode/return_mean100": float(np.mean(returns))})
                    group_stats = group.stats()
                    if group_stats:
                        logger.log(counters["step"], {**group_stats, "group/dropped_batches": dropped_batches})
                    rate_t, rate_actor, rate_updates = now, actors.env_steps, counters["updates"]
                    extra = {"env_sps": round(env_sps), "episodes": counters["episodes"]}
                    if group_stats:
                        extra["learners"] = int(group_stats["group/size"])
                    if returns:
                        extra["return(100)"] = float(np.mean(returns))
                    if server is not None:
                        remote = server.stats(now)
                        logger.log(counters["step"], remote)
                        extra.update(remote_actors=int(remote["remote/actors"]),
                                     remote_sps=round(remote["remote/env_sps"]),
                                     policy_lag=remote["remote/policy_lag"])
                    if "loss/total" in last_stats:
                        extra["loss"] = last_stats["loss/total"]
                    logger.progress(counters["step"], **extra)
                if now - last_ckpt >= cfg.checkpoint_every:
                    save()
                    last_ckpt = now
        except TrainingAborted as e:
            print(f"error: training aborted: {e}; the last good model is saved", file=sys.stderr)
            code = 1
        except EnvPoolBroken as e:
            restart = True
            print(f"error: environment pool broken ({e}); saving a checkpoint and restarting", file=sys.stderr, flush=True)
        finally:
            if thread:
                try:
                    thread.close()
                except TrainingAborted as e:
                    print(f"error: training aborted: {e}; the last good model is saved", file=sys.stderr)
                    code = 1
            if restart:
                actors.env_failures += 1  # the dead worker counts as one env failure
            try:
                path = save()
            except NonFiniteState as e:  # never written; the previous checkpoint stays the newest
                print(f"error: {e}", file=sys.stderr)
                path, code, restart = "(not written)", 1, False
            logger.progress(counters["step"], force=True, episodes=counters["episodes"],
                            **({"return(100)": float(np.mean(returns))} if returns else {}))
            logger.close()
            group.close(finished=counters["step"] >= cfg.total_steps)
            if server is not None:
                server.close()
            if restart:
                shutdown_env_pool(pool)
            else:
                if hasattr(actors, "release"):  # a hung env's worker must not outlive this process
                    actors.release()
                if hasattr(pool, "close"):
                    pool.close()
            del pool
    if restart:
        if counters["env_failures"] > max_env_failures:
            print(f"error: {counters['env_failures']} environment failures (limit --max-env-failures "
                  f"{max_env_failures}); stopped at step {counters['step']:,}; checkpoint {path}", file=sys.stderr)
            return 1
        argv = reexec_argv()
        if argv is None:
            print(f"stopped at step {counters['step']:,}; checkpoint {path}; re-run to resume", file=sys.stderr)
            return 1
        print(f"restarting at step {counters['step']:,}: {' '.join(argv)}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.execv(sys.executable, argv)
    status = "stopped" if counters["step"] < cfg.total_steps else "finished"
    print(f"{status} at step {counters['step']:,}; checkpoint {path}", flush=True)
    return code
