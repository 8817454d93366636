"""The CUDA kernels without a GPU: nvcc compiles every .cu for sm_80/sm_90; the REAL kernel
sources, compiled by the host compiler against csrc/cuda_emu/cuda_emulation.h (threads of a
block = std::threads meeting at a barrier), equal the PyTorch reference in values and
gradients; ThreadSanitizer finds no data race between the threads of a block; the torch side
of the CUDA build compiles."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rfwp_rl.kernels import _build, cases, functions
from rfwp_rl.kernels.emulated import EmulatedCuda, EmulationError
from rfwp_rl.ops import reference as ref

OPS = cases.OPS


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the reference's tiny ops (see test_kernels.py)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def emu():
    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler (g++) to build the CUDA emulation")
    try:
        return EmulatedCuda(threads=32)
    except _build.BuildError as e:
        pytest.fail(f"{e} (log: {e.log})")


# ----------------------------------------------------------------------------------- nvcc

@pytest.mark.parametrize("cu", _build.EMU_CU_FILES)
def test_nvcc_compiles_for_sm80_and_sm90(cu):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the CUDA sources are only checked through the emulation")
    ok, output = _build.nvcc_compile(cu)
    assert ok, output[-3000:]


def test_cuda_torch_binding_compiles():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (no CUDA toolkit headers)")
    include = Path(nvcc).resolve().parent.parent / "include"
    if not (include / "cuda_runtime.h").exists():
        include = Path("/usr/local/cuda/include")
    if not (include / "cuda_runtime.h").exists():
        pytest.skip("CUDA runtime headers not found next to nvcc")
    ok, output = _build.cuda_binding_syntax_check(include)
    assert ok, output[-3000:]


# ------------------------------------------------------------------- emulated = reference

def emulated(emu, name, chunk):
    return lambda *a: functions.FUSED[name](emu, chunk, *a)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d,threads", [(5, 32), (33, 32), (4, 64)])
def test_emulated_kernels_equal_reference(emu, name, d, threads):
    # d = 5: fewer rows than threads, 25 cells over 32 threads; d = 33: more rows than
    # threads, 1089 cells over 32 threads; d = 4 with 64 threads: most threads idle
    emu.threads = threads
    args, reset = cases.make_inputs(name, T=6, B=2, H=2, d=d, seed=d,
                                    reset_at=((0, 1), (2, 1), (4, 0)))
    for chunk in (1, 4):
        err, gerr = cases.max_errors(name, emulated(emu, name, chunk), args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)


@pytest.mark.parametrize("name", ["lt", "delta", "delta_rnn"])
def test_emulated_key_size_different_from_value_size(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=5, B=2, H=1, d=3, dk=7, reset_at=((2, 0),))
    err, gerr = cases.max_errors(name, emulated(emu, name, 2), args, reset)
    assert err < 1e-12 and gerr < 1e-12


@pytest.mark.parametrize("name", OPS)
def test_emulated_float32(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=8, B=2, H=1, d=8, dtype=torch.float32,
                                    reset_at=((3, 1),))
    err, gerr = cases.max_errors(name, emulated(emu, name, 3), args, reset)
    assert err < 1e-5 and gerr < 1e-5


@pytest.mark.parametrize("name", OPS)
def test_emulated_deterministic_and_side_effect_free(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=5, B=2, H=2, d=6, reset_at=((2, 0),))
    before = [a.clone() for a in args]
    fn = emulated(emu, name, 2)
    (o1, g1), (o2, g2) = cases.forward_backward(fn, args, reset), cases.forward_backward(fn, args, reset)
    for x, y in zip(o1 + g1, o2 + g2):
        assert torch.equal(x, y)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", OPS)
def test_emulated_inference_without_checkpoints(emu, name):
    emu.threads = 32
    args, reset = cases.make_inputs(name, T=4, B=2, H=1, d=5, reset_at=((1, 0),))
    with torch.no_grad():
        out = functions.FUSED[name](emu, 3, *args, reset)   # no grad needed: chunk 0 inside
    torch.testing.assert_close(out, getattr(ref, name)(*args, reset), rtol=1e-12, atol=1e-12)


def test_emulated_launch_errors_are_reported(emu):
    emu.threads = 2048   # more than a block can have
    args, reset = cases.make_inputs("lt", T=2, B=1, H=1, d=3)
    try:
        with pytest.raises(EmulationError, match="CUDA error 9"):
            emu.lt_forward(*args, reset, 1)
    finally:
        emu.threads = 32


# ------------------------------------------------------------------ races, emulator itself

@pytest.mark.parametrize("shape", [("4", "1", "2", "5", "16"), ("3", "2", "1", "33", "32")])
def test_no_data_race_between_threads_of_a_block(shape):
    # built with -fsanitize=thread: a missing __syncthreads() between a write and a read by
    # different threads is reported (exit code 66) even when it does not change the result
    try:
        binary = _build.race_check_binary()
    except _build.BuildError as e:   # kernel compile errors fail the other tests of this file
        pytest.skip(f"cannot build with ThreadSanitizer here: {e}")
    proc = subprocess.run([str(binary), *shape], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    assert "launch errors 0" in proc.stdout


def test_emulator_selftest(emu):
    # static __shared__ reduction with threads exiting early, atomics, poisoned dynamic smem
    lib = emu.lib
    P = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    for blocks, threads in ((3, 37), (2, 64), (1, 1)):
        counter, fsum = np.zeros(1, np.int32), np.zeros(1, np.float32)
        maxv, cas = np.full(1, -1, np.int32), np.full(1, -1, np.int32)
        sums, probe = np.zeros(blocks, np.int32), np.zeros(blocks, np.float32)
        assert lib.rfwp_emu_selftest(blocks, threads, P(counter), P(fsum), P(maxv), P(cas),
                                     P(sums), P(probe)) == 0
        n = blocks * threads
        assert counter[0] == n and fsum[0] == 0.5 * n and maxv[0] == n - 1
        assert 0 <= cas[0] < threads          # some thread of block 0 won (blocks run in order)
        assert (sums == threads * (threads + 1) // 2).all()
        assert all(math.isnan(p) for p in probe)
