"""Speed settings shared by the trainers: thread counts, mixed precision, and wall-time shares."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch

from rfwp_rl.errors import check_choice

PRECISIONS = ("fp32", "bf16")


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def choose_torch_threads(
    requested: int, env_processes: int = 0, heavy_model: bool = True, gpu: bool = False
) -> tuple[int, str]:
    """Torch intra-op threads for a trainer and why (for the start-up line).

    ``requested`` > 0 wins. Otherwise: a small model (vector observations, an MLP torso) runs
    its tiny per-step matmuls fastest on one thread; an image model gets the cores minus a
    third of the env worker processes, which spend most of their time waiting for actions
    (on 2 cores with 2 env processes: 2 threads).
    """
    cores = available_cores()
    if requested > 0:
        return requested, f"--torch-threads {requested}"
    if gpu:  # idle intra-op threads spin, taking the cores of the env workers from them
        return 1, "GPU learner: the model runs on the GPU, the cores step the envs"
    if not heavy_model:
        return 1, "small model: one thread is fastest for its per-step inference"
    threads = max(1, cores - env_processes // 3)
    return threads, f"{cores} cores, {env_processes} env processes; --torch-threads N to change"


_BLAS_THREAD_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
    "MKL_Set_Num_Threads",
)


def single_thread_blas() -> int:
    """Limit every BLAS library loaded in this process to one thread; returns how many were limited.

    For env worker processes: a worker forked from a process whose BLAS keeps a thread per core spins
    those threads on the small matrix products of observation preprocessing, and many such workers
    on few cores slow each other down (``results/atari/README.md``; ``rfwp-rl bench impala`` shows it as
    the env bound). The libraries are found in ``/proc/self/maps`` (Linux); elsewhere nothing changes.
    """
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl_rt" in line.lower()}
    except OSError:
        return 0
    limited = 0
    for path in sorted(p for p in paths if p.startswith("/") and ".so" in p):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_THREAD_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(1)
                limited += 1
                break
    return limited


def set_torch_threads(threads: int) -> None:
    """Set torch's intra-op thread count (0: leave torch's default)."""
    if threads > 0 and threads != torch.get_num_threads():
        torch.set_num_threads(threads)


def check_precision(precision: str) -> str:
    return check_choice("precision", precision, PRECISIONS)


def autocast(device: torch.device | str, precision: str, cache: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` for ``precision == "bf16"`` (parameters, optimizer state and
    losses stay fp32: autocast only lowers the matmuls and convolutions it runs), else a no-op.
    ``cache=False``: weights are cast anew at every use (as a CUDA graph capture needs)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, cache_enabled=cache)


class Timers:
    """Wall seconds spent in named parts of a loop (``with timers("inference"): ...``), for the
    benchmark's shares of wall time. Not thread-safe: time one thread with it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def reset(self) -> None:
        self.seconds.clear()
