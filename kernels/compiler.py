"""NVRTC compilation to CUBIN, the ptxas resource report, and a content-addressed CUBIN cache."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from kernels.space import Config, Family


class CompileError(RuntimeError):
    def __init__(self, message: str, log: str = ""):
        super().__init__(message + (f"\n{log}" if log else ""))
        self.log = log


@dataclass(frozen=True)
class Resources:
    registers: int
    shared_static_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int


# The GEMM kernel's entry name in every family's program (``Family.kernel_name``); a split-K
# reduction beside it has its own.
MAIN_KERNEL = "gemm"


@dataclass(frozen=True)
class CompiledKernel:
    cubin: bytes
    arch: str
    resources: dict[str, Resources]
    log: str
    seconds: float
    cached: bool

    @property
    def main(self) -> Resources:
        """Resources of the GEMM kernel itself (not the split-K reduction)."""
        return self.resources[MAIN_KERNEL]


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(log: str) -> dict[str, Resources]:
    """Per-kernel registers, static shared memory, spills and stack from `-Xptxas -v` output.

    ptxas prints, per entry: "Compiling entry function 'k'", then the stack/spill line, then
    "Used N registers, ... S bytes smem".
    """
    out: dict[str, Resources] = {}
    entry, frame = None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry, frame = m.group(1), (0, 0, 0)
        elif m := _FRAME.search(line):
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry:
            smem = _SMEM.search(line)
            out[entry] = Resources(int(m.group(1)), int(smem.group(1)) if smem else 0, frame[1], frame[2], frame[0])
    return out


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def default_cache_dir() -> Path:
    env = os.environ.get("GEMMTUNE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemmtune" / "cubins"


def _check(err, what: str, log: str = "") -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err.name if hasattr(err, 'name') else err}", log)


def cache_key(program: str, arch: str) -> str:
    """Source text (parameters included), architecture and NVRTC version address a CUBIN."""
    return hashlib.sha256(f"{nvrtc_version()}\0{arch}\0{program}".encode()).hexdigest()


def compile_program(program: str, arch: str, name: str = "gemm.cu") -> tuple[bytes, str]:
    """NVRTC → CUBIN for `arch` ("sm_90"), with ptxas' resource report in the log."""
    from cuda.bindings import nvrtc

    if not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch must look like 'sm_90', got {arch!r}")
    err, prog = nvrtc.nvrtcCreateProgram(program.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        # --no-cache: NVRTC >= 12.9 caches compiles and then prints no ptxas report.
        opts = [f"--gpu-architecture={arch}", "-std=c++17", "-Xptxas", "-v", "--no-cache"]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00 \n")
        _check(result, "nvrtcCompileProgram", log)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program(family: Family, config: Config, arch: str, layout: str = "nn", batch: int = 1,
             bias: bool = False) -> tuple[str, str]:
    """The program text and compile target of one config and problem kind (ConfigError if rejected)."""
    from kernels.space import ConfigError

    reasons = family.reject_reasons(config, arch)
    if reasons:
        raise ConfigError(f"{family.name} config {dict(config)} rejected: " + "; ".join(reasons))
    if layout == "nn" and batch == 1 and not bias:  # (a family view may take no more)
        return family.program(config), family.target(arch)  # e.g. sm_90a where it needs wgmma
    return family.program(config, layout, batch, bias), family.target(arch)


def cubin_key(family: Family, config: Config, arch: str = "sm_90", layout: str = "nn") -> str:
    """What addresses the config's CUBIN: configs that differ only in launch-time parameters
    (RASTER, SPLITK) share it; layouts do not. ConfigError where the family rejects the config."""
    return cache_key(*_program(family, config, arch, layout))


def _paths(key: str, cache_dir: Path | str | None) -> tuple[Path, Path]:
    """The cache files (CUBIN, metadata) of the CUBIN addressed by ``key``."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / f"{key}.cubin", folder / f"{key}.json"


def _entry(family: Family, config: Config, arch: str, cache_dir: Path | str | None, layout: str = "nn",
           batch: int = 1, bias: bool = False) -> tuple[str, str, Path, Path]:
    """The program text, compile target and cache files of one config (ConfigError if rejected)."""
    program, target = _program(family, config, arch, layout, batch, bias)
    return program, target, *_paths(cache_key(program, target), cache_dir)


def _read_entry(cubin_path: Path, meta_path: Path, arch: str, start: float) -> CompiledKernel | None:
    try:
        meta = json.loads(meta_path.read_text())
        resources = {k: Resources(**v) for k, v in meta["resources"].items()}
        return CompiledKernel(cubin_path.read_bytes(), arch, resources, meta["log"],
                              time.perf_counter() - start, cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or a damaged entry: to be (re)built


def cached_cubin(key: str, arch: str = "sm_90", cache_dir: Path | str | None = None
                 ) -> CompiledKernel | None:
    """The CUBIN the on-disk cache holds under ``key`` (``cubin_key``), else None; never
    compiles."""
    return _read_entry(*_paths(key, cache_dir), arch, time.perf_counter())


def cached_config(family: Family, config: Config, arch: str = "sm_90",
                  cache_dir: Path | str | None = None, layout: str = "nn") -> CompiledKernel | None:
    """The config's CUBIN where the on-disk cache holds it, else None; never compiles (a
    millisecond: what a caller can do inline instead of queueing a compile)."""
    return cached_cubin(cubin_key(family, config, arch, layout), arch, cache_dir)


def compile_config(family: Family, config: Config, arch: str = "sm_90",
                   cache_dir: Path | str | None = None, layout: str = "nn", batch: int = 1,
                   bias: bool = False) -> CompiledKernel:
    """Compile one config of a family for a layout (kernels.layout), a batch (batch > 1) and a
    bias epilogue, through the on-disk cache. Rejected configs raise ConfigError."""
    start = time.perf_counter()
    program, target, cubin_path, meta_path = _entry(family, config, arch, cache_dir, layout, batch, bias)
    found = _read_entry(cubin_path, meta_path, arch, start)
    if found is not None:
        return found
    cubin_path.parent.mkdir(parents=True, exist_ok=True)
    with compiling(cubin_path):
        found = _read_entry(cubin_path, meta_path, arch, start)  # built while we waited
        if found is not None:
            return found
        cubin, log = compile_program(program, target, f"{family.name}.cu")
        resources = parse_ptxas_report(log)
        if family.kernel_name not in resources:
            raise CompileError(f"no ptxas report for kernel {family.kernel_name!r}", log)
        seconds = time.perf_counter() - start
        meta = {"family": family.name, "config": dict(config), "layout": layout, "batched": batch > 1,
                "bias": bias, "arch": target,
                "nvrtc": nvrtc_version(), "log": log,
                "resources": {k: asdict(v) for k, v in resources.items()}}
        atomic_write(cubin_path, cubin)
        atomic_write(meta_path, json.dumps(meta).encode())
    return CompiledKernel(cubin, arch, resources, log, seconds, cached=False)


@contextmanager
def compiling(cubin_path: Path) -> Iterator[None]:
    """Hold the cache entry's lock while building it: processes sharing a cache (tuners of
    several GPUs on one host, each with a compile pool) wait for a compile another has begun
    instead of repeating it. The lock file stays: removing it could let a third process lock a
    new file while the second still waits on the old one."""
    with open(cubin_path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def atomic_write(path: Path, data: bytes) -> None:
    """Write a cache file whole or not at all: several processes (compile workers, preparing
    processes) may write and read the same entry; the rename makes each write all-or-nothing."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
