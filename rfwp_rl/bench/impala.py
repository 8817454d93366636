"""``rfwp-rl bench impala``: end-to-end IMPALA speed against the model's own compute bound.

For each core (``--cores``; the Atari presets ``agents/atari_<core>.toml`` on Atari envs) it
measures, side by side in one process (one env pool, so the numbers share the machine's load):

- **end to end**, for each ``--precisions`` entry: the training loop of ``rfwp-rl train``
  itself (:meth:`rfwp_rl.impala.train.ImpalaTrainer.iterate` and its bookkeeping, with the
  trainer's default thread count, ``channels_last`` torso and inference mode), timed over
  ``--updates`` updates after ``--warmup-updates``; reported as env steps trained per second
  (``e2e_sps``) and the shares of the main thread's wall time spent waiting for env results,
  in inference, in learning (loss, backward, optimizer) and elsewhere (rollouts, logging), plus
  the env worker processes' CPU time per wall second (``env_cpu``, in cores);
- **the compute bound** of the same model in plain fp32 NCHW PyTorch (no autocast, default
  memory format, ``torch.no_grad`` acting) at the run's sizes, with the same thread count:
  ``1 / (act forward per frame + learn forward+backward per frame)``, where acting runs one step
  of an env batch (``num_actors / num_env_batches`` frames) and learning a batch of
  ``batch_size`` x ``unroll_length`` frames, measured once after every timed update of the loop
  (so that a shared machine's drifting load weighs on both sides alike); and the ratio
  ``e2e_sps / compute_bound_sps``.

A ratio above 1 means the loop runs faster than the plain model could even compute, with the
envs for free: what channels_last, inference mode, bf16 and the overlap of env stepping with
inference buy. Writes a table and ``results/bench/impala.csv`` (atomic).
"""

from __future__ import annotations

import argparse
import io
import math
import platform
import tempfile
import time
from pathlib import Path

import gymnasium
import numpy as np
import torch

from rfwp_rl import flags
from rfwp_rl.envs.spaces import pick_obs
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.impala.config import ImpalaConfig
from rfwp_rl.perf import PRECISIONS
from rfwp_rl.texttable import format_columns

COLUMNS = ("core", "precision", "params", "e2e_sps", "e2e_env_sps", "compute_bound_sps", "ratio", "act_ms_per_frame",
           "learn_ms_per_frame", "share_env_wait", "share_inference", "share_learning", "share_other", "env_cpu",
           "updates", "env", "num_actors", "num_env_batches", "num_env_processes", "batch_size", "unroll_length",
           "env_backend", "torch_threads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cores", default="lstm", help="comma-separated cores (default: %(default)s)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="end-to-end runs, one per precision (default: %(default)s)")
    flags.add_field(parser, ImpalaConfig, "env", default="Pong")
    flags.add_shared(parser, "num_actors", 64)
    flags.add_field(parser, ImpalaConfig, "num_env_batches")
    flags.add_field(parser, ImpalaConfig, "num_env_processes", default=2, help="moolib EnvPool worker processes")
    flags.add_field(parser, ImpalaConfig, "env_backend")
    flags.add_field(parser, ImpalaConfig, "batch_size")
    flags.add_field(parser, ImpalaConfig, "unroll_length", default=20,
                    help=f"env steps per rollout (paper: {flags.default_of(ImpalaConfig, 'unroll_length')})")
    parser.add_argument("--updates", type=flags.integer, default=3,
                        help="timed optimizer steps per end-to-end run (default %(default)s)")
    parser.add_argument("--warmup-updates", type=flags.integer, default=1,
                        help="optimizer steps before timing starts (default %(default)s)")
    flags.add_shared(parser, "torch_threads", 0, "0: the trainer's choice")
    flags.add_shared(parser, "device", "cpu", "where the model runs")
    parser.add_argument("--out", default="results/bench/impala.csv")


def _config(args: argparse.Namespace, precision: str):
    return ImpalaConfig(env=args.env, total_steps=10 ** 12, num_actors=args.num_actors,
                        num_env_batches=args.num_env_batches, num_env_processes=args.num_env_processes,
                        env_backend=args.env_backend, batch_size=args.batch_size, unroll_length=args.unroll_length,
                        precision=precision, torch_threads=args.torch_threads, device=args.device,
                        checkpoint_every=math.inf,
                        log_every=math.inf)


def _random_batch(agent, T1: int, B: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Random rollout data of the agent's spaces (:func:`rfwp_rl.impala.actors.rollout_spec`)."""
    from rfwp_rl.impala.actors import rollout_spec

    dist = agent.action_dist
    params = torch.randn(T1, B, dist.num_params, generator=g)
    with torch.no_grad():
        action, prev_action = dist.sample(params), dist.sample(params)
        behaviour_log_prob = dist.log_prob(params, action)
    batch = {"reward": torch.randn(T1, B, generator=g).sign() * (torch.rand(T1, B, generator=g) < 0.05),
             "done": torch.rand(T1, B, generator=g) < 0.01, "truncated": torch.zeros(T1, B, dtype=torch.bool),
             "action": action, "prev_action": prev_action, "behaviour_log_prob": behaviour_log_prob}
    parts = agent.obs_space.spaces if isinstance(agent.obs_space, gymnasium.spaces.Dict) else {"": agent.obs_space}
    for (key, (dtype, shape)), space in zip(rollout_spec(agent.obs_space, dist).items(), parts.values()):
        if isinstance(space, (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete)):
            high = torch.as_tensor(np.asarray(space.nvec if hasattr(space, "nvec") else space.n))
            batch[key] = (torch.rand(T1, B, *shape, generator=g) * high).long()
        elif dtype == torch.uint8:
            batch[key] = torch.randint(0, 256, (T1, B, *shape), generator=g, dtype=torch.uint8)
        else:
            batch[key] = torch.randn(T1, B, *shape, generator=g)
    return batch


class PlainModel:
    """The run's model in plain fp32 NCHW PyTorch (no autocast, default memory format, ``no_grad``
    acting) on random data of the run's sizes: one env batch to act on, one learner batch."""

    def __init__(self, run, cfg):
        from rfwp_rl.agent import ResNetTorso
        from rfwp_rl.impala.learner import loss_config

        torch.manual_seed(0)
        self.device = torch.device(cfg.device)
        self.agent = run.build_agent(self.device)
        if isinstance(self.agent.torso, ResNetTorso):
            self.agent.torso.use_memory_format(torch.contiguous_format)
        g = torch.Generator().manual_seed(0)
        self.n = cfg.num_actors // cfg.num_env_batches  # frames per acting step
        self.frames = cfg.unroll_length * cfg.batch_size  # frames per update
        self.act_batch = {k: v.to(self.device) for k, v in _random_batch(self.agent, 1, self.n, g).items()}
        self.act_state = self.agent.initial_state(self.n, self.device)
        self.batch = {k: v.to(self.device) for k, v in
                      _random_batch(self.agent, cfg.unroll_length + 1, cfg.batch_size, g).items()}
        self.state = self.agent.initial_state(cfg.batch_size, self.device)
        self.loss_cfg = loss_config(cfg)
        self.measure()  # warm-up

    def measure(self, act_repeats: int = 4) -> tuple[float, float]:
        """(act forward, learn forward+backward) seconds per frame, timed once each (acting: the mean
        of ``act_repeats`` steps)."""
        from rfwp_rl.impala.learner import compute_loss

        a = self.act_batch
        t0 = self._now()
        for _ in range(act_repeats):
            with torch.no_grad():
                self.agent(pick_obs(a), a["reward"], a["done"], self.act_state, prev_action=a["prev_action"])
        t1 = self._now()
        self.agent.zero_grad(set_to_none=True)
        compute_loss(self.agent, self.batch, self.state, self.loss_cfg)[0].backward()
        t2 = self._now()
        return (t1 - t0) / (act_repeats * self.n), (t2 - t1) / self.frames

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()


def side_by_side(run, cfg, pool, updates: int, warmup: int) -> dict[str, float]:
    """The training loop on ``pool`` (``warmup`` updates, then ``updates`` timed ones) and, after each
    timed update, one pass of :class:`PlainModel`: both sides see the same share of the machine's
    drifting load. Returns the rates, the compute bound and the loop's wall-time shares."""
    from rfwp_rl.impala.train import ImpalaTrainer
    from rfwp_rl.runlog import RunLogger

    with tempfile.TemporaryDirectory(prefix="rfwp-bench-") as tmp:
        trainer = ImpalaTrainer(cfg, run, Path(tmp), pool=pool)  # sets the trainer's thread count
        trainer.prepare()
        trainer.logger = RunLogger(tmp, {}, total=cfg.total_steps, log_every=math.inf)
        plain = PlainModel(run, cfg)
        wall = act_s = learn_s = 0.0
        try:
            while trainer.learner.updates < warmup:
                trainer.iterate()
                trainer.bookkeeping()
            trainer.timers.reset()
            steps0, cpu0 = trainer.actors.env_steps, trainer.actors.envs.worker_cpu_seconds()
            for _ in range(updates):
                t0, target = time.perf_counter(), trainer.learner.updates + 1
                while trainer.learner.updates < target:
                    trainer.iterate()
                    trainer.bookkeeping()
                wall += time.perf_counter() - t0
                a, l = plain.measure()
                act_s, learn_s = act_s + a / updates, learn_s + l / updates
            cpu1 = trainer.actors.envs.worker_cpu_seconds()
        finally:
            trainer.actors.drain()  # the next run uses the same pool
            trainer.logger.close()
        shares = {k: v / wall for k, v in trainer.timers.seconds.items()}
    bound = 1.0 / (act_s + learn_s)
    e2e = updates * cfg.batch_size * cfg.unroll_length / wall
    return {"e2e_sps": e2e, "e2e_env_sps": (trainer.actors.env_steps - steps0) / wall, "compute_bound_sps": bound,
            "ratio": e2e / bound, "act_ms_per_frame": 1e3 * act_s, "learn_ms_per_frame": 1e3 * learn_s,
            "share_env_wait": shares.get("env", 0.0), "share_inference": shares.get("inference", 0.0),
            "share_learning": shares.get("learning", 0.0), "share_other": max(0.0, 1.0 - sum(shares.values())),
            "env_cpu": (cpu1 - cpu0) / wall if cpu0 is not None else float("nan"), "torch_threads": trainer.threads}


def _run_spec(core: str, args: argparse.Namespace):
    from rfwp_rl.impala.setup import RunSpec

    ns = argparse.Namespace(env=args.env, core=core, preset=None, overrides=[], detach_state_every_step=False,
                            env_options=[], env_config=None)
    return RunSpec.from_args(ns)


def format_table(rows: list[dict]) -> str:
    head = ["core", "precision", "e2e SPS", "compute bound", "ratio", "env wait", "inference", "learning", "other",
            "env CPU"]
    cells = []
    for r in rows:
        cells.append([r["core"], r["precision"], f"{r['e2e_sps']:,.0f}", f"{r['compute_bound_sps']:,.0f}",
                      f"{r['ratio']:.2f}x", *(f"{100 * r[k]:.0f}%" for k in ("share_env_wait", "share_inference",
                                                                              "share_learning", "share_other")),
                      f"{r['env_cpu']:.2f}"])
    return format_columns(head, cells)


def run(args: argparse.Namespace) -> int:
    from rfwp_rl import cores as cores_module
    from rfwp_rl.checkpoint import atomic_write_text

    cores = [c.strip() for c in args.cores.split(",") if c.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    for c in cores:
        check_choice("core", c, sorted(cores_module.available()))
    for p in precisions:
        check_choice("precision", p, PRECISIONS)
    if args.updates < 1 or args.warmup_updates < 0:
        raise UserError(f"--updates {args.updates} / --warmup-updates {args.warmup_updates}: need >= 1 / >= 0")
    specs = {core: _run_spec(core, args) for core in cores}
    pool = next(iter(specs.values())).make_env_pool(args.env_backend, 0, args.num_actors, args.num_env_batches,
                                                    args.num_env_processes)  # one pool: moolib allows one per process
    print(f"IMPALA benchmark: {args.env}, batch {args.batch_size} x unroll {args.unroll_length}, {args.num_actors} envs "
          f"in {args.num_env_batches} batches [{args.env_backend}, {args.num_env_processes} processes], "
          f"{platform.processor() or platform.machine()}", flush=True)
    rows = []
    try:
        for core, spec in specs.items():
            rows += _bench_core(core, spec, args, precisions, pool)
    finally:
        if hasattr(pool, "close"):
            pool.close()
    print(format_table(rows))
    buf = io.StringIO()
    buf.write(",".join(COLUMNS) + "\n")
    for r in rows:
        buf.write(",".join(f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS) + "\n")
    atomic_write_text(Path(args.out), buf.getvalue())
    print(f"wrote {args.out}")
    return 0


def _bench_core(core: str, spec, args: argparse.Namespace, precisions: list[str], pool) -> list[dict]:
    """The side-by-side runs of one core, one per precision."""
    rows = []
    for precision in precisions:
        row = {"core": core, "precision": precision, "params": sum(p.numel() for p in spec.build_agent().parameters()),
               **side_by_side(spec, _config(args, precision), pool, args.updates, args.warmup_updates),
               "updates": args.updates, "env": spec.env, "num_actors": args.num_actors,
               "num_env_batches": args.num_env_batches, "num_env_processes": args.num_env_processes,
               "batch_size": args.batch_size, "unroll_length": args.unroll_length, "env_backend": args.env_backend}
        rows.append(row)
        print(f"  {core} {precision}: end to end {row['e2e_sps']:,.0f} SPS, compute bound (fp32 NCHW) "
              f"{row['compute_bound_sps']:,.0f} SPS, ratio {row['ratio']:.2f}x", flush=True)
    return rows
