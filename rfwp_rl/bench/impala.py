"""``rfwp-rl bench impala``: IMPALA throughput per core, end to end and learner only.

For each core (the Atari presets ``agents/atari_<core>.toml``):

- **learner**: V-trace updates (forward over T+1 steps, full BPTT, RMSProp) on a fixed
  random batch of ``batch_size`` x ``unroll_length`` frames; reported as env steps/s
  consumed (T x B x updates/s);
- **end to end**: the training loop of ``rfwp-rl train`` (env pool, double-buffered batched
  inference, rollouts, updates in turn; no logging or checkpoints), timed over
  ``--e2e-updates`` updates after a warm-up; reported as env steps/s stepped by the actors
  (``e2e_env_sps``) and consumed by the learner (``e2e_train_sps``).

Cores are measured one after the other in one run, so ratios (RDN vs LSTM) are comparable
even on a shared machine. Writes a table and ``results/bench/impala.csv`` (atomic).
"""

from __future__ import annotations

import argparse
import io
import math
import platform
import time
from pathlib import Path

import torch

from rfwp_rl.errors import check_choice

CORES = ("ff", "lstm", "lt", "delta", "delta_rnn", "rdn", "fwm")
COLUMNS = ("core", "params", "learner_sps", "learner_updates_per_s", "e2e_env_sps", "e2e_train_sps",
           "e2e_updates", "env", "num_actors", "batch_size", "unroll_length", "env_backend", "torch_threads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cores", default=",".join(CORES), help="comma-separated cores (default: %(default)s)")
    parser.add_argument("--env", default="Pong")
    parser.add_argument("--num-actors", type=int, default=16, help="environments (default %(default)s)")
    parser.add_argument("--num-env-processes", type=int, default=2)
    parser.add_argument("--env-backend", choices=("moolib", "local"), default="moolib")
    parser.add_argument("--batch-size", type=int, default=32, help="paper: 32")
    parser.add_argument("--unroll-length", type=int, default=50, help="paper: 50")
    parser.add_argument("--learner-updates", type=int, default=2, help="timed learner updates per core (after 1 warm-up)")
    parser.add_argument("--e2e-updates", type=int, default=2,
                        help="timed updates of the end-to-end loop per core, after the warm-up (0 skips it)")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="end-to-end warm-up per core: at least this many seconds and one update")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", default="results/bench/impala.csv")


def _agent(core: str, spec):
    from rfwp_rl.agent import Agent
    from rfwp_rl.presets import resolve_preset

    preset = resolve_preset(core, None, kind=spec.kind)
    return Agent(spec.obs_shape, spec.num_actions, preset.core, preset.core_config, preset.agent)


def bench_learner(agent, spec, batch_size: int, unroll: int, updates: int) -> float:
    """Learner updates per second on a random batch."""
    from rfwp_rl.impala import learner
    from rfwp_rl.safety import NonFiniteGuard

    T1, B = unroll + 1, batch_size
    g = torch.Generator().manual_seed(0)
    if spec.obs_dtype == "uint8":
        obs = torch.randint(0, 256, (T1, B, *spec.obs_shape), generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn(T1, B, *spec.obs_shape, generator=g)
    batch = {"obs": obs, "reward": torch.randn(T1, B, generator=g).sign() * (torch.rand(T1, B, generator=g) < 0.05),
             "done": torch.rand(T1, B, generator=g) < 0.01,
             "action": torch.randint(spec.num_actions, (T1, B), generator=g),
             "prev_action": torch.randint(spec.num_actions, (T1, B), generator=g),
             "policy_logits": torch.randn(T1, B, spec.num_actions, generator=g)}
    state = agent.initial_state(B)
    opt = learner.make_optimizer(agent, 6e-4, 0.99, 0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    cfg, guard = learner.LossConfig(), NonFiniteGuard()
    learner.update(agent, opt, sched, batch, state, cfg, 40.0, guard)  # warm-up
    t0 = time.perf_counter()
    for _ in range(updates):
        learner.update(agent, opt, sched, batch, state, cfg, 40.0, guard)
    return updates / (time.perf_counter() - t0)


def bench_end_to_end(agent, spec, pool, args) -> tuple[float, float, int]:
    """(actor env steps/s, learner env steps/s, timed updates) of the training loop: warm-up
    for ``args.warmup`` seconds and at least one update, then time ``args.e2e_updates`` updates."""
    from rfwp_rl.impala import learner
    from rfwp_rl.impala.actors import Actors, RolloutQueue
    from rfwp_rl.safety import NonFiniteGuard

    actors = Actors(pool, agent, args.num_actors, 2, args.unroll_length)
    queue = RolloutQueue(args.batch_size)
    opt = learner.make_optimizer(agent, 6e-4, 0.99, 0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    cfg, guard = learner.LossConfig(), NonFiniteGuard()
    updates = 0
    t_start = time.perf_counter()
    t0 = steps0 = updates0 = None
    try:
        while True:
            rollouts, _ = actors.step()
            for r in rollouts:
                queue.put(r)
            while queue.ready():
                b = queue.get()
                learner.update(agent, opt, sched, b.data, b.state, cfg, 40.0, guard)
                updates += 1
                now = time.perf_counter()
                if t0 is None and now - t_start >= args.warmup:
                    t0, steps0, updates0 = now, actors.env_steps, updates
                elif t0 is not None and updates - updates0 >= args.e2e_updates:
                    dt = now - t0
                    n = updates - updates0
                    return (actors.env_steps - steps0) / dt, n * args.batch_size * args.unroll_length / dt, n
    finally:
        actors.drain()  # the next core's actors use the same pool


def _ratio(x: float, ref: float) -> str:
    return f"{x / ref:.2f}x" if math.isfinite(x) and math.isfinite(ref) and ref > 0 else "-"


def format_table(rows: list[dict]) -> str:
    head = ["core", "params", "learner SPS", "vs LSTM", "e2e env SPS", "e2e train SPS", "vs LSTM"]
    lstm = next((r for r in rows if r["core"] == "lstm"), None)
    lines = [head]
    for r in rows:
        ref_l = lstm["learner_sps"] if lstm else float("nan")
        ref_e = lstm["e2e_train_sps"] if lstm else float("nan")
        lines.append([r["core"], f"{r['params']:,}", f"{r['learner_sps']:,.0f}", _ratio(r["learner_sps"], ref_l),
                      f"{r['e2e_env_sps']:,.0f}", f"{r['e2e_train_sps']:,.0f}", _ratio(r["e2e_train_sps"], ref_e)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def run(args: argparse.Namespace) -> int:
    from rfwp_rl import cores as cores_module
    from rfwp_rl import envs
    from rfwp_rl.checkpoint import atomic_write_text

    cores = [c.strip() for c in args.cores.split(",") if c.strip()]
    for c in cores:
        check_choice("core", c, sorted(cores_module.available()))
    if args.env_backend == "moolib":
        from rfwp_rl.impala.actors import import_moolib
        import_moolib()
    torch.set_num_threads(args.torch_threads)
    spec = envs.env_spec(args.env)
    print(f"IMPALA benchmark: {spec.gym_id}, batch {args.batch_size} x unroll {args.unroll_length}, "
          f"{args.num_actors} envs [{args.env_backend}, {args.num_env_processes} processes], "
          f"{args.torch_threads} torch thread(s), {platform.processor() or platform.machine()}", flush=True)
    pool = None
    if args.e2e_updates > 0:  # one pool for every core (moolib allows one EnvPool per process)
        from rfwp_rl.impala.actors import make_env_pool
        pool = make_env_pool(args.env_backend, spec.env_id, {}, 0, args.num_actors, 2, args.num_env_processes)
    rows = []
    for core in cores:
        torch.manual_seed(0)
        agent = _agent(core, spec)
        ups = bench_learner(agent, spec, args.batch_size, args.unroll_length, args.learner_updates)
        row = {"core": core, "params": sum(p.numel() for p in agent.parameters()),
               "learner_sps": ups * args.batch_size * args.unroll_length, "learner_updates_per_s": ups,
               "e2e_env_sps": float("nan"), "e2e_train_sps": float("nan"), "e2e_updates": 0}
        if pool is not None:
            row["e2e_env_sps"], row["e2e_train_sps"], row["e2e_updates"] = bench_end_to_end(agent, spec, pool, args)
        row.update(env=spec.gym_id, num_actors=args.num_actors, batch_size=args.batch_size,
                   unroll_length=args.unroll_length, env_backend=args.env_backend, torch_threads=args.torch_threads)
        rows.append(row)
        print(f"  {core}: learner {row['learner_sps']:,.0f} SPS, end to end {row['e2e_env_sps']:,.0f} env SPS "
              f"({row['e2e_updates']} updates)", flush=True)
    if pool is not None and hasattr(pool, "close"):
        pool.close()
    print(format_table(rows))
    buf = io.StringIO()
    buf.write(",".join(COLUMNS) + "\n")
    for r in rows:
        buf.write(",".join(f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS) + "\n")
    atomic_write_text(Path(args.out), buf.getvalue())
    print(f"wrote {args.out}")
    return 0
