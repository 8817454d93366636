"""``rfwp-rl bench kernels``: fused CPU (or, with ``--device cuda``, CUDA) kernels against the PyTorch reference.

For each recurrence and size: wall time of the forward pass (no grad) and of forward+backward
(gradients of every input), median of ``--repeats`` runs after a warm-up, reference and fused
side by side in the same process and thread setting. Achieved GFLOP/s of the fused kernel use
an analytic count of the op's arithmetic (below), next to the GFLOP/s of a large float32
matrix product measured in the same run. Times are PER LAYER (one op call); the paper's Atari
agent has 2 layers, i.e. calls the op twice per unroll.

Flop count per step and (batch, head), multiply-add = 2 flops, for dk = dv = d:
  forward   lt 4d² (write v⊗k, read Wq) | delta 6d² (+ v̄ = Wk) | delta_rnn 12d² (W and R)
            | rdn 12d² (delta 6d² + Rq h, Rk h, Rv h)
            | gated_delta 7d² (delta + the decay) | delta_product 4 n_h d² + 2d² (n_h = 2 in the
            benchmark: 10d²) | srwm 7Rd ≈ 21d² (R = 3d + 4 rows ≈ 3d: W = W_init + ΔW, W x,
            W (φ(q) - φ(k)), the write)
  backward  lt 8d² | delta 12d² | delta_rnn 24d² | rdn 24d² (delta 12d², Rᵀ·3 and ∂R·3)
            | gated_delta 15d² (delta + ∂α and the decay of ∂W) | delta_product 8 n_h d² + 4d²
            (20d²) | srwm 13Rd ≈ 39d² (G k, Gᵀ u, Wᵀ ge, Wᵀ gp, the rank-2 update of G and of
            the W_init gradient)
The recomputation of the forward inside checkpoint chunks is not counted (it is overhead).
``fwm`` is not here: its work depends on the low-rank tail, not on d² (its speed is measured in
its setting by ``rfwp-rl bench meta_rl``).

Writes ``results/bench/kernels_cpu.csv`` or ``results/gpu/kernels_cuda.csv`` (atomically) and
prints a table. The machine may be shared with other processes: ratios are measured back to back,
and the load average is recorded; run under ``nice`` on shared machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rfwp_rl import flags, kernels, ops
from rfwp_rl.checkpoint import atomic_write_csv
from rfwp_rl.errors import UserError, check_choice
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import cases

SIZES = {
    "atari": dict(T=51, B=32, H=4, d=32),  # IMPALA unroll 50 (+1), batch 32, 4 heads of 32
    "lm": dict(T=256, B=8, H=8, d=16),  # language modelling span 256, 8 heads of 16
}
FWD_FLOPS = {
    "lt": 4,
    "delta": 6,
    "delta_rnn": 12,
    "rdn": 12,  # × d² per step per (b, h)
    "gated_delta": 7,
    "delta_product": 10,
    "srwm": 21,
}
BWD_FLOPS = {"lt": 8, "delta": 12, "delta_rnn": 24, "rdn": 24, "gated_delta": 15, "delta_product": 20, "srwm": 39}
DEFAULT_OUT = {"cpu": Path("results/bench/kernels_cpu.csv"), "cuda": Path("results/gpu/kernels_cuda.csv")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_list_argument(parser, "--sizes", ["atari", "lm"], f"of {', '.join(SIZES)}")
    flags.add_list_argument(parser, "--ops", list(FWD_FLOPS), "ops", default_text="all")
    n = torch.get_num_threads()
    flags.add_list_argument(
        parser,
        "--torch-threads",
        [1] if n == 1 else [1, n],
        f"{flags.SHARED['torch_threads']}: the counts to measure, 1 and all threads by default. On a machine whose "
        "cores are busy with other processes use 1: OpenMP threads then wait for each other and both the "
        "reference and the kernels slow down erratically",
        item=flags.integer,
        metavar="N",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (median)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (the C++ kernels) or cuda (the CUDA kernels; --torch-threads is then ignored)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="CSV file to write (default results/bench/kernels_cpu.csv; with --device cuda "
        "results/gpu/kernels_cuda.csv)",
    )


def _median_ms(
    fn: Callable[[], object], repeats: int, warmup: int = 1, sync: Callable[[], None] = lambda: None
) -> tuple[float, float]:
    """(median wall ms, median process CPU ms) over ``repeats`` runs after ``warmup`` runs.

    CPU time (all threads of this process) is less sensitive than wall time to other
    processes taking the cores; with one thread it is the op's own work. ``sync`` waits for
    queued device work (CUDA launches are asynchronous), before and after each timed run.
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        sync()
        t, c = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def matmul_gflops(repeats: int, n: int = 1024, device: str = "cpu") -> float:
    """GFLOP/s of a float32 n x n matrix product (torch.mm, current thread setting)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    ms = _median_ms(lambda: torch.mm(a, b), max(repeats, 5), warmup=2, sync=_sync(device))[0]
    return 2 * n**3 / (ms * 1e-3) / 1e9


def _passes(fn: Callable, args: list[torch.Tensor], reset: torch.Tensor):
    def forward():
        with torch.no_grad():
            fn(*args, reset)

    leaves = [a.detach().clone().requires_grad_() for a in args]
    with torch.no_grad():
        cotangents = [torch.randn_like(o) for o in fn(*args, reset)]  # dense, like a real loss

    def forward_backward():
        for x in leaves:
            x.grad = None
        torch.autograd.backward(fn(*leaves, reset), cotangents)

    return forward, forward_backward


def measure(name: str, size: str, repeats: int, fused: Callable, device: str = "cpu") -> dict:
    s = SIZES[size]
    T, B, H, d = s["T"], s["B"], s["H"], s["d"]
    args, reset = cases.make_inputs(
        name, T=T, B=B, H=H, d=d, dtype=torch.float32, seed=0, reset_at=((T // 2, 0),), device=device
    )
    ref_f, ref_fb = _passes(ops.naive(name), args, reset)
    fus_f, fus_fb = _passes(fused, args, reset)
    sync = _sync(device)
    row = {"size": size, "op": name, "T": T, "B": B, "H": H, "d": d, "dtype": "float32", "device": device}
    row["ref_fwd_ms"], row["ref_fwd_cpu_ms"] = _median_ms(ref_f, repeats, sync=sync)
    row["fused_fwd_ms"], row["fused_fwd_cpu_ms"] = _median_ms(fus_f, repeats, sync=sync)
    row["ref_fwdbwd_ms"], row["ref_fwdbwd_cpu_ms"] = _median_ms(ref_fb, repeats, sync=sync)
    row["fused_fwdbwd_ms"], row["fused_fwdbwd_cpu_ms"] = _median_ms(fus_fb, repeats, sync=sync)
    work = T * B * H * d * d
    row["fused_fwd_gflops"] = FWD_FLOPS[name] * work / (row["fused_fwd_ms"] * 1e-3) / 1e9
    row["fused_fwdbwd_gflops"] = (FWD_FLOPS[name] + BWD_FLOPS[name]) * work / (row["fused_fwdbwd_ms"] * 1e-3) / 1e9
    return row


def _check_list(items: list[str], allowed, what: str) -> list[str]:
    if not items:
        raise UserError(f"empty {what} list; allowed: {', '.join(allowed)}")
    return [check_choice(what, x, allowed) for x in items]


def run(args: argparse.Namespace) -> int:
    sizes = _check_list(args.sizes, SIZES, "size")
    names = _check_list(args.ops, tuple(FWD_FLOPS), "op")
    threads = args.torch_threads
    if not threads or min(threads) < 1:
        raise UserError(f"--torch-threads {','.join(map(str, threads))} is invalid; allowed: a list of integers >= 1")
    if args.repeats < 1:
        raise UserError(f"--repeats {args.repeats} must be >= 1")
    device = check_choice("--device", args.device.split(":")[0], ("cpu", "cuda"))
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is visible to torch (torch.cuda.is_available() is False)")
        threads = threads[:1]
        names = [n for n in names if n in cuda_limits.OPS]  # ops with CUDA kernels
    out = args.out or DEFAULT_OUT[device]
    backend, why = kernels.status()
    if backend != "kernel" or (device == "cuda" and not kernels.load()[0].has_cuda()):
        print(f"error: fused {device} kernels unavailable, nothing to compare: {why}")
        return 1
    print(f"rfwp-rl bench kernels ({device}{': ' + torch.cuda.get_device_name() if device == 'cuda' else ''}): {why}")
    print(
        f"per layer (one op call); float32; median of {args.repeats}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine: "
        "ratios are measured back to back)"
    )
    rows = []
    before = torch.get_num_threads()
    try:
        for nt in threads:
            torch.set_num_threads(nt)
            mm = matmul_gflops(args.repeats, n=4096 if device == "cuda" else 1024, device=device)
            print(f"\nthreads {nt}: matmul {'4096' if device == 'cuda' else '1024'}^2 float32 {mm:.1f} GFLOP/s")
            header = (
                f"{'size':6s} {'op':10s} | {'fwd ref':>9s} {'fused':>8s} {'x':>6s} | "
                f"{'fwd+bwd ref':>11s} {'fused':>8s} {'x':>6s} {'x cpu':>6s} | "
                f"{'GFLOP/s':>7s} {'%mm':>5s}"
            )
            print(header)
            print("-" * len(header))
            for size in sizes:
                for name in names:
                    row = measure(name, size, args.repeats, ops.get(name, "kernel"), device)
                    row.update(
                        threads=nt,
                        matmul_gflops=mm,
                        fwd_speedup=row["ref_fwd_ms"] / row["fused_fwd_ms"],
                        fwdbwd_speedup=row["ref_fwdbwd_ms"] / row["fused_fwdbwd_ms"],
                        fwdbwd_cpu_speedup=row["ref_fwdbwd_cpu_ms"] / row["fused_fwdbwd_cpu_ms"],
                        fwdbwd_fraction_of_matmul=row["fused_fwdbwd_gflops"] / mm,
                        load_average=os.getloadavg()[0],
                    )
                    rows.append(row)
                    print(
                        f"{size:6s} {name:10s} | {row['ref_fwd_ms']:7.2f}ms {row['fused_fwd_ms']:6.2f}ms "
                        f"{row['fwd_speedup']:5.1f}x | {row['ref_fwdbwd_ms']:9.2f}ms "
                        f"{row['fused_fwdbwd_ms']:6.2f}ms {row['fwdbwd_speedup']:5.1f}x "
                        f"{row['fwdbwd_cpu_speedup']:5.1f}x | "
                        f"{row['fused_fwdbwd_gflops']:7.1f} {100 * row['fwdbwd_fraction_of_matmul']:4.0f}%"
                    )
    finally:
        torch.set_num_threads(before)
    fields = [
        "size",
        "op",
        "T",
        "B",
        "H",
        "d",
        "dtype",
        "device",
        "threads",
        "ref_fwd_ms",
        "fused_fwd_ms",
        "fwd_speedup",
        "ref_fwdbwd_ms",
        "fused_fwdbwd_ms",
        "fwdbwd_speedup",
        "ref_fwd_cpu_ms",
        "fused_fwd_cpu_ms",
        "ref_fwdbwd_cpu_ms",
        "fused_fwdbwd_cpu_ms",
        "fwdbwd_cpu_speedup",
        "fused_fwd_gflops",
        "fused_fwdbwd_gflops",
        "matmul_gflops",
        "fwdbwd_fraction_of_matmul",
        "load_average",
    ]
    atomic_write_csv(out, rows, fields, float_format=".4g")
    print(f"\nwrote {out}")
    return 0
