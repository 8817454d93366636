"""``rfwp-rl bench impala``: end-to-end IMPALA speed against its two bounds, per agent and device.

For each core (``--cores``; the Atari presets ``agents/atari_<core>.toml`` on Atari envs) and each device
(``--devices``), side by side in one process on one env pool (so the numbers share the machine's load):

- **end to end** (``env_sps``): the training loop of ``rfwp-rl train`` itself
  (:meth:`rfwp_rl.impala.train.ImpalaTrainer.iterate` and its bookkeeping, with the trainer's own choices
  of threads, actor device and learner thread, all printed), env steps trained per second over
  ``--seconds`` after ``--warmup-seconds``; with the shares of the main thread's wall time spent waiting
  for env results, copying them to the actors' device, in inference, handing the actions to the env workers,
  in learning (with a learner thread: waiting to hand it a batch) and elsewhere, and the env worker processes'
  CPU time per wall second (``env_cpu``, in cores);
- **the env bound** (``env_bound_sps``): the same pool stepped with random actions and no agent, batches
  alternating as the actors step them (measured once, before the agents);
- **the learner bound** (``learner_bound_sps``): the run's learner alone, full updates (loss, backward,
  optimizer step, trust region, publishing to the actors' copy) on one learner batch of the run itself
  (its envs' observations, as the learner receives them), again and again, in env steps per second;

and ``ratio = env_sps / min(env_bound_sps, learner_bound_sps)``: the share of the smaller bound the loop
reaches; and ``main_bound_sps = env_sps / (1 - share_env_wait)``: the speed the main thread's own work per env
step allows (what the loop would reach if env results were always ready when it asks for them), which says
whether the gap to the bounds is the main thread's work or its waiting. Writes a table and ``--out`` (CSV, atomic).

``--topologies local,remote,group`` times instead one learner, one learner fed by remote actors, and a group
of two learners, each as ``rfwp-rl`` processes on loopback (:mod:`rfwp_rl.bench.topology`).
"""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
from pathlib import Path

import torch

from rfwp_rl import cores as cores_module
from rfwp_rl import flags
from rfwp_rl.bench import topology
from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.impala.actors import Rollout
from rfwp_rl.impala.config import ImpalaConfig, trainer_keys
from rfwp_rl.impala.env_batches import EnvBatches
from rfwp_rl.impala.run_spec import RunSpec
from rfwp_rl.impala.train import ImpalaTrainer, config_from_args
from rfwp_rl.perf import available_cores
from rfwp_rl.runlog import RunLogger
from rfwp_rl.texttable import format_columns

OUT = "results/bench/impala.csv"
# the main thread's wall-time shares: column -> the loop's timer (rfwp_rl.impala.actors.Actors, the trainer's loop)
SHARE_TIMERS = {
    "share_env_wait": "env",
    "share_copy": "copy",
    "share_inference": "inference",
    "share_send": "send",
    "share_learning": "learning",
}
SHARES = (*SHARE_TIMERS, "share_other")

COLUMNS = (
    "agent",
    "device",
    "cpu_cores",
    "env_sps",
    "env_bound_sps",
    "learner_bound_sps",
    "ratio",
    "main_bound_sps",
    "actor_device",
    "learner_thread",
    "acting_graph",
    "precision",
    "params",
    *SHARES,
    "env_cpu",
    "updates",
    "env",
    "num_actors",
    "num_env_batches",
    "num_env_processes",
    "batch_size",
    "unroll_length",
    "env_backend",
    "torch_threads",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_list_argument(parser, "--cores", ["lstm"], "cores")
    flags.add_list_argument(parser, "--devices", ["cpu"], "learner devices, each run end to end")
    flags.add_field(parser, ImpalaConfig, "precision")
    flags.add_field(parser, ImpalaConfig, "env", default="Pong")
    flags.add_shared(parser, "num_actors", 48)
    flags.add_field(parser, ImpalaConfig, "num_env_batches")
    flags.add_field(parser, ImpalaConfig, "num_env_processes")
    flags.add_field(parser, ImpalaConfig, "env_backend")
    flags.add_field(parser, ImpalaConfig, "batch_size")
    flags.add_field(parser, ImpalaConfig, "unroll_length")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="timed seconds per end-to-end run (default %(default)s)"
    )
    parser.add_argument(
        "--warmup-seconds", type=float, default=10.0, help="seconds before timing starts (default %(default)s)"
    )
    flags.add_shared(parser, "torch_threads", 0, "0: the trainer's choice")
    flags.add_field(parser, ImpalaConfig, "actor_device")
    flags.add_field(parser, ImpalaConfig, "acting_graph")
    flags.add_set_argument(parser, "agent or trainer setting, as for rfwp-rl train", "max_kl=0")
    flags.add_list_argument(
        parser,
        "--topologies",
        None,
        f"of {', '.join(topology.TOPOLOGIES)}: instead of the in-process loop, time "
        "one learner with all --num-actors envs (local), one learner fed by --remote-actors actor processes "
        "(remote) and a broker with two learners of half the envs each (group), as rfwp-rl processes on "
        "loopback, side by side",
        default_text="none: the in-process loop",
    )
    parser.add_argument(
        "--remote-actors",
        type=flags.integer,
        default=2,
        metavar="K",
        help="actor processes of the remote topology, each stepping --num-actors / K envs (default %(default)s)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"CSV file to write (default {OUT}; with --topologies {topology.OUT})",
    )


def _config(args: argparse.Namespace, run, device: str):
    ns = argparse.Namespace(
        env=args.env,
        total_steps=10**12,
        num_actors=args.num_actors,
        num_env_batches=args.num_env_batches,
        num_env_processes=args.num_env_processes,
        env_backend=args.env_backend,
        batch_size=args.batch_size,
        unroll_length=args.unroll_length,
        precision=args.precision,
        torch_threads=args.torch_threads,
        device=device,
        actor_device=args.actor_device,
        acting_graph=args.acting_graph,
        checkpoint_every=math.inf,
        log_every=math.inf,
    )
    return config_from_args(
        ns,
        run.kind,
        run.memory_horizon,
        run.max_episode_steps,
        run.trainer_settings,
        continuous_actions=run.action_space.get("type") == "Box",
    )


def env_bound(pool, agent, num_envs: int, num_batches: int, seconds: float) -> float:
    """Env steps per second of ``pool`` stepped with uniformly random actions and no agent."""
    b = num_envs // num_batches
    envs = EnvBatches(pool, num_batches, b)
    dist = agent.action_dist
    zeros = torch.zeros(b, dist.num_params)

    def random_actions() -> torch.Tensor:
        with torch.no_grad():
            return dist.env_action(dist.sample(zeros)).cpu()

    for i in range(num_batches):
        envs.send(i, random_actions())
    steps, t0, i = 0, None, 0
    while t0 is None or time.perf_counter() - t0 < seconds:
        envs.receive(i)
        if t0 is None and steps >= 4 * num_envs:  # warm: every env has been reset and stepped a few times
            t0, steps = time.perf_counter(), 0
        envs.send(i, random_actions())
        steps += b
        i = (i + 1) % num_batches
    rate = steps / (time.perf_counter() - t0)
    envs.drain()
    return rate


def learner_bound(trainer, batch: Rollout, seconds: float) -> float:
    """Env steps per second of the trainer's learner alone: full updates on ``batch``, a learner batch of the
    run (real observations: a grid's few symbols, not every byte value), as in training."""
    cfg, learner = trainer.cfg, trainer.learner
    trainer.learning.wait_idle()

    def update() -> None:
        with learner.lock:
            learner.update(batch)
        if learner.device.type == "cuda":
            torch.cuda.synchronize(learner.device)

    for _ in range(2):
        update()
    updates, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or updates < 3:
        update()
        updates += 1
    return updates * cfg.batch_size * cfg.unroll_length / (time.perf_counter() - t0)


def side_by_side(run, cfg, pool, seconds: float, warmup: float) -> dict[str, float]:
    """The training loop on ``pool`` (``warmup`` seconds, then ``seconds`` timed), then the learner bound of
    the same trainer. Returns the rates and the loop's wall-time shares."""
    with tempfile.TemporaryDirectory(prefix="rfwp-bench-") as tmp:
        trainer = ImpalaTrainer(cfg, run, Path(tmp), pool=pool)  # sets the trainer's thread count
        trainer.prepare()
        trainer.logger = RunLogger(tmp, {}, total=cfg.total_steps, log_every=math.inf)
        print(f"    {trainer.threads_note}, {trainer.actor_device_note}", flush=True)
        try:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < warmup or trainer.learner.updates < 2:
                trainer.iterate()
                trainer.bookkeeping()
            trainer.learning.wait_idle()
            trainer.timers.reset()
            steps0, updates0 = trainer.learner.step, trainer.learner.updates
            cpu0 = trainer.actors.envs.worker_cpu_seconds()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds or trainer.learner.updates - updates0 < 2:
                trainer.iterate()
                trainer.bookkeeping()
            wall = time.perf_counter() - t0
            steps, updates = trainer.learner.step - steps0, trainer.learner.updates - updates0
            cpu1 = trainer.actors.envs.worker_cpu_seconds()
            shares = {k: v / wall for k, v in trainer.timers.seconds.items()}
            while not trainer.queue.ready():
                trainer.collect()
            batch = trainer.queue.get()
            trainer.actors.drain()  # the next run uses the same pool
            bound = learner_bound(trainer, batch, min(seconds, 10.0))
        finally:
            trainer.learning.close()
            trainer.logger.close()
    return {
        "env_sps": steps / wall,
        "learner_bound_sps": bound,
        "updates": updates,
        "actor_device": str(trainer.actor_device),
        "learner_thread": trainer.learning.thread is not None,
        "acting_graph": trainer.actors.graph is not None,
        **{column: shares.get(timer, 0.0) for column, timer in SHARE_TIMERS.items()},
        "share_other": max(0.0, 1.0 - sum(shares.values())),
        "env_cpu": (cpu1 - cpu0) / wall if cpu0 is not None else float("nan"),
        "torch_threads": trainer.threads,
    }


def _run_spec(core: str, args: argparse.Namespace):
    ns = argparse.Namespace(
        env=args.env,
        core=core,
        preset=None,
        overrides=list(args.overrides),
        detach_state_every_step=False,
        env_options=[],
        env_config=None,
    )
    return RunSpec.from_args(ns, trainer_keys())


def main_bound(env_sps: float, share_env_wait: float) -> float:
    """Env steps/s if the main thread never waited for env results: its own work per env step, as measured."""
    busy = 1.0 - share_env_wait
    return env_sps / busy if busy > 0 else math.inf


def format_table(rows: list[dict]) -> str:
    head = [
        "agent",
        "device",
        "actors on",
        "env SPS",
        "env bound",
        "learner bound",
        "ratio",
        "main bound",
        "env wait",
        "copy",
        "inference",
        "send",
        "learning",
        "other",
        "env CPU",
    ]
    cells = []
    for r in rows:
        cells.append(
            [
                r["agent"],
                r["device"],
                r["actor_device"],
                f"{r['env_sps']:,.0f}",
                f"{r['env_bound_sps']:,.0f}",
                f"{r['learner_bound_sps']:,.0f}",
                f"{r['ratio']:.2f}",
                f"{r['main_bound_sps']:,.0f}",
                *(f"{100 * r[k]:.0f}%" for k in SHARES),
                f"{r['env_cpu']:.2f}",
            ]
        )
    return format_columns(head, cells)


def run(args: argparse.Namespace) -> int:
    cores, devices = args.cores, args.devices
    for c in cores:
        check_choice("core", c, sorted(cores_module.available()))
    for d in devices:
        if torch.device(d).type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--devices {d}: this torch build or machine has no CUDA device")
    if not args.seconds > 0 or args.warmup_seconds < 0:
        raise UserError(f"--seconds {args.seconds:g} / --warmup-seconds {args.warmup_seconds:g}: need > 0 / >= 0")
    # bad topology names and splits: one line before anything starts
    topologies = topology.parse_topologies(args) if args.topologies is not None else None
    args.out = args.out or (topology.OUT if topologies is not None else OUT)
    specs = {core: _run_spec(core, args) for core in cores}
    if topologies is not None:
        return topology.run(args, topologies, cores, devices, {core: spec.env for core, spec in specs.items()})
    first = next(iter(specs.values()))
    _config(args, first, devices[0])  # the run's settings checked (one-line errors) before any env starts
    # one pool, made before anything touches CUDA (its workers are forked); moolib allows one per process
    pool = first.make_env_pool(args.env_backend, 0, args.num_actors, args.num_env_batches, args.num_env_processes)
    print(
        f"IMPALA benchmark: {args.env}, batch {args.batch_size} x unroll {args.unroll_length}, {args.num_actors} envs "
        f"in {args.num_env_batches} batches [{args.env_backend}, {args.num_env_processes} "
        f"{'threads' if args.env_backend == 'ale' else 'processes'}], "
        f"{available_cores()} cores, {platform.processor() or platform.machine()}"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
        flush=True,
    )
    rows = []
    try:
        torch.set_num_threads(1)  # the trainers set their own; idle intra-op threads would spin against the envs
        bound = env_bound(pool, first.build_agent(), args.num_actors, args.num_env_batches, args.seconds / 2)
        print(f"  env bound (random actions, no agent): {bound:,.0f} env steps/s", flush=True)
        for core, spec in specs.items():
            for device in devices:
                cfg = _config(args, spec, device)
                print(f"  {core} on {device} ...", flush=True)
                row = {
                    "agent": core,
                    "device": device,
                    "cpu_cores": available_cores(),
                    "env_bound_sps": bound,
                    "precision": args.precision,
                    "params": sum(p.numel() for p in spec.build_agent().parameters()),
                    **side_by_side(spec, cfg, pool, args.seconds, args.warmup_seconds),
                    "env": spec.env,
                    "num_actors": cfg.num_actors,
                    "num_env_batches": cfg.num_env_batches,
                    "num_env_processes": cfg.num_env_processes,
                    "batch_size": cfg.batch_size,
                    "unroll_length": cfg.unroll_length,
                    "env_backend": cfg.env_backend,
                }
                row["ratio"] = row["env_sps"] / min(row["env_bound_sps"], row["learner_bound_sps"])
                row["main_bound_sps"] = main_bound(row["env_sps"], row["share_env_wait"])
                rows.append(row)
                print(
                    f"  {core} on {device} (actors on {row['actor_device']}): {row['env_sps']:,.0f} env steps/s, "
                    f"learner bound {row['learner_bound_sps']:,.0f}, ratio {row['ratio']:.2f}",
                    flush=True,
                )
                atomic_write_csv(args.out, rows, COLUMNS)  # partial tables survive a time limit
    finally:
        if hasattr(pool, "close"):
            pool.close()
    print(format_table(rows))
    print(f"wrote {args.out}")
    return 0
