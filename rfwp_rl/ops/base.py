"""What every op folder shares: the op description (:class:`OpSpec`), the sizes a fused
kernel is asked to run (:class:`Dims`), the plumbing of the autograd Functions, and the
limits every fused kernel has (dtypes, devices, CUDA shared memory and threads).

An op folder (``rfwp_rl/ops/<name>/``) holds ``naive.py`` (the plain PyTorch reference),
``fused.py`` (its ``torch.autograd.Function`` over the C++/CUDA kernels and its
``supported``) and an ``__init__`` that defines ``OP = OpSpec(...)``; :mod:`rfwp_rl.ops`
lists the folders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rfwp_rl.kernels import cuda_limits
from rfwp_rl.kernels.cuda_limits import DeviceLimits

# what the fused kernels compute in: the extension converts float16/bfloat16 inputs to float32
KERNEL_DTYPES = (torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Dims:
    """The sizes a fused kernel depends on: key size ``dk`` (columns of a fast weight
    matrix), value size ``dv`` (rows), and the name of the feature map applied inside the op
    (only for ops that apply one themselves, i.e. ``rdn``; None for the others)."""

    dk: int
    dv: int
    feature_map: str | None = None

    def __str__(self) -> str:
        return f"key size {self.dk}, value size {self.dv}"


@dataclass(frozen=True)
class OpSpec:
    """One fast-weight op: its reference, its fused kernel and how to call and test both.

    Attributes:
        name: the op name (``rfwp_rl.ops.get(name, backend)``).
        naive: the plain PyTorch reference, ``naive(*args, reset, **options)``.
        fused: ``fused(backend, chunk, *args, reset)``: the fused kernel of a kernel backend
            (the built extension, or the emulated CUDA kernels) with checkpoints every
            ``chunk`` steps; float32/float64 inputs only.
        supported: ``supported(dims, dtype, device, limits=None) -> str | None``: None when
            the fused kernel runs these sizes, else a short reason naming the size.
        dims_of: ``dims_of(args, options) -> Dims`` of one call.
        state_elems: elements of the fast-weight state of one (batch, head) (all matrices),
            sizing the CPU checkpoints.
        example_inputs: ``example_inputs(rand, T, B, H, d, dk) -> [tensors]``: random inputs
            as the cores hand them (signature order, no reset), drawn with the methods of
            ``rand`` (:class:`rfwp_rl.ops.cases.Rand`): ``normal(*shape, scale=1)``,
            ``fm(*shape)`` (positive, sums to one, like feature-mapped keys), ``sig(*shape)``
            (in (0, 1), like β) and ``state(*shape)`` (a non-zero initial state).
        state_args: positions (signature order, no reset) of the initial states.
        time_args: positions of the ``[T, ...]`` inputs.
        final_state: the final states (in the order of ``state_args``) from the outputs.
        key_size_free: the key size may differ from the value size (e.g. DPFP keys).
        cpu_checkpoints: the CPU backward needs checkpoints (``lt``'s rebuilds the states from
            the initial one, so it is given the whole sequence as one chunk).
    """

    name: str
    naive: Callable[..., tuple]
    fused: Callable[..., tuple]
    supported: Callable[..., str | None]
    dims_of: Callable[[Sequence[Any], dict], Dims]
    state_elems: Callable[[Dims], int]
    example_inputs: Callable[..., list[Tensor]]
    state_args: tuple[int, ...]
    time_args: tuple[int, ...]
    final_state: Callable[[tuple], tuple[Tensor, ...]]
    key_size_free: bool = True
    cpu_checkpoints: bool = True


# ---------------------------------------------------------------- the fused kernels' limits


def kernel_supported(
    name: str, dims: Dims, dtype: torch.dtype, device: torch.device | str, limits: DeviceLimits | None = None
) -> str | None:
    """The limits every fused kernel shares; each op's ``supported`` adds its own.

    None when the fused kernel of op ``name`` runs ``dims`` in ``dtype`` on ``device``, else
    a short reason naming the size. On CUDA the launch's shared memory (dynamic + static)
    must fit the device's opt-in limit and its threads the register budget, forward and
    backward; ``limits`` are the device's (queried when None, so that tests pass presets).
    """
    device = torch.device(device)
    if dtype not in KERNEL_DTYPES + HALF_DTYPES:
        return f"dtype {dtype} (fused kernels: float32, float64; float16/bfloat16 computed in float32)"
    if dims.dk < 1 or dims.dv < 1:
        return f"{dims} (fused kernels: sizes >= 1)"
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"device {device.type!r} (fused kernels: cpu, cuda)"
    if name not in cuda_limits.OPS:
        return f"{name} has no CUDA kernel (fused on cpu only)"
    limits = limits if limits is not None else cuda_limits.limits_of(device)
    elem = torch.empty((), dtype=dtype).element_size()  # 2: half types, computed in float32
    for direction in cuda_limits.DIRECTIONS:
        why = cuda_limits.check(name, direction, dims.dk, dims.dv, elem, limits)
        if why is not None:
            return why
    return None


# ------------------------------------------------------- plumbing of the autograd Functions


def contiguous(x: Tensor | None) -> Tensor | None:
    """``x`` as a contiguous tensor (the kernels index dense row-major memory)."""
    return None if x is None else x.contiguous()


def reset_mask(reset: Tensor | None) -> Tensor | None:
    """The ``[T, B]`` reset flags as the bool tensor the kernels read (None: no resets)."""
    if reset is None:
        return None
    return reset.to(torch.bool).contiguous()


def needs_grad(chunk: int, *tensors: Tensor) -> bool:
    """Whether autograd will want gradients: if not (inference, actors), the forward runs
    without checkpoints (chunk 0) and without an autograd node."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return False
    if chunk < 1:
        raise ValueError(f"checkpoint interval must be >= 1 when gradients are needed, got {chunk}")
    return True
