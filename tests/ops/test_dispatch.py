"""Choosing between the fused kernels and the reference: once per sublayer (not per
forward), the sizes a GPU cannot run fall back with one warning (decided from the device
limits, tested with presets), the first use of a CUDA kernel is compared with the reference,
the checkpoint interval, copies and pickles of resolved ops."""

from __future__ import annotations

import copy
import logging
import pickle

import pytest
import torch

from rfwp_rl import cores, kernels, ops
from rfwp_rl.errors import UserError
from rfwp_rl.kernels import cuda_limits
from rfwp_rl.ops import cases, dispatch

OPS = tuple(ops.OPS)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    # warnings are once per process: each test starts with none given
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_verified", {})


def _op_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rfwp_rl.ops"]


def test_reference_backend_is_the_naive_function():
    for name in OPS:
        assert ops.get(name, "reference") is ops.naive(name)
        assert ops.resolve(name, "reference", ops.Dims(4, 4)) is ops.naive(name)
    with pytest.raises(UserError, match=r"unknown op 'dleta'; did you mean 'delta'"):
        ops.get("dleta")
    with pytest.raises(UserError, match=r"unknown backend 'cuda'"):
        ops.get("delta", "cuda")


def test_auto_and_kernel_run_the_fused_kernel(ext, monkeypatch):
    args, reset = cases.make_inputs("delta", T=5, B=2, H=2, d=4, reset_at=((2, 1),))
    calls = []
    forward = ext.delta_forward
    monkeypatch.setattr(ext, "delta_forward", lambda *a: calls.append(1) or forward(*a))
    for backend in ("auto", "kernel"):
        fn = ops.get("delta", backend)
        torch.testing.assert_close(fn(*args, reset), ops.naive("delta")(*args, reset))
        torch.testing.assert_close(fn(*args, reset=None), ops.naive("delta")(*args, None))
    assert len(calls) == 4


def test_unsupported_device_falls_back_or_raises(ext, caplog):
    # a device without a fused kernel: 'auto' computes with the reference (one warning naming
    # the size), 'kernel' refuses in one line
    args, _ = cases.make_inputs("lt", T=3, B=2, H=1, d=4, device="meta")
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        for _ in range(3):
            y, W = ops.get("lt", "auto")(*args, None)  # (meta: shapes only, no reset flags)
    assert y.device.type == "meta" and y.shape == (3, 2, 1, 4)
    assert _op_warnings(caplog) == [
        "rfwp_rl: op 'lt' at key size 4, value size 4 (float64, meta) "
        "runs on the PyTorch reference: device 'meta' (fused kernels: "
        "cpu, cuda)"
    ]
    with pytest.raises(
        UserError,
        match=r"^backend 'kernel' cannot run op 'lt' at key size 4, value "
        r"size 4 \(float64, meta\): device 'meta'",
    ) as info:
        ops.get("lt", "kernel")(*args, None)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- CUDA limits, without a GPU

GPUS = (cuda_limits.A100, cuda_limits.H100)
HEAD_SIZES = (16, 32, 64, 96, 128, 160, 192, 256, 384, 512)


def _launch_model(name: str, dk: int, dv: int, dtype: torch.dtype, limits) -> str | None:
    """What the CUDA launch model says of the forward, then the backward kernel."""
    elem = torch.empty((), dtype=dtype).element_size()
    return next(
        (
            why
            for direction in ("forward", "backward")
            if (why := cuda_limits.check(name, direction, dk, dv, elem, limits)) is not None
        ),
        None,
    )


def _first_unsupported(name: str, dtype: torch.dtype, limits) -> int | None:
    return next((d for d in HEAD_SIZES if _launch_model(name, d, d, dtype, limits) is not None), None)


UNLIMITED = ("srwm", "mamba")
"""Ops whose CUDA kernels run every head size (srwm keeps its matrix, mamba its state in global
memory when it does not fit in shared memory)."""


@pytest.mark.parametrize("limits", GPUS, ids=lambda g: g.name.split(",")[0])
@pytest.mark.parametrize("name", [n for n in OPS if n in cuda_limits.OPS])
def test_cuda_support_is_the_launch_model_of_both_directions(name, limits):
    # supported() on CUDA = the forward and the backward launch both fit the device (shared
    # memory, threads, registers), decided from the device limits alone (no GPU needed)
    spec = ops.spec(name)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for d in HEAD_SIZES:
            assert spec.supported(ops.Dims(d, d), dtype, "cuda", limits) == _launch_model(name, d, d, dtype, limits), (
                dtype,
                d,
            )
        # the sizes the agents use fit every GPU; some size beyond does not, naming it
        for d in (16, 32, 64):
            assert spec.supported(ops.Dims(d, d), dtype, "cuda", limits) is None
        big = _first_unsupported(name, dtype, limits)
        if name in UNLIMITED:
            assert big is None
            continue
        why = spec.supported(ops.Dims(big, big), dtype, "cuda", limits)
        assert f"d={big}" in why and limits.name in why


def test_key_size_and_half_precision_count():
    # DPFP-ν makes the key size 2νd: the key size, not the head size, goes into the model;
    # float16/bfloat16 run in float32 and need what float32 needs
    spec = ops.spec("delta_rnn")
    for limits in GPUS:
        for dk, dv in ((128, 64), (256, 64), (512, 32)):
            why = spec.supported(ops.Dims(dk, dv), torch.float32, "cuda", limits)
            assert why == _launch_model("delta_rnn", dk, dv, torch.float32, limits)
            assert why is None or f"dk={dk}, dv={dv}" in why
            for half in (torch.float16, torch.bfloat16):
                assert (spec.supported(ops.Dims(dk, dv), half, "cuda", limits) is None) == (why is None)


class _CudaExt:
    """The CPU extension, claiming CUDA kernels (the decision is tested, not a launch)."""

    def __init__(self, ext) -> None:
        self.ext = ext

    def has_cuda(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self.ext, name)


def test_auto_falls_back_with_one_warning_naming_the_size(ext, monkeypatch, caplog):
    # the decision of one sublayer-resolved op for a CUDA device with H100 limits: rdn at the
    # first head size it cannot launch there takes the reference after one warning with
    # 'auto'; at d = 32 it takes the kernel; 'kernel' refuses in one line naming the size
    monkeypatch.setattr(kernels, "_state", {"loaded": True, "ext": _CudaExt(ext), "why": "test", "build_seconds": 0.0})
    monkeypatch.setattr(cuda_limits, "limits_of", lambda device: cuda_limits.H100)
    monkeypatch.setattr(dispatch, "VERIFY_DEVICE_TYPES", frozenset())
    cuda = torch.device("cuda", 0)
    d = _first_unsupported("rdn", torch.float32, cuda_limits.H100)
    why = _launch_model("rdn", d, d, torch.float32, cuda_limits.H100)
    big = ops.resolve("rdn", "auto", ops.Dims(d, d, "softmax"))
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        for _ in range(2):
            plan = big._plan((cuda, torch.float32))
        again = ops.resolve("rdn", "auto", ops.Dims(d, d, "softmax"))._plan((cuda, torch.float32))
    assert not isinstance(plan, dispatch.FusedCall) and not isinstance(again, dispatch.FusedCall)
    assert _op_warnings(caplog) == [
        f"rfwp_rl: op 'rdn' at key size {d}, value size {d} (float32, cuda:0) runs on the PyTorch reference: {why}"
    ]
    assert f"rdn forward at d={d} float32 needs" in why or f"rdn backward at d={d}" in why
    small = ops.resolve("rdn", "auto", ops.Dims(32, 32, "softmax"))
    assert isinstance(small._plan((cuda, torch.float32)), dispatch.FusedCall)
    with pytest.raises(UserError) as info:
        ops.resolve("rdn", "kernel", ops.Dims(d, d, "softmax"))._plan((cuda, torch.float32))
    assert str(info.value) == (
        f"backend 'kernel' cannot run op 'rdn' at key size {d}, value size "
        f"{d} (float32, cuda:0): {why}; use backend 'auto' or 'reference'"
    )


# ----------------------------------------------------------------------- first CUDA use


class _WrongDelta:
    """A kernel backend whose delta forward is off by 1% (a miscompiled kernel, say)."""

    def __init__(self, ext) -> None:
        self.ext = ext

    def has_cuda(self) -> bool:
        return False

    def delta_forward(self, *args):
        y, W, ckpt = self.ext.delta_forward(*args)
        return y * 1.01, W, ckpt

    def __getattr__(self, name):
        return getattr(self.ext, name)


def test_first_use_disagreement_falls_back_with_one_warning(ext, monkeypatch, caplog):
    # the first use of a kernel on a device type in VERIFY_DEVICE_TYPES ("cuda"; here also
    # "cpu") compares it with the reference once; a disagreeing kernel is never used
    monkeypatch.setattr(
        kernels, "_state", {"loaded": True, "ext": _WrongDelta(ext), "why": "test", "build_seconds": 0.0}
    )
    monkeypatch.setattr(dispatch, "VERIFY_DEVICE_TYPES", frozenset({"cpu", "cuda"}))
    args, reset = cases.make_inputs("delta", T=6, B=2, H=2, d=8, reset_at=((3, 1),))
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        for fn in (ops.get("delta"), ops.get("delta"), ops.resolve("delta", dims=ops.Dims(8, 8))):
            torch.testing.assert_close(fn(*args, reset), ops.naive("delta")(*args, reset))
    warnings = _op_warnings(caplog)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(
        "rfwp_rl: op 'delta' at key size 8, value size 8 (float64, cpu) "
        "runs on the PyTorch reference: its first run disagrees with the "
        "reference (relative error"
    )
    with pytest.raises(UserError, match="its first run disagrees"):
        ops.get("delta", "kernel")(*args, reset)
    # a kernel that agrees passes the check (once) and runs
    monkeypatch.setattr(kernels, "_state", {"loaded": True, "ext": ext, "why": "test", "build_seconds": 0.0})
    fn = ops.get("lt")
    with torch.no_grad():  # the check itself needs gradients: it turns them on
        out = fn(*cases.make_inputs("lt", T=4, B=2, H=1, d=8)[0], None)
    assert [k[0] for k, why in dispatch._verified.items() if why is None] == ["lt"]
    assert isinstance(fn._plans[(torch.device("cpu"), torch.float64, ops.Dims(8, 8))], dispatch.FusedCall)
    assert out[0].shape == (4, 2, 1, 8)


def test_first_use_launch_failure_falls_back(ext, monkeypatch, caplog):
    class Failing(_WrongDelta):
        def delta_forward(self, *args):
            raise RuntimeError("CUDA error: invalid configuration argument\nmore")

    monkeypatch.setattr(kernels, "_state", {"loaded": True, "ext": Failing(ext), "why": "test", "build_seconds": 0.0})
    monkeypatch.setattr(dispatch, "VERIFY_DEVICE_TYPES", frozenset({"cpu"}))
    args, reset = cases.make_inputs("delta", T=4, B=2, H=1, d=4)
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        torch.testing.assert_close(ops.get("delta")(*args, reset), ops.naive("delta")(*args, reset))
    assert _op_warnings(caplog)[0].endswith(
        "its first run failed (RuntimeError: CUDA error: invalid configuration argument)"
    )


# ------------------------------------------------------------------- resolved once per sublayer


def test_sublayer_resolves_its_op_once(ext, monkeypatch):
    # the choice is made when the core is built (and once per device/dtype at the first
    # call), not on every forward: no name checks, signature binding or limits per call
    plans, supported = [], []
    real_plan = dispatch.ResolvedOp._plan
    monkeypatch.setattr(dispatch.ResolvedOp, "_plan", lambda self, key: plans.append(key) or real_plan(self, key))
    core = cores.make("rdn", 5, hidden_size=16, num_heads=2, num_layers=2, ff_size=8).double()
    for layer in core.fast_layers:
        assert isinstance(layer.op, dispatch.ResolvedOp) and layer.op.dims == ops.Dims(8, 8, "softmax")
    spec = ops.spec("rdn")
    real_supported = spec.supported
    object.__setattr__(spec, "supported", lambda *a, **k: supported.append(a) or real_supported(*a, **k))
    monkeypatch.setattr(dispatch, "check_choice", lambda *a: pytest.fail("a name check per call"))
    try:
        x = torch.randn(4, 3, 5, dtype=torch.float64)
        state = core.initial_state(3)
        for _ in range(3):
            y, state = core(x, state, None)
    finally:
        object.__setattr__(spec, "supported", real_supported)
    assert len(plans) == 2 and len(supported) == 2  # one per sublayer, at the first forward


def test_resolved_ops_copy_and_pickle(ext):
    core = cores.make("delta", 5, hidden_size=8, num_heads=2, num_layers=1, ff_size=8)
    twin = copy.deepcopy(core)
    assert twin.fast_layers[0].op is core.fast_layers[0].op  # copies share the choice
    again = pickle.loads(pickle.dumps(core))
    x = torch.randn(3, 2, 5)
    torch.testing.assert_close(again(x, again.initial_state(2), None)[0], core(x, core.initial_state(2), None)[0])


def test_feature_map_rule_decided_at_construction(ext, caplog):
    with caplog.at_level(logging.WARNING, logger="rfwp_rl.ops"):
        core = cores.make("rdn", 5, hidden_size=16, num_heads=2, num_layers=2, ff_size=8, feature_map="elu_sum")
    assert not isinstance(core.fast_layers[0].op, dispatch.ResolvedOp)
    assert _op_warnings(caplog) == [
        "rfwp_rl: op 'rdn' at key size 8, value size 8 runs on the "
        "PyTorch reference: rdn with feature map 'elu_sum' (the fused "
        "kernel implements softmax only)"
    ]


# ------------------------------------------------------------------------ checkpoint interval


def test_checkpoint_interval_setting(ext):
    args, reset = cases.make_inputs("rdn", T=10, B=2, H=2, d=5, reset_at=((6, 1),))
    results = []
    try:
        for every in (None, 1, 4, 100):
            kernels.set_checkpoint_interval(every)
            results.append(cases.forward_backward(ops.get("rdn", "kernel"), args, reset))
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
