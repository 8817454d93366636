"""What each CUDA kernel of ``csrc/cuda`` asks of a GPU, and whether a GPU can give it.

Pure Python (no torch import at module level, no build): the dispatch asks :func:`check`
before it launches a kernel and falls back to the reference with the returned reason.

    >>> from rfwp_rl.kernels import cuda_limits as cl
    >>> cl.check("delta_rnn", "backward", 128, 128, 8, cl.H100)
    'delta_rnn backward at d=128 float64 needs 311 KB of shared memory; this GPU (H100, sm_90) allows 227 KB per block'
    >>> cl.check("rdn", "backward", 128, 128, 4, cl.A100) is None
    True

:func:`requirements` mirrors the launchers exactly (``csrc/cuda/*.cu``: ``*_smem_bytes``,
``launch_threads``); ``tests/test_kernels_cuda_emulated.py`` compares it with what the
emulated launchers request. Half-precision inputs (``dtype_bytes=2``) are converted to
float32 once in the binding, so they need what float32 needs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from rfwp_rl.resources import data_dir

OPS = ("lt", "delta", "delta_rnn", "rdn", "gated_delta", "delta_product", "srwm", "mamba")
PRODUCT_OPS = ("gated_delta", "delta_product")  # one kernel (csrc/cuda/householder_product.cu)
DIRECTIONS = ("forward", "backward")

# Largest block the kernels are compiled for: __launch_bounds__(MAX_THREADS) in
# csrc/cuda/common.cuh (kMaxThreads). ptxas then keeps registers per thread at or below
# 65536 / MAX_THREADS, so a block of at most MAX_THREADS threads always has the registers.
MAX_THREADS = 512
WARP = 32

# Registers per thread and static shared memory (bytes) of every kernel, from
# ``nvcc --resource-usage`` (CUDA 13.0) for sm_80 and sm_90, keyed by (kernel, scalar bytes).
# Regenerate with:  python -m rfwp_rl.kernels.cuda_limits --resource-usage
# (needs nvcc; prints this table and the spill/stack numbers).
RESOURCES: dict[tuple[str, int], dict[int, tuple[int, int]]] = {
    # (kernel, bytes): {arch: (registers, static smem bytes)}
    ("delta_backward<delta>", 4): {80: (89, 0), 90: (94, 0)},
    ("delta_backward<delta>", 8): {80: (98, 0), 90: (96, 0)},
    ("delta_backward<lt>", 4): {80: (78, 0), 90: (89, 0)},
    ("delta_backward<lt>", 8): {80: (82, 0), 90: (87, 0)},
    ("delta_forward<delta>", 4): {80: (64, 0), 90: (72, 0)},
    ("delta_forward<delta>", 8): {80: (65, 0), 90: (77, 0)},
    ("delta_forward<lt>", 4): {80: (63, 0), 90: (64, 0)},
    ("delta_forward<lt>", 8): {80: (64, 0), 90: (63, 0)},
    ("delta_rnn_backward", 4): {80: (110, 0), 90: (128, 0)},
    ("delta_rnn_backward", 8): {80: (124, 0), 90: (120, 0)},
    ("delta_rnn_forward", 4): {80: (94, 0), 90: (96, 0)},
    ("delta_rnn_forward", 8): {80: (94, 0), 90: (106, 0)},
    ("product_backward", 4): {80: (124, 0), 90: (126, 0)},
    ("product_backward", 8): {80: (128, 0), 90: (128, 0)},
    ("product_forward", 4): {80: (48, 0), 90: (54, 0)},
    ("product_forward", 8): {80: (52, 0), 90: (58, 0)},
    ("rdn_backward", 4): {80: (114, 0), 90: (124, 0)},
    ("rdn_backward", 8): {80: (124, 0), 90: (124, 0)},
    ("rdn_forward", 4): {80: (72, 0), 90: (96, 0)},
    ("rdn_forward", 8): {80: (91, 0), 90: (107, 0)},
    ("selective_scan_backward", 4): {80: (72, 0), 90: (80, 0)},
    ("selective_scan_backward", 8): {80: (82, 0), 90: (84, 0)},
    ("selective_scan_forward", 4): {80: (48, 0), 90: (54, 0)},
    ("selective_scan_forward", 8): {80: (56, 0), 90: (60, 0)},
    ("srwm_backward", 4): {80: (60, 0), 90: (90, 0)},
    ("srwm_backward", 8): {80: (103, 0), 90: (128, 0)},
    ("srwm_forward", 4): {80: (56, 0), 90: (72, 0)},
    ("srwm_forward", 8): {80: (64, 0), 90: (96, 0)},
}


def kernel_name(op: str, direction: str) -> str:
    """Name of the kernel (template instance) that runs ``op`` in ``direction``."""
    if op in ("lt", "delta"):
        return f"delta_{direction}<{op}>"
    if op in PRODUCT_OPS:
        return f"product_{direction}"
    if op == "mamba":
        return f"selective_scan_{direction}"
    return f"{op}_{direction}"


@dataclass(frozen=True)
class Requirements:
    """What one launch asks for (per block)."""

    smem_dynamic: int  # bytes of dynamic shared memory
    smem_static: int  # bytes of static __shared__ variables
    threads_per_block: int
    regs_per_thread: int

    @property
    def smem_total(self) -> int:
        return self.smem_dynamic + self.smem_static


@dataclass(frozen=True)
class DeviceLimits:
    """Per-block limits of a GPU that decide whether a launch can run."""

    name: str
    arch: int  # compute capability as 10 * major + minor (80: A100, 90: H100)
    smem_optin_bytes: int  # cudaDevAttrMaxSharedMemoryPerBlockOptin (static + dynamic)
    max_threads_per_block: int = 1024
    regs_per_block: int = 65536
    regs_per_sm: int = 65536

    @classmethod
    def from_torch(cls, device: Any = None) -> DeviceLimits:
        """The limits of a CUDA device (``torch.device``, index or None: the current one)."""
        import torch

        props = torch.cuda.get_device_properties(device)
        arch = 10 * props.major + props.minor
        smem = getattr(props, "shared_memory_per_block_optin", 0) or _OPTIN_BY_ARCH.get(arch, 48 * 1024)
        regs_sm = getattr(props, "regs_per_multiprocessor", 0) or 65536
        return cls(
            name=f"{props.name}, sm_{arch}",
            arch=arch,
            smem_optin_bytes=int(smem),
            max_threads_per_block=1024,
            regs_per_block=min(65536, int(regs_sm)),
            regs_per_sm=int(regs_sm),
        )


@functools.cache
def _limits_of_index(index: int) -> DeviceLimits:
    return DeviceLimits.from_torch(index)


def limits_of(device: Any) -> DeviceLimits:
    """:meth:`DeviceLimits.from_torch` of a CUDA ``torch.device`` (or index), cached per device
    (cheap enough to call on every dispatch)."""
    index = device if isinstance(device, int) else getattr(device, "index", None)
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return _limits_of_index(int(index))


# cudaDevAttrMaxSharedMemoryPerBlockOptin by compute capability (when torch does not report it)
_OPTIN_BY_ARCH = {
    70: 96 * 1024,
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    120: 99 * 1024,
}

A100 = DeviceLimits("A100, sm_80", 80, 163 * 1024)
H100 = DeviceLimits("H100, sm_90", 90, 227 * 1024)


# ------------------------------------------------------------------- mirrors of the launchers


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _padded_ld(cols: int) -> int:
    """common.cuh padded_ld: odd leading dimension (no bank conflicts in row/column sweeps)."""
    return cols + 1 if cols % 2 == 0 else cols


def launch_threads(dk: int, dv: int, threads: int = 0) -> int:
    """Block size the launchers use (common.cuh launch_threads_for): ``threads`` (0: about four
    cells of the dv x dk matrix per thread) rounded up to whole warps, in [32, MAX_THREADS]."""
    if threads <= 0:
        threads = min(MAX_THREADS, (dk * dv + 3) // 4)
    threads = min(threads, MAX_THREADS)
    return _round_up(max(threads, WARP), WARP)


def srwm_rows(d: int) -> int:
    """Rows of the srwm matrix of head size d: y, q, k (d each) and 4 learning rates."""
    return 3 * d + 4


def block_threads(op: str, dk: int, dv: int, threads: int = 0) -> int:
    """Block size of op's kernels: :func:`launch_threads` for its matrix (srwm: (3d + 4) x d)."""
    return launch_threads(dk, srwm_rows(dv), threads) if op == "srwm" else launch_threads(dk, dv, threads)


def _mat(rows: int, cols: int) -> int:
    return rows * _padded_ld(cols)


def _smem_elems(op: str, direction: str, dk: int, dv: int, stage: bool) -> int:
    """Scalars of dynamic shared memory (csrc/cuda/*.cu: *_smem_bytes). ``stage``: the
    backward's running state (and rdn's recurrent slow weights) in shared memory."""
    if op in ("lt", "delta"):
        if direction == "forward":
            return _mat(dv, dk) + 3 * (2 * dk + dv + 1) + 2 * dv
        # two sweeps: G [dv, dk], then Wᵀ [dk, dv] in the same memory; nothing staged
        return max(_mat(dv, dk), _mat(dk, dv)) + 3 * (2 * dk + 3 * dv + 1) + 3 * dv
    if op == "delta_rnn":
        if direction == "forward":
            return _mat(dv, dk) + _mat(dv, dv) + 3 * (2 * dk + 3 * dv + 2) + 6 * dv
        return (
            (_mat(dv, dk) + _mat(dv, dv)) * (2 if stage else 1)
            + 3 * (dk + 3 * dv + 2)
            + 3 * (2 * dk + 7 * dv + 2)
            + 13 * dv
        )
    if op in PRODUCT_OPS:  # the state (or its gradient) only: the same for every n_h
        return _mat(dv, dk) + (3 * dv if direction == "backward" else 0)
    if op == "mamba":  # when staged: the D x N state (forward), or its gradient and A's partial sums (backward)
        return _mat(dv, dk) * (2 if direction == "backward" else 1) if stage else 0
    if op == "srwm":  # dk == dv == d; the matrix (R = 3d + 4 rows) only when staged
        d, R = dk, srwm_rows(dk)
        m = _mat(R, d) if stage else 0
        if direction == "forward":
            return m + d + R + 3 * d + 4
        return m + 2 * d + (2 * d + 4 + R) + d + 3 * R + 2 * d + 4
    d = dk  # rdn: dk == dv
    if direction == "forward":
        return _mat(d, d) + (_mat(3 * d, d) if stage else 0) + d + 2 * (3 * d + 1) + 6 * d + 1
    return (
        _mat(d, d) + (_mat(d, d) + _mat(3 * d, d) if stage else 0) + d + 3 * (2 * d + 1) + 3 * (6 * d + 1) + 13 * d + 1
    )


def smem_request(op: str, direction: str, dk: int, dv: int, dtype_bytes: int, smem_optin: int | None = None) -> int:
    """Dynamic shared memory (bytes) the launcher requests on a device with ``smem_optin``
    bytes per block (None: unlimited): the staged layout when it fits, else the smaller one
    (csrc/cuda/lt_delta.cu smem_request)."""
    _validate(op, direction, dk, dv)
    elem = _compute_bytes(dtype_bytes)
    full = _smem_elems(op, direction, dk, dv, True) * elem
    if smem_optin is None or smem_optin <= 0 or full <= smem_optin:
        return full
    return _smem_elems(op, direction, dk, dv, False) * elem


def _compute_bytes(dtype_bytes: int) -> int:
    if dtype_bytes not in (2, 4, 8):
        raise ValueError(
            f"dtype_bytes {dtype_bytes!r} is invalid; allowed: 2 (float16/bfloat16, "
            "computed in float32), 4 (float32), 8 (float64)"
        )
    return 4 if dtype_bytes == 2 else dtype_bytes


def _validate(op: str, direction: str, dk: int, dv: int) -> None:
    if op not in OPS:
        raise ValueError(f"op {op!r} is invalid; allowed: {', '.join(OPS)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is invalid; allowed: {', '.join(DIRECTIONS)}")
    if dk < 1 or dv < 1:
        raise ValueError(f"head sizes must be >= 1, got dk={dk}, dv={dv}")
    if op in ("rdn", "srwm") and dk != dv:
        raise ValueError(f"{op} needs dk == dv, got dk={dk}, dv={dv}")


def registers(op: str, direction: str, dtype_bytes: int, arch: int | None = None) -> tuple[int, int]:
    """(registers per thread, static shared memory bytes) of the kernel on ``arch``
    (None or an arch not in the table: the largest of the table's, which is conservative)."""
    entry = RESOURCES[(kernel_name(op, direction), _compute_bytes(dtype_bytes))]
    if arch in entry:
        return entry[arch]
    lower = [a for a in entry if arch is not None and a <= arch and a // 10 == arch // 10]
    if lower:
        return entry[max(lower)]
    return max(r for r, _ in entry.values()), max(s for _, s in entry.values())


def requirements(
    op: str,
    direction: str,
    dk: int,
    dv: int,
    dtype_bytes: int,
    *,
    threads: int = 0,
    arch: int | None = None,
    smem_optin: int | None = None,
) -> Requirements:
    """What the launcher of ``op`` (``forward``/``backward``) asks for at key size ``dk``,
    value size ``dv`` (mamba: the state size N and the channels D) and scalar size
    ``dtype_bytes`` (2: half types, computed in float32), for a ``threads`` request (0:
    default), on a GPU of compute capability ``arch`` (None: the most registers of the table)
    with ``smem_optin`` bytes of shared memory per block (None: unlimited; the backward
    kernels, rdn, srwm and mamba keep less in shared memory when the largest layout does not
    fit)."""
    _validate(op, direction, dk, dv)
    regs, static = registers(op, direction, dtype_bytes, arch)
    return Requirements(
        smem_dynamic=smem_request(op, direction, dk, dv, dtype_bytes, smem_optin),
        smem_static=static,
        threads_per_block=block_threads(op, dk, dv, threads),
        regs_per_thread=regs,
    )


def _block_registers(regs_per_thread: int, threads: int) -> int:
    """Registers a block takes: per warp, ceil to 256 of 32 * regs (regs rounded up to 8)."""
    per_warp = _round_up(32 * _round_up(regs_per_thread, 8), 256)
    return per_warp * math.ceil(threads / WARP)


def _kb(n: int) -> str:
    return f"{math.ceil(n / 1024)} KB"


def _dtype_name(dtype_bytes: int) -> str:
    return {2: "float16/bfloat16", 4: "float32", 8: "float64"}[dtype_bytes]


def _size(op: str, dk: int, dv: int) -> str:
    if op == "mamba":
        return f"N={dk}, D={dv}"
    return f"d={dk}" if dk == dv else f"dk={dk}, dv={dv}"


def check(
    op: str, direction: str, dk: int, dv: int, dtype_bytes: int, limits: DeviceLimits, *, threads: int = 0
) -> str | None:
    """None if the kernel can launch on a GPU with ``limits``, else a one-line reason naming
    the size and the limit."""
    req = requirements(
        op, direction, dk, dv, dtype_bytes, threads=threads, arch=limits.arch, smem_optin=limits.smem_optin_bytes
    )
    what = f"{op} {direction} at {_size(op, dk, dv)} {_dtype_name(dtype_bytes)}"
    if req.smem_total > limits.smem_optin_bytes:
        return (
            f"{what} needs {_kb(req.smem_total)} of shared memory; this GPU ({limits.name}) "
            f"allows {limits.smem_optin_bytes // 1024} KB per block"
        )
    if req.threads_per_block > limits.max_threads_per_block:
        return (
            f"{what} needs {req.threads_per_block} threads per block; this GPU "
            f"({limits.name}) allows {limits.max_threads_per_block}"
        )
    regs = _block_registers(req.regs_per_thread, req.threads_per_block)
    if regs > min(limits.regs_per_block, limits.regs_per_sm):
        return (
            f"{what} needs {regs} registers per block ({req.regs_per_thread} per thread x "
            f"{req.threads_per_block} threads); this GPU ({limits.name}) allows "
            f"{min(limits.regs_per_block, limits.regs_per_sm)}"
        )
    return None


def table(
    sizes: tuple[int, ...] = (16, 32, 64, 128),
    dtypes: tuple[int, ...] = (4, 8),
    devices: tuple[DeviceLimits, ...] = (A100, H100),
) -> list[dict[str, Any]]:
    """Shared memory (static + dynamic, bytes) of every kernel at ``d = dk = dv`` on each
    device and whether it fits: rows of dicts (op, direction, d, dtype, threads, <device>,
    "smem <device>")."""
    rows = []
    for op in OPS:
        for direction in DIRECTIONS:
            for elem in dtypes:
                for d in sizes:
                    row = {
                        "op": op,
                        "direction": direction,
                        "d": d,
                        "dtype": _dtype_name(elem),
                        "threads": block_threads(op, d, d),
                    }
                    for dev in devices:
                        req = requirements(op, direction, d, d, elem, arch=dev.arch, smem_optin=dev.smem_optin_bytes)
                        row[dev.name] = check(op, direction, d, d, elem, dev) is None
                        row["smem " + dev.name] = req.smem_total
                    rows.append(row)
    return rows


def markdown_table(sizes: tuple[int, ...] = (16, 32, 64, 128)) -> str:
    """:func:`table` as a Markdown table: KB of shared memory per block on an H100 (the
    layout the launcher picks there) and which of A100 / H100 can run it."""
    lines = [
        "| op | direction | dtype | " + " | ".join(f"d={d}" for d in sizes) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in sizes) + " |",
    ]
    rows = table(sizes)
    for op in OPS:
        for direction in DIRECTIONS:
            for dt in ("float32", "float64"):
                cells = []
                for d in sizes:
                    r = next(x for x in rows if (x["op"], x["direction"], x["dtype"], x["d"]) == (op, direction, dt, d))
                    fits = "A100+H100" if r[A100.name] else ("H100 only" if r[H100.name] else "neither")
                    cells.append(f"{_kb(r['smem ' + H100.name])} ({fits})")
                lines.append(f"| {op} | {direction} | {dt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------- regenerating the register table

NVCC_RESOURCE_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--resource-usage")


def nvcc_resource_command(cu: Any, csrc: Any, arch: int, out: str) -> list[str]:
    """The nvcc command whose ptxas report :func:`parse_resource_usage` reads."""
    return [
        "nvcc",
        "-c",
        str(cu),
        "-o",
        out,
        f"-I{csrc}",
        "-gencode",
        f"arch=compute_{arch},code=sm_{arch}",
        *NVCC_RESOURCE_FLAGS,
    ]


def parse_resource_usage(report: str, arch: int) -> list[dict[str, Any]]:
    """One dict per kernel of a ptxas ``--resource-usage`` report: kernel (short name, see
    :func:`_demangle`), arch, registers, stack, spill_stores, spill_loads (bytes), smem_static."""
    import re

    rows: list[dict[str, Any]] = []
    name, spill = None, (0, 0, 0)
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = _demangle(m.group(1))
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = tuple(int(x) for x in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            sm = re.search(r"(\d+) bytes smem", line)
            rows.append(
                {
                    "kernel": name,
                    "arch": arch,
                    "registers": int(m.group(1)),
                    "stack": spill[0],
                    "spill_stores": spill[1],
                    "spill_loads": spill[2],
                    "smem_static": int(sm.group(1)) if sm else 0,
                }
            )
            name = None
    return rows


def resource_usage(csrc: Any = None, archs: tuple[int, ...] = (80, 90)) -> list[dict[str, Any]]:
    """Run ``nvcc --resource-usage`` on csrc/cuda/*.cu for each arch (see
    :func:`parse_resource_usage`)."""
    import subprocess
    import tempfile
    from pathlib import Path

    if csrc is None:
        csrc = data_dir("csrc")
    csrc = Path(csrc)
    rows: list[dict[str, Any]] = []
    for cu in CU_FILES:
        for arch in archs:
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run(
                    nvcc_resource_command(csrc / cu, csrc, arch, f"{tmp}/x.o"), capture_output=True, text=True
                )
            if proc.returncode != 0:
                raise RuntimeError(f"nvcc failed on {cu}: {proc.stderr[-2000:]}")
            rows += parse_resource_usage(proc.stderr, arch)
    return rows


def resources_table(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, tuple[int, int]]]:
    """:data:`RESOURCES` from :func:`resource_usage` rows (recurrence kernels only)."""
    by: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    for r in rows:
        name, _, size = r["kernel"].rpartition("/")
        if name.startswith(("outer_sum", "batch_sum")) or not size.isdigit():
            continue
        by.setdefault((name, int(size)), {})[r["arch"]] = (r["registers"], r["smem_static"])
    return by


# the CUDA sources of the kernels (csrc/), which the build compiles and nvcc's resource usage reads
CU_FILES = (
    "cuda/lt_delta.cu",
    "cuda/delta_rnn.cu",
    "cuda/rdn.cu",
    "cuda/householder_product.cu",
    "cuda/srwm.cu",
    "cuda/selective_scan.cu",
)


def _demangle(symbol: str) -> str:
    """Short kernel name: 'delta_forward<lt>/4', 'rdn_backward/8', 'outer_sum/4',
    'product_forward/4' (gated_delta, delta_product), 'srwm_backward/8',
    'selective_scan_forward/4' (mamba), 'batch_sum/8'."""
    import re
    import subprocess

    try:
        text = subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip()
    except OSError:
        text = symbol
    m = re.search(r"(\w+)_kernel<(float|double)(?:, (true|false))?", text)
    if not m:
        return text
    base, scalar, flag = m.groups()
    size = 4 if scalar == "float" else 8
    if flag is not None:
        base += "<delta>" if flag == "true" else "<lt>"
    return f"{base}/{size}"


def _main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m rfwp_rl.kernels.cuda_limits", description=__doc__.splitlines()[0])
    p.add_argument(
        "--resource-usage", action="store_true", help="run nvcc --resource-usage and print the RESOURCES table"
    )
    args = p.parse_args(argv)
    if args.resource_usage:
        rows = resource_usage()
        print("| kernel | arch | registers | spill stores/loads | stack | static smem |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in sorted(rows, key=lambda r: (r["kernel"], r["arch"])):
            print(
                f"| {r['kernel']} | sm_{r['arch']} | {r['registers']} | {r['spill_stores']}/"
                f"{r['spill_loads']} | {r['stack']} | {r['smem_static']} |"
            )
        print("\nRESOURCES = {")
        by = resources_table(rows)
        for key in sorted(by):
            print(f"    {key!r}: {dict(sorted(by[key].items()))!r},")
        print("}")
    else:
        print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
