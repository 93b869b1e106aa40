"""The live evaluator: NVRTC compiles in a pool of CPU processes, measurement in a GPU child.

The GPU child runs ``tuner.measure.gpu.GpuBench`` (or a stand-in backend with the same names). A
candidate that kills the CUDA context (GpuFault), the child process, or hangs past the timeout
is recorded as crashed / timeout, and the child is replaced and given the problem again.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Any

import kernels

from tuner.lifetime import child_init
from tuner.measure.evaluator import COMPILE_ERROR, CRASHED, TIMEOUT, Baseline, Measurement
from tuner.measure.resources import summarize
from tuner.problem import Problem, config_key

log = logging.getLogger(__name__)

DEFAULT_TRIAL_TIMEOUT_S = 30.0
# Context creation, the float64 reference of a large problem, the cuBLAS baseline.
SETUP_TIMEOUT_S = 600.0

# What the GPU child measures with: a backend's public name (the value of
# $GEMMTUNE_GPU_BACKEND and of LiveEvaluator's ``backend``, as README and tests spell it) → its
# module. Any other name is taken as a module path.
BACKENDS = {"tuner.gpu": "tuner.measure.gpu", "tuner.testing": "tuner.measure.testing"}
DEFAULT_BACKEND = "tuner.gpu"
# For tests only: "tuner.testing" here makes the whole command (compile pool, child process,
# signals, database) run on the CPU stand-in instead of a GPU.
BACKEND_ENV = "GEMMTUNE_GPU_BACKEND"


def backend_module(name: str) -> ModuleType:
    """The module behind a backend name: ``probe()``, ``GpuFault`` and ``GpuBench``."""
    return importlib.import_module(BACKENDS.get(name, name))


class GpuUnavailable(RuntimeError):
    """No usable CUDA driver or GPU (the reason from ``probe()``)."""


class ChildTimeout(RuntimeError):
    pass


class ChildCrashed(RuntimeError):
    pass


class ChildFault(RuntimeError):
    """The child's CUDA context is dead (GpuFault); the process has to be replaced."""


# ------------------------------------------------------------------ the GPU child process


def _child_main(conn: Connection, backend: str, device: int, options: dict[str, Any],
                parent_pid: int) -> None:
    child_init(parent_pid)
    try:
        gpu = backend_module(backend)
        reason = gpu.probe()
        if reason is not None:
            conn.send(("unavailable", reason))
            return
        bench = gpu.GpuBench(device, **options)
        conn.send(("ready", {"info": bench.info(), "arch": bench.arch()}))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        op, args = request[0], request[1:]
        if op == "stop":
            return
        try:
            if op == "problem":
                bench.set_problem(*args)
                conn.send(("ok", None))
            elif op == "baseline":
                conn.send(("ok", bench.baseline()))
            elif op == "evaluate":
                conn.send(("ok", bench.evaluate(*args)))
            else:
                conn.send(("error", f"unknown request {op!r}"))
        except gpu.GpuFault as fault:
            conn.send(("fault", str(fault)))
            return  # a sticky error: this process's context is unusable
        except Exception:
            conn.send(("error", traceback.format_exc()))


class GpuChild:
    """The parent's handle on one GPU child process."""

    def __init__(self, device: int, backend: str, options: dict[str, Any]) -> None:
        self.device, self.backend, self.options = device, backend, options
        self.process: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.info: dict[str, Any] = {}
        self.arch = ""

    def start(self, timeout: float = SETUP_TIMEOUT_S) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main,
            args=(child, self.backend, self.device, self.options, os.getpid()),
            name=f"gemmtune-gpu{self.device}", daemon=True,
        )
        self.process.start()
        child.close()
        self.conn = parent
        kind, payload = self._receive(timeout, "starting")
        if kind == "unavailable":
            self.stop()
            raise GpuUnavailable(payload)
        if kind != "ready":
            self.stop()
            raise RuntimeError(f"the GPU process failed to start:\n{payload}")
        self.info, self.arch = payload["info"], payload["arch"]

    def _receive(self, timeout: float, what: str) -> tuple[str, Any]:
        assert self.conn is not None and self.process is not None
        deadline = time.monotonic() + timeout
        # Poll in short steps so that a child that dies without a word is noticed quickly.
        while not self.conn.poll(min(0.25, max(0.0, deadline - time.monotonic()))):
            if not self.process.is_alive():
                if self.conn.poll(0):
                    break
                raise ChildCrashed(
                    f"GPU process died while {what} (exit code {self.process.exitcode})"
                )
            if time.monotonic() >= deadline:
                raise ChildTimeout(f"GPU process gave no answer within {timeout:g} s while {what}")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1)
            raise ChildCrashed(
                f"GPU process died while {what} (exit code {self.process.exitcode})"
            ) from None

    def request(self, message: tuple, timeout: float, what: str) -> Any:
        assert self.conn is not None
        try:
            self.conn.send(message)
        except (BrokenPipeError, OSError):
            raise ChildCrashed(f"GPU process is gone (before {what})") from None
        kind, payload = self._receive(timeout, what)
        if kind == "ok":
            return payload
        if kind == "fault":
            raise ChildFault(payload)
        raise RuntimeError(payload)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.is_alive() and self.conn is not None:
            try:
                self.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(2)
        if self.process.is_alive():
            self.process.kill()  # a hung kernel: only the process's death frees the GPU
            self.process.join(10)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None


# ------------------------------------------------------------------ the compile pool


@dataclass(frozen=True)
class _Compiled:
    cubin: bytes | None
    resources: dict[str, Any]
    seconds: float
    error: str | None = None


def _compile_job(family_ref: Any, config: dict[str, int], arch: str, cache_dir: str | None
                 ) -> _Compiled:
    family = kernels.get_family(family_ref) if isinstance(family_ref, str) else family_ref
    start = time.perf_counter()
    try:
        compiled = kernels.compile_config(family, config, arch=arch, cache_dir=cache_dir)
    except kernels.CompileError as error:
        return _Compiled(None, {}, time.perf_counter() - start, str(error))
    return _Compiled(compiled.cubin, dict(compiled.resources), compiled.seconds)


def _family_ref(family: Any) -> Any:
    # Registered families travel by name; others (planted test kernels) as pickled objects.
    return family.name if kernels.FAMILIES.get(family.name) is family else family


def default_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) - 1))


class CompilePool:
    def __init__(self, arch: str, cache_dir: Path | str | None, workers: int) -> None:
        self.arch = arch
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None

    def submit(self, family: Any, config: dict[str, int]) -> Future[_Compiled]:
        # The executor starts its processes here, from the calling thread, and each one's
        # parent-death signal is tied to that thread (tuner.lifetime): submit from a thread
        # that lives as long as the pool (the tuner's main thread does).
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=mp.get_context("spawn"),
                initializer=child_init, initargs=(os.getpid(),),
            )
        return self._executor.submit(_compile_job, _family_ref(family), dict(config), self.arch,
                                     self.cache_dir)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


# ------------------------------------------------------------------ the evaluator


class LiveEvaluator:
    """Evaluator on a real GPU (or, with ``backend="tuner.testing"``, on the CPU stand-in)."""

    def __init__(
        self,
        device: int = 0,
        *,
        cache_dir: Path | str | None = None,
        workers: int | None = None,
        trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
        setup_timeout_s: float = SETUP_TIMEOUT_S,
        backend: str = DEFAULT_BACKEND,
        backend_options: dict[str, Any] | None = None,
    ) -> None:
        self.trial_timeout_s = trial_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.child = GpuChild(device, backend, backend_options or {})
        self.child.start(setup_timeout_s)
        self.pool = CompilePool(self.child.arch, cache_dir, workers or default_workers())
        self.problem: Problem | None = None
        self.replacements = 0
        self._compiles: dict[tuple, Future[_Compiled]] = {}

    @property
    def batch(self) -> int:
        """How many candidates the search should keep in flight."""
        return self.pool.workers

    def info(self) -> dict[str, Any]:
        return dict(self.child.info)

    def arch(self) -> str:
        return self.child.arch

    def set_problem(self, problem: Problem) -> None:
        if problem == self.problem:
            return  # inputs and the float64 reference are already in place
        self.child.request(("problem", problem.m, problem.n, problem.k), self.setup_timeout_s,
                           f"preparing problem {problem.shape}")
        self.problem = problem

    def baseline(self) -> Baseline:
        result = self.child.request(("baseline",), self.setup_timeout_s, "timing cuBLAS")
        return Baseline(result.get("library", "cublas"), float(result["time_median_ms"]),
                        float(result["gflops"]), result.get("sm_clock_mhz"))

    def _key(self, family: Any, config: dict[str, int]) -> tuple:
        return (family.name, family.source_hash, config_key(config))

    def prepare(self, family: Any, config: dict[str, int]) -> None:
        key = self._key(family, config)
        if key not in self._compiles:
            self._compiles[key] = self.pool.submit(family, config)

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Measurement:
        if problem != self.problem:
            self.set_problem(problem)
        key = self._key(family, config)
        future = self._compiles.pop(key, None) or self.pool.submit(family, config)
        compiled = future.result()
        if compiled.cubin is None:
            return Measurement(state=COMPILE_ERROR, error=compiled.error,
                               compile_seconds=compiled.seconds)
        used = summarize(family, config, problem, compiled.resources, self.arch())
        common = {
            "compile_seconds": compiled.seconds, "registers": used.registers,
            "shared_bytes": used.shared_bytes, "spill_bytes": used.spill_bytes,
            "occupancy": used.occupancy,
        }
        m, n, k = problem.m, problem.n, problem.k
        request = ("evaluate", compiled.cubin, family.launches(config, m, n, k),
                   family.workspace_bytes(config, m, n, k), family.flops(m, n, k))
        try:
            result = self.child.request(request, self.trial_timeout_s, "evaluating a candidate")
        except ChildTimeout as error:
            self._replace_child(str(error))
            return Measurement(state=TIMEOUT, error=f"{error}; the GPU process was replaced",
                               **common)
        except (ChildFault, ChildCrashed) as error:
            self._replace_child(str(error))
            return Measurement(state=CRASHED, error=f"{error}; the GPU process was replaced",
                               **common)
        except RuntimeError as error:  # the bench itself raised: keep the text, start clean
            self._replace_child("unexpected error in the GPU process")
            return Measurement(state=CRASHED, error=str(error), **common)
        return Measurement(
            state=result["state"], error=result.get("error"),
            time_min_ms=result.get("time_min_ms"), time_median_ms=result.get("time_median_ms"),
            time_max_ms=result.get("time_max_ms"), launches=result.get("launches"),
            gflops=result.get("gflops"), sm_clock_mhz=result.get("sm_clock_mhz"), **common,
        )

    def _replace_child(self, why: str) -> None:
        log.warning("replacing the GPU process: %s", why.splitlines()[0] if why else why)
        self.child.stop()
        self.child.start(self.setup_timeout_s)
        self.replacements += 1
        if self.problem is not None:
            problem, self.problem = self.problem, None
            self.set_problem(problem)

    def close(self) -> None:
        for future in self._compiles.values():
            future.cancel()
        self._compiles.clear()
        self.pool.close()
        self.child.stop()

    def __enter__(self) -> LiveEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
