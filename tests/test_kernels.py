"""Fused C++ (CPU) kernels against the PyTorch reference: values, gradients (gradcheck),
non-zero initial states, resets mid-sequence, determinism, no side effects, fallbacks."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rfwp_rl import kernels, ops
from rfwp_rl.errors import UserError
from rfwp_rl.kernels import _build, cases, functions
from rfwp_rl.ops import reference as ref

OPS = cases.OPS
D = torch.float64
RESETS = ((0, 1), (2, 2), (4, 0), (5, 1))   # (t, b): includes a reset at t = 0


@pytest.fixture(autouse=True)
def one_thread():
    # Many tiny reference ops: on a shared 2-core machine OpenMP's barriers make them 10-50x
    # slower with 2 threads than with 1. The multi-threaded kernel path is tested explicitly.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ext():
    backend, why = kernels.status()
    if backend != "kernel":
        pytest.fail(f"the fused CPU kernels are not available: {why}")
    return kernels._load()[0]


def fused(ext, name: str, chunk: int):
    return lambda *a: functions.FUSED[name](ext, chunk, *a)


# ------------------------------------------------------------------------- values, gradients

@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d", [3, 16])          # 3: plain-loop path, 16: register-blocked path
def test_gradcheck_with_initial_state_and_reset(ext, name, d):
    B = 2 if d == 3 else 1
    args, reset = cases.make_inputs(name, T=4, B=B, H=1, d=d, reset_at=((2, B - 1),))
    args = [a.requires_grad_() for a in args]
    fn = lambda *a: functions.FUSED[name](ext, 2, *a, reset)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(args), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("d", [5, 16, 32, 64])
def test_float64_equals_reference(ext, name, d):
    args, reset = cases.make_inputs(name, T=7, B=3, H=2, d=d, reset_at=RESETS, seed=d)
    for chunk in (1, 3, 7):
        err, gerr = cases.max_errors(name, fused(ext, name, chunk), args, reset)
        assert err < 1e-12 and gerr < 1e-12, (chunk, err, gerr)


@pytest.mark.parametrize("name", ["lt", "delta", "delta_rnn"])
def test_key_size_different_from_value_size(ext, name):
    # DPFP-ν maps d to 2νd: W is [d, 2νd]
    args, reset = cases.make_inputs(name, T=6, B=2, H=3, d=5, dk=10, reset_at=((3, 1),))
    err, gerr = cases.max_errors(name, fused(ext, name, 4), args, reset)
    assert err < 1e-12 and gerr < 1e-12


SIZES = {"atari": dict(T=51, B=32, H=4, d=32), "lm": dict(T=256, B=8, H=8, d=16)}


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("size", sorted(SIZES))
def test_float32_at_benchmark_sizes(ext, name, size):
    # the float32 fused kernel against the float64 reference (ground truth)
    s = SIZES[size]
    T, B = s["T"], s["B"]
    args, reset = cases.make_inputs(name, **s, reset_at=((T // 3, 1), (T // 2, B - 1)), seed=7)
    # the same random cotangents (seeded; rounded to float32 for the kernel) for both runs
    true_out, true_grad = cases.forward_backward(getattr(ref, name), args, reset)
    out, grad = cases.forward_backward(kernels.get(name, required=True), [a.float() for a in args],
                                       reset)
    for x, y in zip(true_out + true_grad, out + grad):
        assert y.dtype == torch.float32
        torch.testing.assert_close(y.double(), x, rtol=1e-4, atol=1e-4 * float(x.abs().max()))


def test_lt_query_gradient_includes_initial_fast_weights(ext):
    # The reference CUDA code's LT backward dropped W0 from dL/dq. With v = 0 the fast weights
    # stay W0, so y_t = W0 q_t and dL/dq_t = W0^T dL/dy_t exactly; after entry 0's reset at
    # t = 3 they are zero and so is that gradient.
    T, B, H, d = 5, 2, 2, 4
    (q, k, v, W0), _ = cases.make_inputs("lt", T=T, B=B, H=H, d=d, seed=3)
    v = torch.zeros_like(v)
    reset = torch.zeros(T, B, dtype=torch.bool)
    reset[3, 0] = True
    q.requires_grad_()
    y, _ = kernels.get("lt", required=True)(q, k, v, W0, reset)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(0), dtype=D)
    y.backward(gy)
    expect = torch.einsum("bhij,tbhi->tbhj", W0, gy)
    expect[3:, 0] = 0
    assert expect.abs().max() > 0.1
    torch.testing.assert_close(q.grad, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", OPS)
def test_inference_without_checkpoints(ext, name):
    # without gradients the forward stores no checkpoints and builds no autograd node
    args, reset = cases.make_inputs(name, T=5, B=2, H=2, d=16, reset_at=((2, 1),))
    fn = kernels.get(name, required=True)
    with torch.no_grad():
        out = fn(*args, reset)
    assert all(o.grad_fn is None for o in out)
    torch.testing.assert_close(out, getattr(ref, name)(*args, reset), rtol=1e-12, atol=1e-12)
    ckpt = getattr(ext, f"{name}_forward")(*args, reset, 0)[2 if name in ("lt", "delta", "rdn") else 3]
    assert ckpt.shape[0] == 0
    with pytest.raises(ValueError, match="checkpoint interval must be >= 1"):
        functions.FUSED[name](ext, 0, *[a.clone().requires_grad_() for a in args], reset)


def test_only_some_outputs_used(ext):
    # the cores keep y[-1] as state and may drop W: unused outputs get zero gradient
    args, reset = cases.make_inputs("delta_rnn", T=6, B=2, H=2, d=5, reset_at=((2, 0),))
    def loss(fn):
        leaves = [a.clone().requires_grad_() for a in args]
        y, W, R = fn(*leaves, reset)
        (y[-1].sum() + (R ** 2).sum()).backward()
        return [x.grad for x in leaves]
    for g1, g2 in zip(loss(ref.delta_rnn), loss(kernels.get("delta_rnn", required=True))):
        torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ side effects, determinism

@pytest.mark.parametrize("name", OPS)
def test_inputs_and_states_not_modified(ext, name):
    args, reset = cases.make_inputs(name, T=6, B=2, H=2, d=16, reset_at=((3, 0),))
    args = [a.requires_grad_() for a in args]
    before = [a.detach().clone() for a in args]
    versions = [a._version for a in args]
    reset_before = reset.clone()
    out = kernels.get(name, required=True)(*args, reset)
    sum(o.square().sum() for o in out).backward()
    for a, b, ver in zip(args, before, versions):
        assert torch.equal(a.detach(), b) and a._version == ver
    assert torch.equal(reset, reset_before)


@pytest.mark.parametrize("name", OPS)
def test_bitwise_deterministic_across_runs_and_thread_counts(ext, name):
    args, reset = cases.make_inputs(name, T=9, B=8, H=2, d=32, dtype=torch.float32,
                                    reset_at=((4, 3),))
    fn = kernels.get(name, required=True)
    runs = []
    for n in (2, 2, 1):   # the (b, h) tasks split over 2 threads, then all on one
        torch.set_num_threads(n)
        runs.append(cases.forward_backward(fn, args, reset))
    for other in runs[1:]:
        for x, y in zip(runs[0][0] + runs[0][1], other[0] + other[1]):
            assert torch.equal(x, y)


def test_checkpoint_interval_setting(ext):
    args, reset = cases.make_inputs("rdn", T=10, B=2, H=2, d=5, reset_at=((6, 1),))
    results = []
    try:
        for every in (None, 1, 4, 100):
            kernels.set_checkpoint_interval(every)
            results.append(cases.forward_backward(kernels.get("rdn", required=True), args, reset))
    finally:
        kernels.set_checkpoint_interval(None)
    for other in results[1:]:
        for x, y in zip(results[0][0] + results[0][1], other[0] + other[1]):
            torch.testing.assert_close(x, y, rtol=1e-13, atol=1e-13)
    assert kernels.checkpoint_interval(51) == 16 and kernels.checkpoint_interval(1000) == 32
    # with the state size: one chunk while the T states of one (b, h) fit ONE_CHUNK_BYTES
    atari_state = 32 * 32 * 4
    assert kernels.checkpoint_interval(51, atari_state) == 51
    assert kernels.checkpoint_interval(1000, atari_state) == 32
    assert kernels.checkpoint_interval(kernels.ONE_CHUNK_BYTES // 1024, 1024) == 512
    assert kernels.checkpoint_interval(kernels.ONE_CHUNK_BYTES // 1024 + 1, 1024) == 23
    try:
        kernels.set_checkpoint_interval(5)
        assert kernels.checkpoint_interval(51, atari_state) == 5
    finally:
        kernels.set_checkpoint_interval(None)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UserError, match="checkpoint interval"):
            kernels.set_checkpoint_interval(bad)


@pytest.mark.parametrize("name", OPS)
def test_default_chunking_one_chunk_and_several(ext, name):
    # the dispatch's default interval: the whole sequence when the T states of one (b, h)
    # fit ONE_CHUNK_BYTES (one checkpoint), else max(16, sqrt(T)) (several chunks, each
    # recomputed from its checkpoint); both against the reference, with resets
    one, one_reset = cases.make_inputs(name, T=12, B=3, H=2, d=32, reset_at=((0, 1), (7, 2)),
                                       seed=5)
    assert kernels.checkpoint_interval(12, kernels._state_bytes(name, one)) == 12
    err, gerr = cases.max_errors(name, kernels.get(name, required=True), one, one_reset)
    assert err < 1e-12 and gerr < 1e-12, (err, gerr)
    # float32, head size 64 (4 rows of 16 lanes per vector block): 40 states of 16 KiB > 512 KiB
    T = 40
    several, reset = cases.make_inputs(name, T=T, B=2, H=1, d=64, reset_at=((17, 0), (33, 1)),
                                       seed=6)
    f32 = [a.float() for a in several]
    assert kernels.checkpoint_interval(T, kernels._state_bytes(name, f32)) == 16
    true_out, true_grad = cases.forward_backward(getattr(ref, name), several, reset)
    out, grad = cases.forward_backward(kernels.get(name, required=True), f32, reset)
    for x, y in zip(true_out + true_grad, out + grad):
        assert y.dtype == torch.float32
        torch.testing.assert_close(y.double(), x, rtol=1e-4, atol=1e-4 * float(x.abs().max()))


# ------------------------------------------------------------------------ dispatch, fallbacks

def test_status_and_op_dispatch(ext):
    backend, why = kernels.status()
    assert backend == "kernel" and "CPU" in why
    args, reset = cases.make_inputs("delta", T=5, B=2, H=2, d=4, reset_at=((2, 1),))
    for backend in ("auto", "kernel"):
        fn = ops.get("delta", backend)
        assert fn is kernels.get("delta", required=backend == "kernel")
        torch.testing.assert_close(fn(*args, reset), ref.delta(*args, reset))
        torch.testing.assert_close(fn(*args, reset=None), ref.delta(*args, None))
    assert ops.get("delta", "reference") is ref.delta


def test_unsupported_inputs_fall_back_or_raise(ext):
    from rfwp_rl.cores import feature_maps

    args, reset = cases.make_inputs("rdn", T=4, B=2, H=1, d=4, reset_at=((1, 0),))
    auto, required = kernels.get("rdn"), kernels.get("rdn", required=True)
    # a feature map other than softmax: only the reference implements it
    expect = ref.rdn(*args, reset, feature_map=feature_maps.elu_sum)
    torch.testing.assert_close(auto(*args, reset, feature_map=feature_maps.elu_sum), expect)
    with pytest.raises(UserError, match="softmax"):
        required(*args, reset, feature_map=feature_maps.elu_sum)
    # softmax given explicitly is the kernel's
    torch.testing.assert_close(required(*args, reset, feature_map=feature_maps.softmax),
                               ref.rdn(*args, reset))
    # a dtype without a kernel
    bf = [a.to(torch.bfloat16) for a in args]
    torch.testing.assert_close(auto(*bf, reset), ref.rdn(*bf, reset))
    with pytest.raises(UserError, match="dtype torch.bfloat16"):
        required(*bf, reset)


def test_binding_rejects_bad_shapes(ext):
    (q, k, v, W0), reset = cases.make_inputs("lt", T=3, B=2, H=1, d=4)
    with pytest.raises(RuntimeError, match="W0 has shape"):
        ext.lt_forward(q, k, v, W0[:, :, :3].contiguous(), reset, 2)
    with pytest.raises(RuntimeError, match="reset must be"):
        ext.lt_forward(q, k, v, W0, reset[:2].contiguous(), 2)


def test_build_failure_warns_once_and_uses_reference(monkeypatch, caplog):
    def failing(with_cuda):
        raise _build.BuildError("build failed (error: boom)", Path("/tmp/x/build.log"))

    monkeypatch.setattr(kernels, "_state", {"loaded": False, "ext": None, "why": "",
                                            "build_seconds": 0.0})
    monkeypatch.setattr(_build, "load_extension", failing)
    monkeypatch.setattr(_build, "torch_has_cuda", lambda: False)
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.kernels"):
        assert kernels.get("lt") is None
        assert kernels.get("delta") is None
        assert ops.get("lt", "auto") is ref.lt
    records = [r for r in caplog.records if r.name == "rfwp_rl.kernels"]
    assert len(records) == 1 and "boom" in records[0].getMessage()
    assert "\n" not in records[0].getMessage()
    backend, why = kernels.status()
    assert backend == "reference" and "boom" in why and "/tmp/x/build.log" in why
    with pytest.raises(UserError, match="boom"):
        kernels.get("lt", required=True)
    with pytest.raises(UserError, match="boom"):
        ops.get("rdn", "kernel")


def test_stale_build_marker_of_a_killed_build_is_cleared(monkeypatch, tmp_path):
    # a build killed after torch created its in-progress marker ("lock" in the build
    # directory) must not make every later build wait for it forever
    from torch.utils import cpp_extension

    if _build.shutil.which("ninja") is None:
        pytest.skip("ninja is not installed")
    monkeypatch.setenv("RFWP_RL_KERNEL_CACHE", str(tmp_path))
    name = _build.extension_name(False)
    (tmp_path / name).mkdir()
    (tmp_path / name / "lock").write_text("")
    seen = []

    def fake_load(name, sources, build_directory, **kwargs):
        seen.append(Path(build_directory, "lock").exists())
        raise RuntimeError("error: compiler stopped by the test")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    with pytest.raises(_build.BuildError, match="compiler stopped by the test"):
        _build.load_extension(False)
    assert seen == [False]


def test_missing_sources_one_line_on_stderr(tmp_path):
    # a real process: the package imports, the op works on the reference, stderr gets one line
    code = (
        "from pathlib import Path\n"
        "from rfwp_rl.kernels import _build\n"
        f"_build.CSRC = Path({str(tmp_path / 'no_csrc')!r})\n"
        "from rfwp_rl import ops\n"
        "from rfwp_rl.ops import reference\n"
        "assert ops.get('lt', 'auto') is reference.lt and ops.get('rdn') is reference.rdn\n"
        "from rfwp_rl import kernels\n"
        "print(kernels.status()[0])\n"
    )
    env = dict(os.environ, RFWP_RL_KERNEL_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "reference"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "sources are not installed" in lines[0], proc.stderr


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(kernels, "_state", {"loaded": False, "ext": None, "why": "",
                                            "build_seconds": 0.0})
    monkeypatch.setenv("RFWP_RL_KERNELS", "0")
    assert kernels.status() == ("reference", "fused kernels disabled by RFWP_RL_KERNELS=0")
    assert ops.get("delta") is ref.delta


def test_prebuild_command(ext, capsys):
    from rfwp_rl.kernels.__main__ import main

    assert main(["--build"]) == 0
    assert capsys.readouterr().out.startswith("kernel: fused C++ kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_exp_and_tanh_accuracy(ext, dtype):
    # the CPU kernels' vectorisable exp/tanh (csrc/cpu/vec_math.h) against torch's, in ulp
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(200_000, generator=g, dtype=torch.float64) * 3,
                   torch.logspace(-12, 3, 20_000, dtype=torch.float64),
                   -torch.logspace(-12, 3, 20_000, dtype=torch.float64),
                   torch.linspace(-0.25, 0.25, 10_001, dtype=torch.float64)]).to(dtype)
    fi = torch.finfo(dtype)
    for fn, ref_fn, max_ulp in (("exp", torch.exp, 2), ("tanh", torch.tanh, 8)):
        xs = x[x < 700] if fn == "exp" and dtype == torch.float64 else x
        if fn == "exp" and dtype == torch.float32:
            xs = xs[xs < 88]
        got, want = ext._vec_math(xs, fn), ref_fn(xs.double())
        ulp = torch.clamp((want.abs() * fi.eps).to(dtype), min=fi.tiny).double()
        err = ((got.double() - want).abs() / ulp).max().item()
        assert err <= max_ulp, (fn, err)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e4, -1e4],
                           dtype=dtype)
    e, t = ext._vec_math(special, "exp"), ext._vec_math(special, "tanh")
    assert e[:4].tolist() == [1.0, 1.0, float("inf"), 0.0] and e[4].isnan() and e[5] == float("inf")
    assert e[6] == 0 and t[:4].tolist() == [0.0, 0.0, 1.0, -1.0] and t[4].isnan()
    assert t[5:].tolist() == [1.0, -1.0]
