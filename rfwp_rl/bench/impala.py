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
  memory format, ``torch.no_grad`` acting) at the run's sizes:
  ``1 / (act forward per frame + learn forward+backward per frame)``, where acting runs one step
  of an env batch (``num_actors / num_env_batches`` frames) and learning a batch of
  ``batch_size`` x ``unroll_length`` frames; and the ratio ``e2e_sps / compute_bound_sps``.

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

import torch

from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.perf import PRECISIONS

COLUMNS = ("core", "precision", "params", "e2e_sps", "e2e_env_sps", "compute_bound_sps", "ratio", "act_ms_per_frame",
           "learn_ms_per_frame", "share_env_wait", "share_inference", "share_learning", "share_other", "env_cpu",
           "updates", "env", "num_actors", "num_env_batches", "num_env_processes", "batch_size", "unroll_length",
           "env_backend", "torch_threads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cores", default="lstm", help="comma-separated cores (default: %(default)s)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="end-to-end runs, one per precision (default: %(default)s)")
    parser.add_argument("--env", default="Pong")
    parser.add_argument("--num-actors", type=int, default=64, help="environments (default %(default)s)")
    parser.add_argument("--num-env-batches", type=int, default=2)
    parser.add_argument("--num-env-processes", type=int, default=2)
    parser.add_argument("--env-backend", choices=("moolib", "local"), default="moolib")
    parser.add_argument("--batch-size", type=int, default=32, help="paper: 32")
    parser.add_argument("--unroll-length", type=int, default=20, help="paper: 50")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per end-to-end run")
    parser.add_argument("--warmup-updates", type=int, default=1, help="updates before timing starts")
    parser.add_argument("--compute-repeats", type=int, default=3, help="timed repeats of the compute-bound passes")
    parser.add_argument("--torch-threads", type=int, default=0, help="0: the trainer's default choice")
    parser.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda)")
    parser.add_argument("--out", default="results/bench/impala.csv")


def _config(args: argparse.Namespace, precision: str):
    from rfwp_rl.impala.config import ImpalaConfig

    return ImpalaConfig(env=args.env, total_steps=10 ** 12, num_actors=args.num_actors,
                        num_env_batches=args.num_env_batches, num_env_processes=args.num_env_processes,
                        env_backend=args.env_backend, batch_size=args.batch_size, unroll_length=args.unroll_length,
                        precision=precision, torch_threads=args.torch_threads, device=args.device,
                        checkpoint_every=math.inf,
                        log_every=math.inf)


def _random_batch(run, T1: int, B: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    if run.obs_dtype == "uint8":
        obs = torch.randint(0, 256, (T1, B, *run.obs_shape), generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn(T1, B, *run.obs_shape, generator=g)
    A = run.num_actions
    return {"obs": obs, "reward": torch.randn(T1, B, generator=g).sign() * (torch.rand(T1, B, generator=g) < 0.05),
            "done": torch.rand(T1, B, generator=g) < 0.01, "action": torch.randint(A, (T1, B), generator=g),
            "prev_action": torch.randint(A, (T1, B), generator=g), "policy_logits": torch.randn(T1, B, A, generator=g)}


def compute_bound(run, cfg, repeats: int) -> tuple[float, float]:
    """(act forward, learn forward+backward) seconds per frame of the run's model in plain fp32
    NCHW PyTorch, at the run's env-batch size and learner batch."""
    from rfwp_rl.agent import ResNetTorso
    from rfwp_rl.impala.learner import compute_loss, loss_config

    torch.manual_seed(0)
    device = torch.device(cfg.device)
    agent = run.build_agent(device)
    if isinstance(agent.torso, ResNetTorso):
        agent.torso.use_memory_format(torch.contiguous_format)
    g = torch.Generator().manual_seed(0)
    n = cfg.num_actors // cfg.num_env_batches
    act = {k: v[:1, :n].to(device) for k, v in _random_batch(run, 1, n, g).items()}
    state = agent.initial_state(n, device)
    batch = {k: v.to(device) for k, v in _random_batch(run, cfg.unroll_length + 1, cfg.batch_size, g).items()}
    learn_state = agent.initial_state(cfg.batch_size, device)
    loss_cfg = loss_config(cfg)

    def act_once() -> None:
        with torch.no_grad():
            agent(act["obs"], act["reward"], act["done"], state, prev_action=act["prev_action"])

    def learn_once() -> None:
        agent.zero_grad(set_to_none=True)
        compute_loss(agent, batch, learn_state, loss_cfg)[0].backward()

    act_s = _best_time(act_once, repeats * 4, device) / n
    learn_s = _best_time(learn_once, repeats, device) / (cfg.unroll_length * cfg.batch_size)
    return act_s, learn_s


def _best_time(fn, repeats: int, device: torch.device) -> float:
    """The fastest of ``repeats`` timed calls after one warm-up (the machine may be shared)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    best = math.inf
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def end_to_end(run, cfg, pool, updates: int, warmup: int) -> dict[str, float]:
    """The training loop on ``pool`` for ``warmup`` + ``updates`` updates; rates and wall-time shares of the timed part."""
    from rfwp_rl.impala.train import ImpalaTrainer
    from rfwp_rl.runlog import RunLogger

    with tempfile.TemporaryDirectory(prefix="rfwp-bench-") as tmp:
        trainer = ImpalaTrainer(cfg, run, Path(tmp), pool=pool)
        trainer.prepare()
        trainer.logger = RunLogger(tmp, {}, total=cfg.total_steps, print_every=math.inf)
        try:
            while trainer.learner.updates < warmup:
                trainer.iterate()
                trainer.bookkeeping()
            trainer.timers.reset()
            t0, steps0, cpu0 = time.perf_counter(), trainer.actors.env_steps, trainer.actors.envs.worker_cpu_seconds()
            while trainer.learner.updates < warmup + updates:
                trainer.iterate()
                trainer.bookkeeping()
            wall = time.perf_counter() - t0
            cpu1 = trainer.actors.envs.worker_cpu_seconds()
        finally:
            trainer.actors.drain()  # the next run uses the same pool
            trainer.logger.close()
        shares = {k: v / wall for k, v in trainer.timers.seconds.items()}
    return {"e2e_sps": updates * cfg.batch_size * cfg.unroll_length / wall,
            "e2e_env_sps": (trainer.actors.env_steps - steps0) / wall,
            "share_env_wait": shares.get("env", 0.0), "share_inference": shares.get("inference", 0.0),
            "share_learning": shares.get("learning", 0.0),
            "share_other": max(0.0, 1.0 - sum(shares.values())),
            "env_cpu": (cpu1 - cpu0) / wall if cpu0 is not None else float("nan"),
            "torch_threads": trainer.threads}


def _run_spec(core: str, args: argparse.Namespace):
    from rfwp_rl.impala.setup import RunSpec

    ns = argparse.Namespace(env=args.env, core=core, preset=None, overrides=[], detach_state_every_step=False,
                            env_options=[], env_config=None)
    return RunSpec.from_args(ns)


def format_table(rows: list[dict]) -> str:
    head = ["core", "precision", "e2e SPS", "compute bound", "ratio", "env wait", "inference", "learning", "other",
            "env CPU"]
    lines = [head]
    for r in rows:
        lines.append([r["core"], r["precision"], f"{r['e2e_sps']:,.0f}", f"{r['compute_bound_sps']:,.0f}",
                      f"{r['ratio']:.2f}x", *(f"{100 * r[k]:.0f}%" for k in ("share_env_wait", "share_inference",
                                                                              "share_learning", "share_other")),
                      f"{r['env_cpu']:.2f}"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


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
    cfg = _config(args, precisions[0])
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
    """The end-to-end runs of one core (one per precision), each next to the compute bound measured
    around it with the same thread count."""
    from rfwp_rl.perf import choose_torch_threads, set_torch_threads

    env_processes = args.num_env_processes if args.env_backend == "moolib" else 0
    set_torch_threads(choose_torch_threads(args.torch_threads, env_processes, spec.kind == "atari")[0])  # as the trainer
    rows = []
    for precision in precisions:
        cfg = _config(args, precision)
        # the compute bound just before and just after the end-to-end run, averaged: a shared machine's
        # load drifts, and both sides of the ratio should see the same
        before = compute_bound(spec, cfg, args.compute_repeats)
        e2e = end_to_end(spec, cfg, pool, args.updates, args.warmup_updates)
        after = compute_bound(spec, cfg, args.compute_repeats)
        act_s, learn_s = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        bound = 1.0 / (act_s + learn_s)
        params = sum(p.numel() for p in spec.build_agent().parameters())
        row = {"core": core, "precision": precision, "params": params, **e2e, "compute_bound_sps": bound,
               "ratio": e2e["e2e_sps"] / bound, "act_ms_per_frame": 1e3 * act_s, "learn_ms_per_frame": 1e3 * learn_s,
               "updates": args.updates, "env": spec.env, "num_actors": args.num_actors,
               "num_env_batches": args.num_env_batches, "num_env_processes": args.num_env_processes,
               "batch_size": args.batch_size, "unroll_length": args.unroll_length, "env_backend": args.env_backend}
        rows.append(row)
        print(f"  {core} {precision}: end to end {row['e2e_sps']:,.0f} SPS, compute bound (fp32 NCHW) {bound:,.0f} "
              f"SPS, ratio {row['ratio']:.2f}x", flush=True)
    return rows
