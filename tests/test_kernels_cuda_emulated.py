"""The CUDA kernels without a GPU: nvcc compiles every .cu for sm_80/sm_90 within the register
budget of the launch bounds (and rfwp_rl.kernels.cuda_limits has its numbers); the REAL kernel
sources, compiled by the host compiler against csrc/cuda_emu/cuda_emulation.h (threads of a
block = fibers meeting at a barrier, warps in lockstep at every shuffle), equal the
PyTorch reference in values and gradients at the head sizes the cores use; the launchers ask
for exactly what cuda_limits says, clamp block sizes and report configuration errors without
leaving them pending; ThreadSanitizer finds no data race between the threads of a block and
does find one when a barrier is removed; the torch side of the CUDA build compiles."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rfwp_rl import ops
from rfwp_rl.kernels import _build, cuda_limits
from rfwp_rl.kernels.emulated import EmulationError
from rfwp_rl.ops import cases

OPS = tuple(n for n in ops.OPS if n in cuda_limits.OPS)  # the ops with CUDA kernels
ELEM = {torch.float32: 4, torch.float64: 8}
# relative tolerance against the float64 reference (cases.max_errors scales by the largest value)
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference's tiny ops (see test_kernels.py)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def device_limits(emu):
    """Restores the emulated device's reported limits and the block size after a test."""
    yield emu
    emu.set_device_smem_optin(None)
    emu.threads = 32
    emu.launches()


# ----------------------------------------------------------------------------------- nvcc


# the nvcc and ThreadSanitizer builds take minutes on a cold kernel cache: marked slow
@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("cu", _build.EMU_CU_FILES)
def test_nvcc_compiles_for_sm80_and_sm90(cu, arch):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the CUDA sources are only checked through the emulation")
    ok, output = _build.nvcc_compile(cu, arch)  # the build the resource test reads (cached)
    assert ok, output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
def test_nvcc_resource_usage_within_launch_bounds_and_tabled(arch, tmp_path):
    # every recurrence kernel fits 512 threads (<= 128 registers), spills at most a few
    # bytes, and cuda_limits.RESOURCES holds ptxas's numbers (regenerate: python -m
    # rfwp_rl.kernels.cuda_limits --resource-usage)
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    rows = []
    for cu in cuda_limits.CU_FILES:
        ok, output = _build.nvcc_compile(cu, arch)
        assert ok, output[-3000:]
        rows += cuda_limits.parse_resource_usage(output, arch)
    table = cuda_limits.resources_table(rows)
    assert set(table) == set(cuda_limits.RESOURCES)
    for key, per_arch in table.items():
        assert cuda_limits.RESOURCES[key][arch] == per_arch[arch], (key, arch)
    for r in rows:
        if r["kernel"].startswith("outer_sum"):
            assert r["registers"] <= 65536 // 128
            continue
        assert r["registers"] <= 65536 // cuda_limits.MAX_THREADS, r
        assert r["spill_stores"] <= 16 and r["spill_loads"] <= 16, r


@pytest.mark.slow
def test_cuda_torch_binding_compiles():
    include = _build.cuda_runtime_include()
    if include is None:
        pytest.skip("no CUDA runtime headers (nvcc is not on PATH, or its toolkit has none)")
    ok, output = _build.cuda_binding_syntax_check(include)
    assert ok, output[-3000:]


# ------------------------------------------------------------------- emulated = reference


def emulated(emu, name, chunk):
    return lambda *a: ops.spec(name).fused(emu, chunk, *a)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d,threads", [(5, 32), (33, 32), (4, 64)])
def test_emulated_kernels_equal_reference(emu, name, d, threads):
    # d = 5: 4 lanes per row, 20 of 32 threads busy; d = 33: more rows than threads (one lane
    # per row); d = 4 with 64 threads: 8 lanes per row over two warps, half the threads idle
    emu.threads = threads
    args, reset = cases.make_inputs(name, T=6, B=2, H=2, d=d, seed=d, reset_at=((0, 1), (2, 1), (4, 0)))
    for chunk in (1, 4):
        err, gerr = cases.max_errors(name, emulated(emu, name, chunk), args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)


# The head sizes of the cores, float32 and float64, resets mid-sequence (entry 1 at t=1, entry
# 0 at t=3) and non-zero initial states; threads: the launchers' default where the emulation
# stays quick (64 at d=16, 256 at d=32), else 128 (4 warps: 2 lanes per row at d=64, 1 at 128).
SIZES = [(16, 0), (32, 0), (64, 128), (128, 128)]


def _fits(emu, name, d, dk, dtype) -> str | None:
    limits = cuda_limits.DeviceLimits("emulated", 90, emu.device_smem_optin())
    return cuda_limits.check(name, "forward", dk, d, ELEM[dtype], limits) or cuda_limits.check(
        name, "backward", dk, d, ELEM[dtype], limits
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("d,threads", SIZES, ids=[f"d{d}" for d, _ in SIZES])
@pytest.mark.parametrize("name", OPS)
def test_emulated_head_sizes(device_limits, name, d, threads, dtype):
    emu = device_limits
    emu.threads = threads
    args, reset = cases.make_inputs(name, T=5, B=2, H=1, d=d, seed=d + 1, dtype=dtype, reset_at=((1, 1), (3, 0)))
    why = _fits(emu, name, d, d, dtype)
    if why is not None:  # beyond the device: the launcher refuses as cuda_limits says
        assert name == "delta_rnn" and d == 128 and dtype == torch.float64, why
        with pytest.raises(EmulationError, match="CUDA error 9"):
            emulated(emu, name, 2)(*args, reset)
        assert emu.pending_error() == 0
        return
    err, gerr = cases.max_errors(name, emulated(emu, name, 2), args, reset)
    assert err < TOL[dtype] and gerr < TOL[dtype], (err, gerr)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["lt", "delta", "delta_rnn"])
def test_emulated_dpfp_key_size(emu, name, dtype):
    # DPFP-1 keys of a d = 16 head: dk = 2 * 1 * 16 = 32, dv = 16 (rdn's fused kernel is
    # softmax-only; DPFP rdn runs on the reference)
    emu.threads = 0
    args, reset = cases.make_inputs(name, T=5, B=2, H=2, d=16, dk=32, dtype=dtype, seed=3, reset_at=((2, 0), (4, 1)))
    err, gerr = cases.max_errors(name, emulated(emu, name, 3), args, reset)
    emu.threads = 32
    assert err < TOL[dtype] and gerr < TOL[dtype], (err, gerr)


@pytest.mark.parametrize("name", ["lt", "delta", "delta_rnn"])
def test_emulated_key_size_different_from_value_size(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=5, B=2, H=1, d=3, dk=7, reset_at=((2, 0),))
    err, gerr = cases.max_errors(name, emulated(emu, name, 2), args, reset)
    assert err < 1e-12 and gerr < 1e-12


@pytest.mark.parametrize("name", ["delta_rnn", "rdn", "mamba"])
def test_emulated_unstaged_layouts(device_limits, name):
    # a device too small for the staged layout: the backward re-reads its running state from
    # the workspace, rdn reads Rq, Rk, Rv from global memory, mamba keeps its state (and, in
    # the backward, its gradient and A's partial sums) in global memory; same results (lt and
    # delta stage nothing: their two-sweep backward holds one matrix)
    emu = device_limits
    emu.threads = 64
    args, reset = cases.make_inputs(name, T=6, B=2, H=1, d=16, seed=5, reset_at=((2, 1), (4, 0)))
    small = emu.smem_request(name, "backward", 16, 16, 8, optin=1)  # the unstaged size
    assert small < emu.smem_request(name, "backward", 16, 16, 8)
    emu.set_device_smem_optin(max(small, 1))  # 0 would restore the true limit
    emu.launches()
    for chunk in (2, 6):
        err, gerr = cases.max_errors(name, emulated(emu, name, chunk), args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)
    assert small in [smem for _, _, smem in emu.launches()]


@pytest.mark.parametrize("name", OPS)
def test_emulated_deterministic_and_side_effect_free(emu, name):
    # bitwise the same whatever order the threads of a block run in between barriers
    emu.threads = 64
    args, reset = cases.make_inputs(name, T=5, B=2, H=2, d=6, reset_at=((2, 0),))
    before = [a.clone() for a in args]
    fn = emulated(emu, name, 2)
    try:
        runs = []
        for seed in (0, 1, 2):
            emu.set_schedule(seed)
            runs.append(cases.forward_backward(fn, args, reset))
    finally:
        emu.set_schedule(0)
    (o1, g1) = runs[0]
    for o2, g2 in runs[1:]:
        for x, y in zip(o1 + g1, o2 + g2):
            assert torch.equal(x, y)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", OPS)
def test_emulated_inference_without_checkpoints(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=4, B=2, H=1, d=5, reset_at=((1, 0),))
    with torch.no_grad():
        out = ops.spec(name).fused(emu, 3, *args, reset)  # no grad needed: chunk 0 inside
    torch.testing.assert_close(out, ops.naive(name)(*args, reset), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", OPS)
def test_emulated_empty_sequence(emu, name):
    # T = 0: empty outputs, final states equal to the initial ones; the initial states'
    # gradients are those of the final states, every other gradient is zero or empty
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=0, B=2, H=2, d=5)
    states = ops.spec(name).state_args[: 2 if name == "rdn" else len(ops.spec(name).state_args)]
    states = states[:2] if name == "delta_rnn" else states[:1]  # the final states returned
    g = torch.Generator().manual_seed(7)
    y_shape = (0, 2, 10) if name == "mamba" else (0, 2, 2, 5)  # mamba: [T, B, D], D = H d channels
    shapes = [y_shape] + [args[s].shape for s in states]
    cotangents = [torch.randn(sh, generator=g, dtype=torch.float64) for sh in shapes]
    outs, grads = cases.forward_backward(emulated(emu, name, 2), args, reset, cotangents)
    assert outs[0].shape == y_shape
    for o, s in zip(outs[1:], states):
        assert torch.equal(o, args[s])
    for i, gr in enumerate(grads):
        if i in states:
            assert torch.equal(gr, cotangents[1 + states.index(i)])
        else:  # inputs over time: empty; y0, rdn's slow weights, mamba's A: nothing read them
            assert gr.shape == args[i].shape
            assert gr.numel() == 0 or torch.equal(gr, torch.zeros_like(gr)), i


# ------------------------------------------------------------ launch configuration, limits

DIMS = [(5, 5), (16, 16), (32, 16), (32, 32), (33, 33), (64, 64), (128, 128), (7, 3)]


@pytest.mark.parametrize("optin", [None, 100 * 1024, 1], ids=["h100", "100KB", "tiny"])
def test_smem_request_equals_cuda_limits(emu, optin):
    optin_bytes = optin or cuda_limits.H100.smem_optin_bytes
    for name in OPS:
        for direction in cuda_limits.DIRECTIONS:
            for elem in (4, 8):
                for dk, dv in DIMS:
                    if not ops.spec(name).key_size_free and dk != dv:  # rdn, srwm
                        continue
                    want = cuda_limits.smem_request(name, direction, dk, dv, elem, optin_bytes)
                    assert emu.smem_request(name, direction, dk, dv, elem, optin_bytes) == want
                    req = cuda_limits.requirements(name, direction, dk, dv, elem, smem_optin=optin_bytes)
                    assert req.smem_dynamic == want
    # half types compute in float32
    assert cuda_limits.requirements("delta", "forward", 32, 32, 2) == cuda_limits.requirements(
        "delta", "forward", 32, 32, 4
    )


def test_launch_threads_equal_cuda_limits(emu):
    for dk, dv in DIMS + [(1, 1), (2, 300)]:
        for threads in (0, -3, 1, 31, 32, 33, 100, 256, 512, 513, 4096):
            assert emu.launch_threads(dk, dv, threads) == cuda_limits.launch_threads(dk, dv, threads)
    assert cuda_limits.launch_threads(16, 16) == 64
    assert cuda_limits.launch_threads(128, 128) == cuda_limits.MAX_THREADS


@pytest.mark.parametrize("name", OPS)
def test_launches_ask_what_cuda_limits_says(device_limits, name):
    # the recorded launches (grid, block, dynamic shared memory) of a forward and backward
    emu = device_limits
    for d, dk, dtype, threads in ((5, 5, torch.float64, 40), (16, 16, torch.float32, 0), (8, 12, torch.float64, 3000)):
        if not ops.spec(name).key_size_free and dk != d:  # rdn, srwm
            continue
        emu.threads = threads
        args, reset = cases.make_inputs(name, T=3, B=1, H=2, d=d, dk=dk, dtype=dtype, reset_at=((1, 0),))
        emu.launches()
        cases.forward_backward(emulated(emu, name, 2), args, reset)
        log = emu.launches()
        optin = emu.device_smem_optin()
        # one block per (b, h); mamba: one per batch entry, its D = H d channels the matrix rows
        blocks, dv = (1, 2 * d) if name == "mamba" else (1 * 2, d)
        expect = []
        for direction in ("forward", "backward"):
            req = cuda_limits.requirements(name, direction, dk, dv, ELEM[dtype], threads=threads, smem_optin=optin)
            expect.append((blocks, req.threads_per_block, req.smem_dynamic))
        assert log[:2] == expect, (d, dk, threads)
        assert all(block <= cuda_limits.MAX_THREADS and block % 32 == 0 for _, block, _ in log)
        if name == "rdn":  # the slow-weight gradients: one launch for Rq, Rk, Rv, one for rb
            assert len(log) == 4
        if name == "mamba":  # A's gradient: the entries' partial sums added by a second launch
            assert len(log) == 3 and log[2][2] == 0


def test_launch_beyond_the_device_is_refused_and_cleared(device_limits):
    emu = device_limits
    emu.threads = 32
    args, reset = cases.make_inputs("delta_rnn", T=2, B=1, H=1, d=128, dtype=torch.float64)
    need = cuda_limits.smem_request("delta_rnn", "forward", 128, 128, 8)
    assert need > emu.device_smem_optin()
    # the launcher sees the limit: cudaErrorInvalidConfiguration, no CUDA call made
    with pytest.raises(EmulationError, match="CUDA error 9"):
        emu.delta_rnn_forward(*args, reset, 0)
    assert emu.pending_error() == 0
    # the device claims more than it grants: the attribute call fails (invalid value), and the
    # launcher clears the error so that the next launch is not blamed for it
    emu.set_device_smem_optin(4 * need)
    with pytest.raises(EmulationError, match="CUDA error 1"):
        emu.delta_rnn_forward(*args, reset, 0)
    assert emu.pending_error() == 0
    emu.set_device_smem_optin(None)
    small, reset = cases.make_inputs("delta", T=2, B=1, H=1, d=4)
    torch.testing.assert_close(
        emu.delta_forward(*small, reset, 0)[0], ops.naive("delta")(*small, reset)[0], rtol=1e-12, atol=1e-12
    )


def test_cuda_limits_table_and_messages():
    # what fits where (static + dynamic shared memory against the opt-in limit)
    A, H = cuda_limits.A100, cuda_limits.H100
    for name in OPS:
        for direction in cuda_limits.DIRECTIONS:
            for d in (16, 32, 64):
                assert cuda_limits.check(name, direction, d, d, 4, A) is None
            assert cuda_limits.check(name, direction, 128, 128, 4, A) is None
    assert cuda_limits.check("delta", "backward", 128, 128, 8, A) is None
    assert cuda_limits.check("rdn", "backward", 64, 64, 8, A) is None  # unstaged on an A100
    assert cuda_limits.check("rdn", "backward", 128, 128, 8, H) is None
    why = cuda_limits.check("rdn", "backward", 128, 128, 8, A)
    assert why is not None and why.startswith("rdn backward at d=128 float64 needs ")
    assert "KB of shared memory; this GPU (A100, sm_80) allows 163 KB per block" in why
    why = cuda_limits.check("delta_rnn", "forward", 128, 128, 8, H)
    assert why == (
        "delta_rnn forward at d=128 float64 needs 280 KB of shared memory; "
        "this GPU (H100, sm_90) allows 227 KB per block"
    )
    assert "dk=64, dv=32" in cuda_limits.check(
        "delta_rnn", "backward", 64, 32, 8, cuda_limits.DeviceLimits("small", 80, 16 * 1024)
    )
    # a block that exceeds the register file (a device with fewer registers than the bound)
    few_regs = cuda_limits.DeviceLimits("tiny", 90, 227 * 1024, regs_per_block=16384, regs_per_sm=16384)
    assert "registers per block" in cuda_limits.check("rdn", "forward", 64, 64, 4, few_regs)
    with pytest.raises(ValueError, match="rdn needs dk == dv"):
        cuda_limits.requirements("rdn", "forward", 32, 16, 4)
    with pytest.raises(ValueError, match="dtype_bytes"):
        cuda_limits.requirements("lt", "forward", 32, 16, 3)
    assert "| rdn | backward | float64 |" in cuda_limits.markdown_table()


def test_cuda_limits_from_torch_needs_a_gpu():
    if torch.cuda.is_available():
        lim = cuda_limits.DeviceLimits.from_torch(0)
        assert lim.smem_optin_bytes >= 48 * 1024 and lim.arch >= 70
        assert cuda_limits.limits_of(torch.device("cuda", 0)) == lim
    else:
        with pytest.raises((AssertionError, RuntimeError)):
            cuda_limits.DeviceLimits.from_torch(0)


# ------------------------------------------------------------------ half precision binding


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("name", tuple(ops.OPS))
def test_half_inputs_computed_in_float32_by_the_binding(name, dtype):
    # The binding (csrc/bindings.cpp) converts half inputs to float32 once, for CPU and CUDA
    # alike, and returns outputs and gradients in the input dtype: checked here on the CPU
    # build (the CUDA build shares the code; tests/test_kernels_gpu.py runs it on a GPU).
    try:
        ext, _ = _build.load_extension(with_cuda=False)
    except _build.BuildError as e:
        pytest.skip(f"CPU extension not available: {e}")
    args, reset = cases.make_inputs(name, T=5, B=2, H=1, d=8, seed=4, reset_at=((2, 0),))
    halves = [a.to(dtype) for a in args]
    dtypes, worst = cases.half_precision_errors(name, lambda *a: ops.spec(name).fused(ext, 2, *a), halves, reset)
    assert dtypes == {dtype} and worst <= 4, (dtypes, worst)  # within 4 eps of the float64 reference


# ------------------------------------------------------------------ races, emulator itself


def _race_check(binary: Path, shape: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *shape], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [("4", "1", "2", "5", "64"), ("3", "2", "1", "33", "64")])
def test_no_data_race_between_threads_of_a_block(shape):
    # built with -fsanitize=thread: a missing __syncthreads() between a write and a read by
    # threads of different warps is reported (exit code 66) even when it does not change the
    # result. d = 5 with 64 threads: 8 lanes per row over two warps
    try:
        binary = _build.race_check_binary()
    except _build.BuildError as e:  # kernel compile errors fail the other tests of this file
        pytest.skip(f"cannot build with ThreadSanitizer here: {e}")
    proc = _race_check(binary, shape)
    assert proc.returncode == 0 and "ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    assert "launch errors 0" in proc.stdout


def _race_check_without(cu: str, barrier: str, tag: str, cu_files: tuple[str, ...], *defines: str) -> Path:
    """The race-check binary built from a copy of csrc/ whose ``cu`` lacks the line ``barrier``
    (kept in the kernel cache under ``tag``, so the build is cached); skips without g++ or TSan."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    text = (_build.CSRC / cu).read_text()
    assert text.count(barrier) == 1
    src = _build.cache_root() / f"{tag}_src_{_build._hash(_build.EMU_PARTS, tag)}"
    if not (src / cu).exists():
        shutil.copytree(_build.CSRC, src, dirs_exist_ok=True)
        (src / cu).write_text(text.replace(barrier, ""))
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-fsanitize=thread", "-pthread", *defines, f"-I{src}"]
    cmd += ["-include", str(src / "cuda_emu" / "cuda_emulation.h"), "-x", "c++", *[str(src / f) for f in cu_files]]
    cmd += ["-x", "none", str(src / "cuda_emu" / "race_check.cpp"), "-o", "{out}/race_check"]
    ok, output, out_dir = _build._cached_command(tag, cmd, text + _build._tool_version(cxx))
    if not ok:
        pytest.skip(f"cannot build with ThreadSanitizer here: {output[-500:]}")
    return out_dir / "race_check"


@pytest.mark.slow
def test_race_check_finds_a_removed_barrier():
    # the forward of lt/delta without the barrier that publishes the step's vectors
    cu = "cuda/lt_delta.cu"
    barrier = "    __syncthreads();   // the step's vectors are in shared memory\n"
    binary = _race_check_without(cu, barrier, "tsan_mutant", (cu,), "-DRFWP_RACE_ONLY_LT_DELTA")
    proc = _race_check(binary, ("3", "1", "1", "5", "64"))
    assert "ThreadSanitizer: data race" in proc.stderr, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.slow
def test_race_check_finds_a_removed_barrier_in_the_mamba_backward():
    # the mamba backward without the barrier between the reverse walk (each row writes its
    # h_t, G_t) and the column phase (sums over the rows); d = 33 with 64 threads: one lane per
    # row, so no warp shuffle lies between the write and the read
    barrier = "    __syncthreads();   // every row's h_t and G_t of the chunk are in the workspace\n"
    cu_files = ("cuda/lt_delta.cu", "cuda/selective_scan.cu")  # the smem_request of lt_delta.cu
    cu = "cuda/selective_scan.cu"
    binary = _race_check_without(cu, barrier, "tsan_mutant_mamba", cu_files, "-DRFWP_RACE_ONLY_MAMBA")
    proc = _race_check(binary, ("3", "2", "1", "33", "64"))
    assert "ThreadSanitizer: data race" in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert "selective_scan_backward_kernel" in proc.stderr


def test_emulator_selftest(emu):
    # static __shared__ reduction with threads exiting early, atomics, poisoned dynamic smem
    lib = emu.lib
    P = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    for blocks, threads in ((3, 37), (2, 64), (1, 1)):
        counter, fsum = np.zeros(1, np.int32), np.zeros(1, np.float32)
        maxv, cas = np.full(1, -1, np.int32), np.full(1, -1, np.int32)
        sums, probe = np.zeros(blocks, np.int32), np.zeros(blocks, np.float32)
        assert lib.rfwp_emu_selftest(blocks, threads, P(counter), P(fsum), P(maxv), P(cas), P(sums), P(probe)) == 0
        n = blocks * threads
        assert counter[0] == n and fsum[0] == 0.5 * n and maxv[0] == n - 1
        assert 0 <= cas[0] < threads  # some thread of block 0 won (blocks run in order)
        assert (sums == threads * (threads + 1) // 2).all()
        assert all(math.isnan(p) for p in probe)


def test_emulator_warp_intrinsics(emu):
    threads = 64
    out = np.zeros((threads, 8), np.int32)
    assert emu.lib.rfwp_emu_warp_selftest(threads, out.ctypes.data_as(ctypes.c_void_p)) == 0
    for tid in range(threads):
        w, lane = divmod(tid, 32)
        v = lambda lane_, w=w: 32 * w + lane_ + 1
        s, b, bal, up, dn, x8, rot, dd = (int(x) for x in out[tid])
        assert s == sum(v(x) for x in range(32))
        assert b == v(3)
        assert (bal & 0xFFFFFFFF) == sum(1 << x for x in range(32) if v(x) % 3 == 0)
        assert up == (v(lane - 1) if lane >= 1 else v(lane))
        assert dn == (v(lane + 2) if lane + 2 < 32 else v(lane))
        seg = lane // 8 * 8
        assert x8 == sum(v(x) for x in range(seg, seg + 8))
        assert rot == v((lane + 5) % 32)
        assert dd == v(lane ^ 1)


def test_cuda_limits_doctest():
    import doctest

    assert doctest.testmod(cuda_limits).failed == 0


def test_a_deadlocked_block_is_reported_not_hung(tmp_path):
    # thread 0 waits at __syncthreads() while thread 1 waits at __syncwarp(), which needs thread 0:
    # neither barrier completes, and the fiber scheduler says so and aborts
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    src = tmp_path / "deadlock.cu"
    src.write_text(
        "__global__ void stuck() { if (threadIdx.x == 0) __syncthreads(); else __syncwarp(); }\n"
        "int main() { ::cuda_emu::launch(stuck, dim3(1), dim3(2), 0, nullptr); return 0; }\n"
    )
    header = _build.CSRC / "cuda_emu" / "cuda_emulation.h"
    build = [cxx, "-std=c++20", "-pthread", "-include", str(header), "-x", "c++", str(src), "-o", str(tmp_path / "d")]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    proc = subprocess.run([str(tmp_path / "d")], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "deadlock" in proc.stderr, (proc.returncode, proc.stderr)
