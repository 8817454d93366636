"""``rfwp-rl bench seq``: training tokens/s of the sequence model, per core.

One small language-model configuration for every core (default: vocabulary 1,000, embedding
and hidden size 128, 2 layers, 4 heads, FF 512, batch 8 x 64 tokens): a training step is the
forward pass, cross-entropy, backward pass (full BPTT over the segment) and an Adam update,
on random tokens. Cores are timed round-robin (each repeat times every core once), so a burst
of load from other jobs hits them alike and their ratios stay comparable on a shared machine;
the median of ``--repeats`` timings of ``--updates`` steps is reported, with the mean 1-minute
load average. Prints a table and writes ``results/bench/seq.csv`` (atomic).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from rfwp_rl import flags, kernels
from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.seq.model import SeqModel, core_defaults, core_names

COLUMNS = (
    "core",
    "backend",
    "params",
    "tokens_per_s",
    "ms_per_step",
    "batch_size",
    "seg_len",
    "vocab",
    "hidden_size",
    "num_layers",
    "num_heads",
    "torch_threads",
    "torch",
    "machine",
    "cpus",
    "load_avg_1m",
)


def default_cores() -> list[str]:
    return [c for c in core_names() if c != "ff"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_list_argument(parser, "--cores", None, "cores", default_text="every core but ff")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--seg-len", type=flags.integer, default=64, help="tokens per sequence of the timed batch (default %(default)s)"
    )
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument(
        "--updates", type=flags.integer, default=3, help="timed optimizer steps per repeat (default %(default)s)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    flags.add_shared(parser, "torch_threads", 1)
    parser.add_argument("--out", default="results/bench/seq.csv")


def core_config(core: str, hidden: int, layers: int, heads: int) -> dict:
    defaults = core_defaults(core)
    config = {"hidden_size": hidden}
    if "num_layers" in defaults:
        config["num_layers"] = layers
    if "num_heads" in defaults:
        config.update(num_heads=heads, ff_size=4 * hidden)
    return config


class CoreBench:
    """One core's model, optimizer and a fixed random batch; ``time()`` runs ``updates`` steps."""

    def __init__(self, core: str, args: argparse.Namespace) -> None:
        torch.manual_seed(0)
        self.core, self.args = core, args
        self.config = core_config(core, args.hidden_size, args.num_layers, args.num_heads)
        self.model = SeqModel(core, (args.vocab,), args.vocab, args.hidden_size, self.config)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, args.vocab, (args.seg_len + 1, args.batch_size), generator=g)
        self.times: list[float] = []
        self.step()  # warm-up

    def step(self) -> None:
        logits, _ = self.model(self.x[:-1])
        loss = F.cross_entropy(logits.reshape(-1, self.args.vocab), self.x[1:].reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def time(self) -> None:
        t0 = time.perf_counter()
        for _ in range(self.args.updates):
            self.step()
        self.times.append((time.perf_counter() - t0) / self.args.updates)

    def row(self, load: float) -> dict:
        args, sec = self.args, statistics.median(self.times)
        backend = self.model.core.config.get("backend", "-")
        if backend == "auto":
            backend = kernels.status()[0]
        return {
            "core": self.core,
            "backend": backend,
            "params": sum(p.numel() for p in self.model.parameters()),
            "tokens_per_s": round(args.batch_size * args.seg_len / sec),
            "ms_per_step": round(1000 * sec, 1),
            "batch_size": args.batch_size,
            "seg_len": args.seg_len,
            "vocab": args.vocab,
            "hidden_size": args.hidden_size,
            "num_layers": self.config.get("num_layers", "-"),
            "num_heads": self.config.get("num_heads", "-"),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg_1m": load,
        }


def run(args: argparse.Namespace) -> int:
    for name in (
        "batch_size",
        "seg_len",
        "vocab",
        "hidden_size",
        "num_layers",
        "num_heads",
        "updates",
        "repeats",
        "torch_threads",
    ):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; allowed: >= 1")
    cores = args.cores or default_cores()
    for c in cores:
        check_choice("core", c, default_cores() + ["ff"])
    torch.set_num_threads(args.torch_threads)
    print(
        f"seq training throughput: batch {args.batch_size} x {args.seg_len} tokens, vocab "
        f"{args.vocab}, hidden {args.hidden_size}, {args.num_layers} layers, "
        f"{args.torch_threads} thread(s)",
        flush=True,
    )
    benches = [CoreBench(core, args) for core in cores]
    loads = []
    for _ in range(args.repeats):  # round-robin: a burst of load hits every core alike
        for b in benches:
            b.time()
        loads.append(os.getloadavg()[0])
    load = round(statistics.mean(loads), 2)
    rows = [b.row(load) for b in benches]
    print(f"{'core':<12} {'params':>10} {'tokens/s':>10} {'ms/step':>9}")
    for row in rows:
        print(f"{row['core']:<12} {row['params']:>10,} {row['tokens_per_s']:>10,} {row['ms_per_step']:>9.1f}")
    print(f"(1-minute load average during the run: {load})")
    atomic_write_csv(args.out, rows, COLUMNS, float_format="")
    print(f"wrote {args.out}")
    return 0
