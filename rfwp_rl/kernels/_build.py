"""Building the fused kernels of ``csrc/``: a torch C++ extension (CPU, plus CUDA when torch has
it) and, for tests, the CUDA sources compiled by the host compiler against the emulation
header (``csrc/cuda_emu``) into a plain shared library.

Builds are cached under ``$RFWP_CACHE/kernels`` (the project's one cache root, shared with the
moolib wheel; default ``~/.cache/rfwp_rl``; ``$RFWP_RL_KERNEL_CACHE`` overrides this one) in a
directory named after a hash of the sources, the compiler flags, torch/Python versions and
the CPU's instruction set (the CPU build uses ``-march=native``): each configuration is built
once; later processes import the built module directly (no compiler needed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

import torch

from rfwp_rl.checkpoint import atomic_write_text
from rfwp_rl.kernels.cuda_limits import CU_FILES, nvcc_resource_command
from rfwp_rl.resources import data_dir

# the repository's csrc/ in a checkout, else the copy shipped in the wheel (rfwp_rl/_data/csrc)
CSRC = data_dir("csrc", required=False)

CPU_SOURCES = ("bindings.cpp", "cpu/fastweight_cpu.cpp")
CUDA_SOURCES = ("cuda/torch_cuda.cpp",) + CU_FILES
EMU_CU_FILES = CU_FILES + ("cuda_emu/selftest.cu",)
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-ffp-contract=fast", "-DNDEBUG")
# x86: let the auto-vectorised loops (exp, tanh, softmax of csrc/cpu/vec_math.h) use 512-bit
# vectors where the CPU has them, the width of the kernels' register rows (csrc/cpu/simd_row.h);
# GCC's -march=native prefers 256 bits, and mixing widths stalls store-to-load forwarding.
if platform.machine().lower() in ("x86_64", "amd64", "i686", "i386"):
    CFLAGS += ("-mprefer-vector-width=512",)
NVCC_FLAGS = ("-O3", "-DNDEBUG")
EMU_FLAGS = ("-std=c++20", "-O1", "-g0", "-fPIC", "-shared", "-pthread")


class BuildError(RuntimeError):
    """A build failed; ``log`` is the path of the full compiler output."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


def cache_root() -> Path:
    env = os.environ.get("RFWP_RL_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    root = os.environ.get("RFWP_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "rfwp_rl") / "kernels"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU model and its feature flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "model name"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def source_files(parts: tuple[str, ...] | None = None) -> list[Path]:
    """Files under csrc/ that a build may read: all C++/CUDA sources and headers, or those in
    the given subfolders/files of csrc (``""`` is csrc's top level)."""
    if not CSRC.is_dir():
        return []
    files = sorted(p for p in CSRC.rglob("*") if p.suffix in {".h", ".cuh", ".cpp", ".cu"})
    if parts is None:
        return files

    def wanted(p: Path) -> bool:
        rel = p.relative_to(CSRC)
        return any((part == "" and len(rel.parts) == 1) or rel.parts[0] == part or str(rel) == part for part in parts)

    return [p for p in files if wanted(p)]


# what each build reads
CPU_PARTS = ("", "cpu")
CUDA_PARTS = ("", "cpu", "cuda")
EMU_PARTS = ("fastweight_params.h", "cuda", "cuda_emu")


def _hash(parts: tuple[str, ...] | None, *extra: str) -> str:
    h = hashlib.sha256()
    for p in source_files(parts):
        h.update(str(p.relative_to(CSRC)).encode())
        h.update(p.read_bytes())
    for part in extra:
        h.update(part.encode())
    return h.hexdigest()[:16]


def torch_has_cuda() -> bool:
    """torch was built with CUDA and a CUDA toolkit is available to compile the kernels."""
    if torch.version.cuda is None:
        return False
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME is not None


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _import_extension(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def cuda_arch_list() -> str:
    """The GPU architectures a CUDA build compiles for, as torch's extension builder picks
    them: ``TORCH_CUDA_ARCH_LIST`` when set, else the compute capabilities of the visible
    devices (e.g. ``"8.0 9.0"``); empty when neither says."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env:
        return " ".join(env.replace(";", " ").split())
    if torch.cuda.is_available():
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return " ".join(f"{major}.{minor}" for major, minor in caps)
    return ""


def extension_name(with_cuda: bool, arch: str | None = None) -> str:
    """The cache directory and module name of a build: a hash of what the binary depends
    on. A CUDA build also depends on the GPU architectures it was compiled for (``arch``,
    default :func:`cuda_arch_list`): a build cached on an H100 node has no kernel image for
    an A100 node sharing the cache."""
    extra = [torch.__version__, sys.version, " ".join(CFLAGS), " ".join(NVCC_FLAGS), str(with_cuda), _cpu_signature()]
    if with_cuda:
        extra.append("arch " + (cuda_arch_list() if arch is None else arch))
    key = _hash(CUDA_PARTS if with_cuda else CPU_PARTS, "ext", *extra)
    return f"rfwp_fastweight_{'cuda' if with_cuda else 'cpu'}_{key}"


def load_extension(with_cuda: bool) -> tuple[ModuleType, float]:
    """Import the torch extension, building it first if it is not cached.

    Returns (module, seconds spent building; 0.0 when it was cached). Raises BuildError with
    the path of the full log on failure. Compiler output never reaches the console.
    """
    if not source_files():
        raise BuildError(f"the C++ sources are not installed (no {CSRC})")
    name = extension_name(with_cuda)
    build_dir = cache_root() / name
    built = build_dir / f"{name}.so"  # what torch.utils.cpp_extension.load writes
    if built.exists():
        try:
            return _import_extension(name, built), 0.0
        except (ImportError, OSError) as e:  # e.g. a copied cache from another machine
            raise BuildError(f"the cached build {built} does not load ({e}); delete {build_dir} to rebuild") from None
    if shutil.which("ninja") is None:
        raise BuildError("ninja is not installed (pip install ninja)")
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "build.log"
    start = time.perf_counter()
    with _file_lock(cache_root() / f".{name}.lock"):
        if not built.exists():  # another process may have built it while we waited
            from torch.utils import cpp_extension

            # torch's loader marks a build in progress with the file "lock" in the build
            # directory; a build killed midway leaves it behind and every later load of this
            # directory would wait for it forever. Under our lock no other process builds here.
            (build_dir / "lock").unlink(missing_ok=True)
            sources = [str(CSRC / s) for s in CPU_SOURCES]
            cflags = list(CFLAGS)
            if with_cuda:
                sources += [str(CSRC / s) for s in CUDA_SOURCES]
                cflags.append("-DRFWP_WITH_CUDA")
            try:
                module = cpp_extension.load(
                    name=name,
                    sources=sources,
                    extra_cflags=cflags,
                    extra_cuda_cflags=list(NVCC_FLAGS),
                    extra_include_paths=[str(CSRC)],
                    build_directory=str(build_dir),
                    with_cuda=with_cuda,
                    verbose=False,
                )
            except Exception as e:  # compiler errors, missing toolchain, ...
                log.write_text(f"{type(e).__name__}: {e}\n", encoding="utf-8")
                first = next(
                    (ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()),
                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                )
                raise BuildError(f"build failed ({first[:160]})", log) from None
            sys.modules[name] = module
    seconds = time.perf_counter() - start
    try:
        return _import_extension(name, built), seconds
    except (ImportError, OSError) as e:
        raise BuildError(f"the build {built} does not load ({e})") from None


# ------------------------------------------------------------------ emulated CUDA (tests)


def emulated_cuda_library() -> Path:
    """Compile csrc/cuda/*.cu with g++ against csrc/cuda_emu/cuda_emulation.h into a shared
    library with a C interface (csrc/cuda_emu/emu_capi.cpp); cached by source hash."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise BuildError(f"no host C++ compiler ({cxx}) on PATH")
    key = _hash(EMU_PARTS, "emu", cxx, " ".join(EMU_FLAGS))
    out_dir = cache_root() / f"cuda_emu_{key}"
    lib = out_dir / "librfwp_cuda_emu.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_root() / f".cuda_emu_{key}.lock"):
        if lib.exists():
            return lib
        tmp = out_dir / f".tmp-{os.getpid()}.so"
        cmd = [
            cxx,
            *EMU_FLAGS,
            f"-I{CSRC}",
            "-include",
            str(CSRC / "cuda_emu" / "cuda_emulation.h"),
            "-x",
            "c++",
            *[str(CSRC / f) for f in EMU_CU_FILES],
            "-x",
            "none",
            str(CSRC / "cuda_emu" / "emu_capi.cpp"),
            "-o",
            str(tmp),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log = out_dir / "build.log"
            log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr, encoding="utf-8")
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), "")
            raise BuildError(f"emulated CUDA build failed: {first[:200]}", log)
        os.replace(tmp, lib)
    return lib


def _cached_command(kind: str, cmd: list[str], key_extra: str = "") -> tuple[bool, str, Path]:
    """Run ``cmd`` once per (sources, command) hash; later calls reuse the recorded outcome. A second caller
    of the same command (another process, or a thread: the test suite builds ahead in one) waits for the
    first and takes its outcome.

    Returns (ok, output, directory). The command may write into ``{out}`` (replaced by the
    cache directory).
    """
    key = _hash(None, kind, " ".join(cmd), key_extra)
    out_dir = cache_root() / f"{kind}_{key}"
    ok_marker = out_dir / "ok"
    if ok_marker.exists():
        return True, ok_marker.read_text(encoding="utf-8"), out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_root() / f".{kind}_{key}.lock"):
        if ok_marker.exists():
            return True, ok_marker.read_text(encoding="utf-8"), out_dir
        cmd = [c.replace("{out}", str(out_dir)) for c in cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        output = " ".join(cmd) + "\n" + proc.stdout + proc.stderr
        # whole files: the marker's existence is read outside the lock
        atomic_write_text(ok_marker if proc.returncode == 0 else out_dir / "build.log", output)
    return proc.returncode == 0, output, out_dir


def _tool_version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return ""


def nvcc_compile(cu_file: str, arch: int) -> tuple[bool, str]:
    """Compile one .cu file under csrc/ with nvcc for sm_<arch> (object only; cached), the output with ptxas's
    resource report (:func:`rfwp_rl.kernels.cuda_limits.parse_resource_usage`): the one nvcc build of the tests."""
    cmd = nvcc_resource_command(CSRC / cu_file, CSRC, arch, "{out}/" + Path(cu_file).stem + ".o")
    ok, output, _ = _cached_command("nvcc_ru", cmd, _tool_version("nvcc"))
    return ok, output


def race_check_binary() -> Path:
    """The CUDA kernels + csrc/cuda_emu/race_check.cpp built against the emulation with
    ThreadSanitizer (cached). Raises BuildError if the toolchain cannot build it."""
    cxx = os.environ.get("CXX", "g++")
    cmd = [
        cxx,
        "-std=c++20",
        "-O1",
        "-g",
        "-fsanitize=thread",
        "-pthread",
        f"-I{CSRC}",
        "-include",
        str(CSRC / "cuda_emu" / "cuda_emulation.h"),
        "-x",
        "c++",
        *[str(CSRC / f) for f in CU_FILES],
        "-x",
        "none",
        str(CSRC / "cuda_emu" / "race_check.cpp"),
        "-o",
        "{out}/race_check",
    ]
    ok, output, out_dir = _cached_command("tsan", cmd, _tool_version(cxx))
    if not ok:
        first = next((ln for ln in output.splitlines() if "error" in ln), output.splitlines()[-1])
        raise BuildError(f"ThreadSanitizer build failed: {first[:200]}", out_dir / "build.log")
    return out_dir / "race_check"


def cuda_runtime_include() -> Path | None:
    """The CUDA runtime headers' folder of the toolkit whose nvcc is on PATH (beside it, else
    /usr/local/cuda/include, where nvcc is a wrapper outside the toolkit), or None."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    for include in (Path(nvcc).resolve().parent.parent / "include", Path("/usr/local/cuda/include")):
        if (include / "cuda_runtime.h").exists():
            return include
    return None


def cuda_binding_syntax_check(cuda_include: Path) -> tuple[bool, str]:
    """Compile the torch side of the CUDA build (bindings.cpp with RFWP_WITH_CUDA and
    cuda/torch_cuda.cpp) syntax-only against torch's headers and the CUDA runtime headers."""
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "g++")
    # CPU wheels ship c10/cuda headers but not this generated one (it defines one macro)
    stub = cache_root() / "cuda_header_stub"
    (stub / "c10" / "cuda" / "impl").mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h", "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"
    )
    incs = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{cuda_include}", f"-I{CSRC}", f"-I{stub}"]
    py_inc = sysconfig.get_paths()["include"]
    # one translation unit, so torch's headers are parsed once
    unit = stub / "cuda_binding_check.cpp"
    atomic_write_text(unit, f'#include "{CSRC / "bindings.cpp"}"\n#include "{CSRC / "cuda" / "torch_cuda.cpp"}"\n')
    cmd = [
        cxx,
        "-std=c++20",
        "-fsyntax-only",
        "-DRFWP_WITH_CUDA",
        "-DTORCH_EXTENSION_NAME=rfwp_check",
        f"-I{py_inc}",
        *incs,
        str(unit),
    ]
    return _cached_command("cudabind", cmd, torch.__version__ + _tool_version(cxx))[:2]
