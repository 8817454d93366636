"""The CUDA kernels of ``csrc/cuda`` run on the CPU through the emulation header
(``csrc/cuda_emu/cuda_emulation.h``): a kernel backend with the same functions as the torch
extension, for checking the CUDA sources on machines without a GPU.

Every thread of a block is a fiber on the calling thread, resumed in turn between barriers,
and blocks run one after another, so keep the sizes small (a handful of blocks of at most a
few hundred threads). ``threads`` sets the
block size request (default 32, which does not divide head sizes such as 5 or 33; 0: the
launchers' default); the launchers round it to whole warps and clamp it as on a GPU.

The launchers' view of the device can be changed (``set_device_smem_optin``) and every launch
is logged (``launches``), so tests can compare what a launcher asks for with
:mod:`rfwp_rl.kernels.cuda_limits`.

    be = EmulatedCuda(threads=32)
    y, W = rfwp_rl.ops.spec("delta").fused(be, chunk, q, k, v, beta, W0, reset)
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from rfwp_rl.kernels import _build

# Pointer fields of each argument block, in the order of csrc/fastweight_params.h.
FIELDS = {
    "DeltaFwdArgs": ("q", "k", "v", "beta", "W0", "reset", "y", "W", "ckpt"),
    "DeltaBwdArgs": ("q", "k", "v", "beta", "reset", "ckpt", "gy", "gW", "gq", "gk", "gv", "gbeta", "gW0"),
    "DeltaRnnFwdArgs": (
        "q",
        "k",
        "v",
        "beta",
        "kr",
        "vr",
        "beta_r",
        "W0",
        "R0",
        "y0",
        "reset",
        "y",
        "W",
        "R",
        "ckptW",
        "ckptR",
        "s",
    ),
    "DeltaRnnBwdArgs": (
        "q",
        "k",
        "v",
        "beta",
        "kr",
        "vr",
        "beta_r",
        "s",
        "reset",
        "ckptW",
        "ckptR",
        "gy",
        "gW",
        "gR",
        "gq",
        "gk",
        "gv",
        "gbeta",
        "gkr",
        "gvr",
        "gbeta_r",
        "gW0",
        "gR0",
        "gy0",
    ),
    "RdnFwdArgs": (
        "xq",
        "xk",
        "xv",
        "xb",
        "Rq",
        "Rk",
        "Rv",
        "rb",
        "W0",
        "y0",
        "reset",
        "y",
        "W",
        "ckpt",
        "q",
        "k",
        "v",
        "beta",
        "h",
    ),
    "RdnBwdArgs": (
        "Rq",
        "Rk",
        "Rv",
        "rb",
        "h",
        "q",
        "k",
        "v",
        "beta",
        "reset",
        "ckpt",
        "gy",
        "gW",
        "gxq",
        "gxk",
        "gxv",
        "gxb",
        "gRq_part",
        "gRk_part",
        "gRv_part",
        "grb_part",
        "gRq",
        "gRk",
        "gRv",
        "grb",
        "gW0",
        "gy0",
    ),
    "ProductFwdArgs": ("q", "k", "v", "alpha", "beta", "W0", "reset", "y", "W", "ckpt"),
    "ProductBwdArgs": (
        "q",
        "k",
        "v",
        "alpha",
        "beta",
        "reset",
        "ckpt",
        "gy",
        "gW",
        "gq",
        "gk",
        "gv",
        "galpha",
        "gbeta",
        "gW0",
    ),
    "SrwmFwdArgs": ("x", "Winit", "dW0", "reset", "y", "dW", "ckpt"),
    "SrwmBwdArgs": ("x", "Winit", "reset", "ckpt", "gy", "gdW", "gx", "gWinit_part", "gWinit", "gdW0"),
    "MambaFwdArgs": ("u", "delta", "A", "Bm", "C", "h0", "reset", "y", "hT", "ckpt"),
    "MambaBwdArgs": (
        "u",
        "delta",
        "A",
        "Bm",
        "C",
        "reset",
        "ckpt",
        "gy",
        "ghT",
        "gu",
        "gdelta",
        "gA_part",
        "gA",
        "gB",
        "gC",
        "gh0",
    ),
}


class EmulationError(RuntimeError):
    pass


def _nck(T: int, chunk: int) -> int:
    return (T + chunk - 1) // chunk if chunk > 0 else 0  # chunk 0: no checkpoints (inference)


class EmulatedCuda:
    """Kernel backend running csrc/cuda/*.cu on the host (CPU tensors in, CPU tensors out)."""

    def __init__(self, threads: int = 32, library: Path | None = None) -> None:
        self.threads = threads
        self.lib = ctypes.CDLL(str(library or _build.emulated_cuda_library()))
        self.lib.rfwp_emu_workspace_elems.restype = ctypes.c_size_t
        self.lib.rfwp_emu_smem_request.restype = ctypes.c_longlong
        self.lib.rfwp_emu_smem_request.argtypes = [
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_longlong,
        ]
        self.lib.rfwp_emu_device_smem_optin.restype = ctypes.c_longlong
        self.lib.rfwp_emu_set_device_smem_optin.argtypes = [ctypes.c_longlong]
        self.lib.rfwp_emu_set_schedule.argtypes = [ctypes.c_uint]
        for block, fields in FIELDS.items():
            n = self.lib.rfwp_emu_num_pointers(block.encode())
            if n != len(fields):
                raise EmulationError(f"{block}: the library has {n} pointer fields, this wrapper lists {len(fields)}")

    def has_cuda(self) -> bool:
        return False

    # ------------------------------------------------------------ launcher introspection

    def launch_threads(self, dk: int, dv: int, threads: int | None = None) -> int:
        """Block size the launchers use for a request (default: this backend's)."""
        return self.lib.rfwp_emu_launch_threads(dk, dv, self.threads if threads is None else threads)

    def srwm_threads(self, d: int, threads: int | None = None) -> int:
        """Block size the srwm launchers use (their matrix is (3d + 4) x d)."""
        return self.lib.rfwp_emu_srwm_threads(d, self.threads if threads is None else threads)

    def smem_request(
        self, op: str, direction: str, dk: int, dv: int, dtype_bytes: int, optin: int | None = None
    ) -> int:
        """Dynamic shared memory the launcher of ``op`` requests (``optin``: the device's
        opt-in limit; None: the emulated device's current one)."""
        if optin is None:
            optin = self.device_smem_optin()
        dims = (ctypes.c_int * 6)(1, 1, 1, dk, dv, 1)
        n = self.lib.rfwp_emu_smem_request(op.encode(), int(direction == "backward"), dims, dtype_bytes, optin)
        if n < 0:
            raise ValueError(f"unknown op {op!r}")
        return int(n)

    def device_smem_optin(self) -> int:
        return int(self.lib.rfwp_emu_device_smem_optin())

    def set_device_smem_optin(self, nbytes: int | None) -> None:
        """What the emulated device reports as its opt-in shared memory per block (None: the
        true limit, 227 KiB). Lower: the launchers pick smaller layouts or refuse; higher:
        the attribute call fails as on a GPU whose driver refuses the size."""
        self.lib.rfwp_emu_set_device_smem_optin(0 if nbytes is None else int(nbytes))

    def set_schedule(self, seed: int) -> None:
        """The order in which a block's threads run between barriers: 0 (the default) thread order, else an
        order drawn afresh each round from ``seed``. A race-free kernel gives the same result under every seed."""
        self.lib.rfwp_emu_set_schedule(int(seed))

    def pending_error(self) -> int:
        """The CUDA error left pending on this thread (0: none)."""
        return int(self.lib.rfwp_emu_peek_last_error())

    def launches(self, clear: bool = True) -> list[tuple[int, int, int]]:
        """(grid blocks, block threads, dynamic shared memory bytes) of every launch since
        the last clear."""
        out = (ctypes.c_longlong * 3)()
        log = []
        for i in range(self.lib.rfwp_emu_launch_count()):
            self.lib.rfwp_emu_launch_record(i, out)
            log.append((int(out[0]), int(out[1]), int(out[2])))
        if clear:
            self.lib.rfwp_emu_launch_clear()
        return log

    # ---------------------------------------------------------------------- plumbing

    def _call(
        self, op: str, dtype: torch.dtype, block: str, tensors: dict, dims: tuple, workspace: Tensor | None = None
    ) -> None:
        ptrs = (ctypes.c_void_p * len(FIELDS[block]))()
        for i, name in enumerate(FIELDS[block]):
            t = tensors.get(name)
            if t is not None:
                assert t.is_contiguous() and t.device.type == "cpu", name
                ptrs[i] = t.data_ptr()
        cdims = (ctypes.c_int * len(dims))(*dims)
        suffix = {torch.float32: "f32", torch.float64: "f64"}.get(dtype)
        if suffix is None:
            raise EmulationError(f"the emulated kernels take float32/float64, got {dtype}")
        fn = getattr(self.lib, f"rfwp_emu_{op}_{suffix}")
        if workspace is None:
            err = fn(ptrs, cdims, self.threads)
        else:
            err = fn(ptrs, cdims, ctypes.c_void_p(workspace.data_ptr()), self.threads)
        if err != 0:
            raise EmulationError(f"emulated CUDA kernel {op} failed with CUDA error {err}")

    def _workspace(self, op: str, dims: tuple, like: Tensor) -> Tensor:
        n = self.lib.rfwp_emu_workspace_elems(op.encode(), (ctypes.c_int * len(dims))(*dims))
        return torch.full((max(int(n), 1),), float("nan"), dtype=like.dtype)

    @staticmethod
    def _reset(reset: Tensor | None) -> Tensor | None:
        return None if reset is None else reset.to(torch.uint8).contiguous()

    # ----------------------------------------------------------------------- lt / delta

    def _delta_forward(self, op: str, q, k, v, beta, W0, reset, chunk):
        T, B, H, dk = q.shape
        dv = v.shape[-1]
        dims = (T, B, H, dk, dv, chunk)
        # the CUDA lt/delta kernels keep the initial state and delta's (u, v - v̄) vectors
        # instead of checkpoints (csrc/fastweight_params.h)
        saved = B * H * dv * dk + (T * B * H * 2 * dv if op == "delta_forward" else 0) if chunk > 0 else 0
        out = {"y": q.new_empty(T, B, H, dv), "W": q.new_empty(B, H, dv, dk), "ckpt": q.new_empty(saved)}
        self._call(
            op, q.dtype, "DeltaFwdArgs", dict(q=q, k=k, v=v, beta=beta, W0=W0, reset=self._reset(reset), **out), dims
        )
        return [out["y"], out["W"], out["ckpt"]]

    def _delta_backward(self, op: str, q, k, v, beta, reset, ckpt, gy, gW, chunk):
        T, B, H, dk = q.shape
        dv = v.shape[-1]
        dims = (T, B, H, dk, dv, chunk)
        out = {
            "gq": torch.empty_like(q),
            "gk": torch.empty_like(k),
            "gv": torch.empty_like(v),
            "gbeta": torch.empty_like(beta) if beta is not None else None,
            "gW0": q.new_empty(B, H, dv, dk),
        }
        self._call(
            op,
            q.dtype,
            "DeltaBwdArgs",
            dict(q=q, k=k, v=v, beta=beta, reset=self._reset(reset), ckpt=ckpt, gy=gy, gW=gW, **out),
            dims,
            self._workspace("delta", dims, q),
        )
        grads = [out["gq"], out["gk"], out["gv"]]
        if beta is not None:
            grads.append(out["gbeta"])
        return grads + [out["gW0"]]

    def lt_forward(self, q, k, v, W0, reset, chunk, threads=0):
        return self._delta_forward("lt_forward", q, k, v, None, W0, reset, chunk)

    def delta_forward(self, q, k, v, beta, W0, reset, chunk, threads=0):
        return self._delta_forward("delta_forward", q, k, v, beta, W0, reset, chunk)

    def lt_backward(self, q, k, v, reset, ckpt, gy, gW, chunk, threads=0):
        return self._delta_backward("lt_backward", q, k, v, None, reset, ckpt, gy, gW, chunk)

    def delta_backward(self, q, k, v, beta, reset, ckpt, gy, gW, chunk, threads=0):
        return self._delta_backward("delta_backward", q, k, v, beta, reset, ckpt, gy, gW, chunk)

    # ------------------------------------------------------------------------ delta_rnn

    def delta_rnn_forward(self, q, k, v, beta, kr, vr, beta_r, W0, R0, y0, reset, chunk, threads=0):
        T, B, H, dk = q.shape
        dv = v.shape[-1]
        dims = (T, B, H, dk, dv, chunk)
        n = _nck(T, chunk)
        out = {
            "y": q.new_empty(T, B, H, dv),
            "W": torch.empty_like(W0),
            "R": torch.empty_like(R0),
            "ckptW": q.new_empty(n, B, H, dv, dk),
            "ckptR": q.new_empty(n, B, H, dv, dv),
            "s": q.new_empty(T, B, H, dv),
        }
        self._call(
            "delta_rnn_forward",
            q.dtype,
            "DeltaRnnFwdArgs",
            dict(
                q=q,
                k=k,
                v=v,
                beta=beta,
                kr=kr,
                vr=vr,
                beta_r=beta_r,
                W0=W0,
                R0=R0,
                y0=y0,
                reset=self._reset(reset),
                **out,
            ),
            dims,
        )
        return [out[x] for x in ("y", "W", "R", "ckptW", "ckptR", "s")]

    def delta_rnn_backward(self, q, k, v, beta, kr, vr, beta_r, s, reset, ckptW, ckptR, gy, gW, gR, chunk, threads=0):
        T, B, H, dk = q.shape
        dv = v.shape[-1]
        dims = (T, B, H, dk, dv, chunk)
        names = ("gq", "gk", "gv", "gbeta", "gkr", "gvr", "gbeta_r", "gW0", "gR0", "gy0")
        likes = (
            q,
            k,
            v,
            beta,
            kr,
            vr,
            beta_r,
            q.new_empty(B, H, dv, dk),
            q.new_empty(B, H, dv, dv),
            q.new_empty(B, H, dv),
        )
        out = {name: torch.empty_like(like) for name, like in zip(names, likes)}
        self._call(
            "delta_rnn_backward",
            q.dtype,
            "DeltaRnnBwdArgs",
            dict(
                q=q,
                k=k,
                v=v,
                beta=beta,
                kr=kr,
                vr=vr,
                beta_r=beta_r,
                s=s,
                reset=self._reset(reset),
                ckptW=ckptW,
                ckptR=ckptR,
                gy=gy,
                gW=gW,
                gR=gR,
                **out,
            ),
            dims,
            self._workspace("delta_rnn", dims, q),
        )
        return [out[x] for x in names]

    # ------------------------------------------------------------------------------ rdn

    def rdn_forward(self, xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, y0, reset, chunk, threads=0):
        T, B, H, d = xq.shape
        dims = (T, B, H, d, d, chunk)
        out = {
            "y": torch.empty_like(xq),
            "W": torch.empty_like(W0),
            "ckpt": xq.new_empty(_nck(T, chunk), B, H, d, d),
            "q": torch.empty_like(xq),
            "k": torch.empty_like(xq),
            "v": torch.empty_like(xq),
            "beta": torch.empty_like(xb),
            "h": torch.empty_like(xq),
        }
        self._call(
            "rdn_forward",
            xq.dtype,
            "RdnFwdArgs",
            dict(xq=xq, xk=xk, xv=xv, xb=xb, Rq=Rq, Rk=Rk, Rv=Rv, rb=rb, W0=W0, y0=y0, reset=self._reset(reset), **out),
            dims,
        )
        return [out[x] for x in ("y", "W", "ckpt", "q", "k", "v", "beta", "h")]

    def rdn_backward(self, Rq, Rk, Rv, rb, h, q, k, v, beta, reset, ckpt, gy, gW, chunk, threads=0):
        T, B, H, d = q.shape
        dims = (T, B, H, d, d, chunk)
        out = {
            "gxq": torch.empty_like(q),
            "gxk": torch.empty_like(q),
            "gxv": torch.empty_like(q),
            "gxb": torch.empty_like(beta),
            "gRq": torch.empty_like(Rq),
            "gRk": torch.empty_like(Rk),
            "gRv": torch.empty_like(Rv),
            "grb": torch.empty_like(rb),
            "gW0": q.new_empty(B, H, d, d),
            "gy0": q.new_empty(B, H, d),
        }
        part = {name: q.new_empty(B, H, d, d) for name in ("gRq_part", "gRk_part", "gRv_part")}
        part["grb_part"] = q.new_empty(B, H, d)
        self._call(
            "rdn_backward",
            q.dtype,
            "RdnBwdArgs",
            dict(
                Rq=Rq,
                Rk=Rk,
                Rv=Rv,
                rb=rb,
                h=h,
                q=q,
                k=k,
                v=v,
                beta=beta,
                reset=self._reset(reset),
                ckpt=ckpt,
                gy=gy,
                gW=gW,
                **out,
                **part,
            ),
            dims,
            self._workspace("rdn", dims, q),
        )
        return [out[x] for x in ("gxq", "gxk", "gxv", "gxb", "gRq", "gRk", "gRv", "grb", "gW0", "gy0")]

    # ------------------------------------------------------- gated_delta / delta_product

    def _product_forward(self, q, k, v, alpha, beta, W0, reset, chunk):
        T, B, H, dk = q.shape
        dv = v.shape[-1]
        dims = (T, B, H, dk, dv, chunk, 1 if k.dim() == 4 else k.shape[3])
        out = {
            "y": q.new_empty(T, B, H, dv),
            "W": q.new_empty(B, H, dv, dk),
            "ckpt": q.new_empty(_nck(T, chunk), B, H, dv, dk),
        }
        self._call(
            "product_forward",
            q.dtype,
            "ProductFwdArgs",
            dict(q=q, k=k, v=v, alpha=alpha, beta=beta, W0=W0, reset=self._reset(reset), **out),
            dims,
        )
        return [out["y"], out["W"], out["ckpt"]]

    def _product_backward(self, q, k, v, alpha, beta, reset, ckpt, gy, gW, chunk):
        T, B, H, dk = q.shape
        dv = v.shape[-1]
        dims = (T, B, H, dk, dv, chunk, 1 if k.dim() == 4 else k.shape[3])
        out = {
            "gq": torch.empty_like(q),
            "gk": torch.empty_like(k),
            "gv": torch.empty_like(v),
            "galpha": torch.empty_like(alpha) if alpha is not None else None,
            "gbeta": torch.empty_like(beta),
            "gW0": q.new_empty(B, H, dv, dk),
        }
        self._call(
            "product_backward",
            q.dtype,
            "ProductBwdArgs",
            dict(q=q, k=k, v=v, alpha=alpha, beta=beta, reset=self._reset(reset), ckpt=ckpt, gy=gy, gW=gW, **out),
            dims,
            self._workspace("product", dims, q),
        )
        names = ("gq", "gk", "gv") + (("galpha",) if alpha is not None else ()) + ("gbeta", "gW0")
        return [out[x] for x in names]

    def gated_delta_forward(self, q, k, v, alpha, beta, W0, reset, chunk, threads=0):
        return self._product_forward(q, k, v, alpha, beta, W0, reset, chunk)

    def gated_delta_backward(self, q, k, v, alpha, beta, reset, ckpt, gy, gW, chunk, threads=0):
        return self._product_backward(q, k, v, alpha, beta, reset, ckpt, gy, gW, chunk)

    def delta_product_forward(self, q, k, v, beta, W0, reset, chunk, threads=0):
        return self._product_forward(q, k, v, None, beta, W0, reset, chunk)

    def delta_product_backward(self, q, k, v, beta, reset, ckpt, gy, gW, chunk, threads=0):
        return self._product_backward(q, k, v, None, beta, reset, ckpt, gy, gW, chunk)

    # ----------------------------------------------------------------------------- srwm

    def srwm_forward(self, x, W_init, dW0, reset, chunk, threads=0):
        T, B, H, d = x.shape
        R = W_init.shape[1]
        dims = (T, B, H, d, d, chunk)
        out = {"y": torch.empty_like(x), "dW": torch.empty_like(dW0), "ckpt": x.new_empty(_nck(T, chunk), B, H, R, d)}
        self._call(
            "srwm_forward",
            x.dtype,
            "SrwmFwdArgs",
            dict(x=x, Winit=W_init, dW0=dW0, reset=self._reset(reset), **out),
            dims,
        )
        return [out["y"], out["dW"], out["ckpt"]]

    def srwm_backward(self, x, W_init, reset, ckpt, gy, gdW, chunk, threads=0):
        T, B, H, d = x.shape
        R = W_init.shape[1]
        dims = (T, B, H, d, d, chunk)
        out = {
            "gx": torch.empty_like(x),
            "gWinit_part": x.new_empty(B, H, R, d),
            "gWinit": torch.empty_like(W_init),
            "gdW0": x.new_empty(B, H, R, d),
        }
        self._call(
            "srwm_backward",
            x.dtype,
            "SrwmBwdArgs",
            dict(x=x, Winit=W_init, reset=self._reset(reset), ckpt=ckpt, gy=gy, gdW=gdW, **out),
            dims,
            self._workspace("srwm", dims, x),
        )
        return [out["gx"], out["gWinit"], out["gdW0"]]

    # ---------------------------------------------------------------------------- mamba

    def mamba_forward(self, u, delta, A, B, C, h0, reset, chunk, threads=0):
        T, Bn, D = u.shape
        N = A.shape[1]
        dims = (T, Bn, 1, N, D, chunk)  # one block per batch entry, its D x N state as the matrix
        out = {"y": torch.empty_like(u), "hT": torch.empty_like(h0), "ckpt": u.new_empty(_nck(T, chunk), Bn, D, N)}
        self._call(
            "mamba_forward",
            u.dtype,
            "MambaFwdArgs",
            dict(u=u, delta=delta, A=A, Bm=B, C=C, h0=h0, reset=self._reset(reset), **out),
            dims,
        )
        return [out["y"], out["hT"], out["ckpt"]]

    def mamba_backward(self, u, delta, A, B, C, reset, ckpt, gy, ghT, chunk, threads=0):
        T, Bn, D = u.shape
        N = A.shape[1]
        dims = (T, Bn, 1, N, D, chunk)
        out = {
            "gu": torch.empty_like(u),
            "gdelta": torch.empty_like(delta),
            "gA_part": u.new_empty(Bn, D, N),
            "gA": torch.empty_like(A),
            "gB": torch.empty_like(B),
            "gC": torch.empty_like(C),
            "gh0": u.new_empty(Bn, D, N),
        }
        self._call(
            "mamba_backward",
            u.dtype,
            "MambaBwdArgs",
            dict(u=u, delta=delta, A=A, Bm=B, C=C, reset=self._reset(reset), ckpt=ckpt, gy=gy, ghT=ghT, **out),
            dims,
            self._workspace("mamba", dims, u),
        )
        return [out[x] for x in ("gu", "gdelta", "gA", "gB", "gC", "gh0")]
