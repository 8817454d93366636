"""Time of one A2C meta-RL update per agent: ``python -m rfwp_rl.meta_rl.bench``.

One update = rollout of ``--batch-size`` agents for 30 steps (acting one core step at a time
without gradients, then the training forward over the whole episode) + loss + backward + Adam
step, on the paper's training graphs, as ``rfwp-rl meta-rl`` runs it. The FWM agent is timed
with the ``fwm`` op on its PyTorch reference and on its fused CPU kernel, side by side in one
run (the ratio is printed). Prints a table and writes ``results/meta_rl/update_time.csv``.
Reports CPU time of this process (``time.process_time``) next to wall time, because the machine
may be shared: CPU time is what the update costs, wall time what it took here. Has
``add_arguments``/``run`` like the ``rfwp-rl bench`` modules.
"""

from __future__ import annotations

import argparse
import time

import torch

from rfwp_rl import flags
from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.errors import check_choice
from rfwp_rl.meta_rl import a2c, graph_env
from rfwp_rl.meta_rl.config import MetaRLConfig
from rfwp_rl.meta_rl.model import MetaRLAgent, count_parameters
from rfwp_rl.meta_rl.train import rollout

CONFIG = MetaRLConfig()  # the trainer's optimizer and loss settings
CASES = {  # name -> (core, config, replay the acting steps for training)
    "fwm (reference)": ("fwm", {"backend": "reference"}, True),
    "fwm (fused)": ("fwm", {"backend": "kernel"}, True),
    "fwm (fused) no replay": ("fwm", {"backend": "kernel"}, False),
    "lstm512": ("lstm", {"hidden_size": 512}, True),
    "lstm1024": ("lstm", {"hidden_size": 1024}, True),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_list_argument(
        parser,
        "--cases",
        ["fwm (reference)", "fwm (fused)", "fwm (fused) no replay", "lstm512"],
        f"of {', '.join(CASES)}",
        metavar="CASE",
    )
    parser.add_argument(
        "--batch-size",
        type=flags.integer,
        default=graph_env.NUM_TRAIN_GRAPHS,
        help="agents per optimizer step, one episode each (default %(default)s)",
    )
    parser.add_argument(
        "--updates",
        type=flags.integer,
        default=3,
        help="timed optimizer steps per case, after one warm-up (default %(default)s)",
    )
    flags.add_shared(parser, "torch_threads", 1)
    flags.add_list_argument(parser, "--matmul-precision", ["highest"], "torch float32 matmul precisions to time")
    parser.add_argument("--out", default="results/meta_rl/update_time.csv")


def time_updates(core: str, config: dict, batch: int, updates: int, replay: bool = True) -> dict:
    """Mean CPU and wall seconds of ``updates`` A2C updates (after one warm-up) of ``batch``
    agents on ``core``, and its number of weights (``replay``: see ``train.rollout``)."""
    train_tables, _ = graph_env.graph_sets()
    env = graph_env.GraphBatchEnv(
        train_tables[:batch] if batch <= len(train_tables) else train_tables[torch.arange(batch) % len(train_tables)],
        rng=0,
    )
    torch.manual_seed(0)
    agent = MetaRLAgent(core, config, env.obs_size, env.num_actions)
    opt = torch.optim.Adam(agent.parameters(), lr=CONFIG.learning_rate, eps=CONFIG.adam_eps)
    gen = torch.Generator().manual_seed(0)
    cpu, wall = [], []
    for i in range(updates + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        out = rollout(agent, env, torch.device("cpu"), gen, replay=replay)
        loss = a2c.a2c_loss(
            out["logits"],
            out["values"],
            out["actions"],
            out["rewards"],
            discount=CONFIG.discount,
            baseline_cost=CONFIG.baseline_cost,
            entropy_cost=CONFIG.entropy_cost,
        )["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i:  # the first one warms up
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
    return {"params": count_parameters(agent), "cpu_s": sum(cpu) / len(cpu), "wall_s": sum(wall) / len(wall)}


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.torch_threads)
    names = args.cases
    for n in names:
        check_choice("case", n, CASES)
    precisions = args.matmul_precision
    for p in precisions:
        check_choice("matmul precision", p, ("highest", "high", "medium"))
    rows = []
    print(
        f"{'case':<18} {'matmul':<8} {'weights':>11} {'CPU s/update':>13} {'wall s/update':>14}  "
        f"(batch {args.batch_size}, {graph_env.EPISODE_STEPS} steps, {args.torch_threads} thread(s))"
    )
    for n in names:
        for prec in precisions:
            torch.set_float32_matmul_precision(prec)
            core, config, replay = CASES[n]
            r = time_updates(core, config, args.batch_size, args.updates, replay)
            rows.append({"case": n, "precision": prec, **r})
            print(f"{n:<18} {prec:<8} {r['params']:>11,} {r['cpu_s']:>13.3f} {r['wall_s']:>14.3f}", flush=True)
    torch.set_float32_matmul_precision("highest")
    for prec in precisions:
        cpu = {r["case"]: r["cpu_s"] for r in rows if r["precision"] == prec}
        if "fwm (reference)" in cpu and "fwm (fused)" in cpu:
            print(
                f"fwm, {prec}: fused {cpu['fwm (fused)']:.3f} CPU s/update vs reference "
                f"{cpu['fwm (reference)']:.3f}: {cpu['fwm (reference)'] / cpu['fwm (fused)']:.1f}x fewer"
            )
        if "fwm (fused) no replay" in cpu and "fwm (fused)" in cpu:
            print(
                f"fwm, {prec}: replaying the acting steps {cpu['fwm (fused)']:.3f} vs a second forward "
                f"{cpu['fwm (fused) no replay']:.3f}: {cpu['fwm (fused) no replay'] / cpu['fwm (fused)']:.2f}x fewer"
            )
    table = [
        {
            "case": r["case"],
            "matmul_precision": r["precision"],
            "weights": r["params"],
            "batch_size": args.batch_size,
            "torch_threads": args.torch_threads,
            "cpu_seconds_per_update": r["cpu_s"],
            "wall_seconds_per_update": r["wall_s"],
        }
        for r in rows
    ]
    atomic_write_csv(args.out, table, float_format=".4f")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m rfwp_rl.meta_rl.bench", description=__doc__.splitlines()[0])
    add_arguments(p)
    raise SystemExit(run(p.parse_args()))
