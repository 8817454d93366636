"""Self-check of the fused kernels on this machine (``rfwp-rl info --check``).

Runs every op's fused kernel against its PyTorch reference on every kernel backend present:
the C++ kernels on the CPU, the CUDA kernels on each visible GPU, and the CUDA sources run on
the host through the emulation (``csrc/cuda_emu``) when a host compiler builds it. Values and
gradients of every input, with resets mid-sequence and non-zero initial states; float64
against the float64 reference, float32 against the float64 reference (ground truth). Also
times forward + backward of both. A GPU user runs it once after installing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rfwp_rl import kernels
from rfwp_rl.kernels import _build, cuda_limits
from rfwp_rl.kernels.emulated import EmulatedCuda
from rfwp_rl.ops import OPS, cases

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}
"""Largest relative error (max |difference| / max |reference|) of outputs and of gradients."""


@dataclass
class Backend:
    """A kernel backend to check: where it runs and at which sizes."""

    device: str  # "cpu", "cuda:0", ...
    label: str  # "fused C++", "fused CUDA", "emulated CUDA"
    be: Any  # the kernel backend (extension or emulation)
    T: int
    B: int
    H: int
    d: int
    cuda: bool = False  # runs the CUDA kernels (only the ops that have one, cuda_limits.OPS)
    timed: bool = True  # False: checked only (the emulation's times are those of the CPU, not of a GPU)

    def runs(self, name: str) -> bool:
        """Whether this backend has a kernel for op ``name``."""
        return not self.cuda or name in cuda_limits.OPS


@dataclass
class Row:
    """One line of the table: op x backend x dtype."""

    op: str
    device: str
    backend: str
    dtype: str
    out_err: float
    grad_err: float
    ok: bool
    fused_ms: float
    ref_ms: float


def backends(emulation: bool = True) -> tuple[list[Backend], list[str]]:
    """(the kernel backends present here, notes on those that are not)."""
    found, notes = [], []
    ext, why = kernels.load()
    if ext is None:
        notes.append(f"fused kernels: {why}")
    else:
        found.append(Backend("cpu", "fused C++", ext, T=16, B=4, H=2, d=16))
        if torch.cuda.is_available():
            if ext.has_cuda():
                found += [
                    Backend(f"cuda:{i}", "fused CUDA", ext, T=16, B=4, H=2, d=32, cuda=True)
                    for i in range(torch.cuda.device_count())
                ]
            else:
                notes.append(f"CUDA: a GPU is present but this build has CPU kernels only ({why})")
    if emulation:
        try:  # every emulated GPU thread is a fiber on this thread: small sizes
            emulated = EmulatedCuda(threads=32)
            found.append(Backend("cpu", "emulated CUDA", emulated, T=6, B=2, H=1, d=8, cuda=True, timed=False))
        except (_build.BuildError, OSError) as e:
            notes.append(f"emulated CUDA: not built ({e})")
    return found, notes


def _median_ms(fn: Callable[[], object], device: str, repeats: int = 3) -> float:
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def check_op(name: str, backend: Backend, dtype: torch.dtype) -> Row:
    """Compare op ``name`` on ``backend`` in ``dtype`` with the float64 reference."""
    spec = OPS[name]
    T, B = backend.T, backend.B
    truth_args, reset = cases.make_inputs(
        name,
        T=T,
        B=B,
        H=backend.H,
        d=backend.d,
        device=backend.device,
        seed=3,
        reset_at=((0, 1), (T // 2, 0), (T - 2, B - 1)),
    )
    args = [a.to(dtype) for a in truth_args]
    chunk = max(2, T // 3)  # several chunks: checkpoints and recomputation are exercised

    def fused(*a):
        return spec.fused(backend.be, chunk, *a)

    true_out, true_grad = cases.forward_backward(spec.naive, truth_args, reset)
    try:
        out, grad = cases.forward_backward(fused, args, reset)
        out_err = cases.relative_error(true_out, out)
        grad_err = cases.relative_error(true_grad, grad)
        fused_ms = float("nan")
        if backend.timed:
            fused_ms = _median_ms(lambda: cases.forward_backward(fused, args, reset), backend.device)
    except Exception:  # a failed launch is a failed check, not a crash of the check
        out_err = grad_err = fused_ms = float("nan")
    ref_ms = float("nan")
    if backend.timed:
        ref_ms = _median_ms(lambda: cases.forward_backward(spec.naive, args, reset), backend.device)
    ok = out_err <= TOLERANCE[dtype] and grad_err <= TOLERANCE[dtype]
    return Row(
        name, backend.device, backend.label, str(dtype).replace("torch.", ""), out_err, grad_err, ok, fused_ms, ref_ms
    )


def run_checks(found: Iterable[Backend], dtypes=(torch.float64, torch.float32)) -> list[Row]:
    """Every op on every backend that has its kernel, in every dtype."""
    return [check_op(name, b, dtype) for b in found for dtype in dtypes for name in OPS if b.runs(name)]


def _ms(value: float, width: int) -> str:
    return f"{value:{width}.2f}" if value == value else f"{'-':>{width}}"  # NaN: not timed


def format_table(rows: list[Row]) -> str:
    header = (
        f"{'op':<10} {'device':<7} {'backend':<14} {'dtype':<8} {'max err y':>9} "
        f"{'max err grad':>12} {'result':<6} {'fused ms':>9} {'ref ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.op:<10} {r.device:<7} {r.backend:<14} {r.dtype:<8} {r.out_err:9.1e} "
            f"{r.grad_err:12.1e} {'pass' if r.ok else 'FAIL':<6} {_ms(r.fused_ms, 9)} {_ms(r.ref_ms, 8)}"
        )
    return "\n".join(lines)


def main(emulation: bool = True, print_fn: Callable[[str], None] = print) -> int:
    """Run the self-check and print its table; 0 when every op agrees, else 1 (also when no
    fused kernel is available to check)."""
    found, notes = backends(emulation)
    sizes = ", ".join(f"{b.label}: T={b.T} B={b.B} H={b.H} d={b.d}{'' if b.timed else ', not timed'}" for b in found)
    print_fn(
        "self-check: fused kernels against the PyTorch reference, values and gradients of "
        "every input, resets mid-sequence, non-zero initial states; relative errors "
        f"(max |difference| / max |float64 reference|); fused and reference ms are "
        f"forward + backward ({sizes})"
    )
    for note in notes:
        print_fn(f"  {note}")
    rows = run_checks(found)
    if rows:
        print_fn(format_table(rows))
    failed = [r for r in rows if not r.ok]
    if not rows:
        print_fn("self-check: FAIL (no fused kernel to check)")
        return 1
    if failed:
        print_fn(f"self-check: FAIL ({len(failed)} of {len(rows)} disagree with the reference)")
        return 1
    print_fn(f"self-check: pass ({len(rows)} checks)")
    return 0
