"""STAND-INS FOR TESTS ON MACHINES WITHOUT A GPU. Nothing here measures anything real.

* ``StandInEvaluator``: an Evaluator whose "GFLOP/s" come from a deterministic analytic model
  over the config, and which can be told to answer wrong_result / crashed / timeout /
  launch_error / compile_error for chosen configs, so the search loop's fault paths run on CPU.
* ``probe`` / ``GpuFault`` / ``GpuBench``: a stand-in for ``tuner.measure.gpu`` with the same names,
  loadable as the GPU child's backend (``LiveEvaluator(backend="tuner.testing")``), so the
  child-process machinery (timeouts, faults, deaths, replacement) runs on CPU. Its behaviour per
  kernel name comes from the ``faults`` option.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import kernels

from tuner.measure.evaluator import OK, Baseline, Measurement
from tuner.problem import Problem

STANDIN_PEAK_GFLOPS = 20_000.0
STANDIN_CUBLAS_GFLOPS = 18_000.0


def _preferred_index(family_name: str, param_name: str, n_values: int, problem: Problem) -> int:
    digest = hashlib.sha256(f"{family_name}:{param_name}".encode()).digest()
    # The optimum drifts with the problem's size, so nearby problems have similar optima.
    size_class = int(math.log2(problem.m) + math.log2(problem.n) + math.log2(problem.k)) // 6
    return (digest[0] + size_class) % n_values


def model_gflops(family: Any, config: dict[str, int], problem: Problem) -> float:
    """A smooth landscape with one optimum per (family, size class): each parameter has a
    preferred value (from a hash of its name and the problem's size class) and the rate falls
    off with the squared distance, in index steps, from it. Larger problems get closer to the
    peak, as on real hardware."""
    distance = 0.0
    for param in family.params:
        values = sorted(param.values)
        index = values.index(config[param.name])
        preferred = _preferred_index(family.name, param.name, len(values), problem)
        distance += ((index - preferred) / max(1, len(values) - 1)) ** 2
    size = (problem.m * problem.n * problem.k) ** (1 / 3)
    return STANDIN_PEAK_GFLOPS * math.exp(-3.0 * distance) * size / (size + 256.0)


def model_optimum(family: Any, problem: Problem) -> dict[str, int]:
    """The config ``model_gflops`` ranks first (whether the family accepts it or not)."""
    return {
        param.name: sorted(param.values)[
            _preferred_index(family.name, param.name, len(param.values), problem)
        ]
        for param in family.params
    }


NAME_ENV = "GEMMTUNE_STANDIN_NAME"


@dataclass
class StandInEvaluator:
    """Deterministic evaluator for CPU tests; every call is logged in ``calls``."""

    # GEMMTUNE_STANDIN_NAME: another model's name, so that the search reads that model's bundled
    # recordings (a profile of the start-ups as on that GPU, on the CPU)
    gpu_name: str = field(default_factory=lambda: os.environ.get(NAME_ENV)
                          or "Stand-in GPU (analytic model)")
    gpu_uuid: str = "GPU-00000000-stand-in"
    # config → planted state (wrong_result, crashed, timeout, launch_error, compile_error) or None
    fault: Callable[[dict[str, int]], str | None] = lambda config: None
    # send this process SIGINT (as Ctrl-C would) right after this many evaluations
    interrupt_after: int | None = None
    # the clock at the n-th evaluation (from 1), a fraction of the full 1980 MHz: a throttling
    # GPU, whose timings of one config differ with when it ran
    clock: Callable[[int], float] = lambda call: 1.0
    calls: list[tuple[str, dict[str, int], Problem]] = field(default_factory=list)
    prepared: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    discarded: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    baselines: list[Problem] = field(default_factory=list)
    closed: bool = False

    def info(self) -> dict[str, Any]:
        return {
            "name": self.gpu_name, "uuid": self.gpu_uuid, "compute_capability": "9.0",
            "sm_count": 132, "memory_bytes": 80 * 2**30, "max_sm_clock_mhz": 1980,
            "driver_version": "stand-in", "cuda_version": "stand-in", "nvrtc_version": "stand-in",
        }

    def arch(self) -> str:
        return "sm_90"

    def set_problem(self, problem: Problem) -> None:
        self.problems.append(problem)

    def baseline(self) -> Baseline:
        problem = self.problems[-1]
        self.baselines.append(problem)
        clock = self.clock(len(self.calls))
        gflops = STANDIN_CUBLAS_GFLOPS * clock
        return Baseline("cublas", 2.0 * problem.m * problem.n * problem.k / (gflops * 1e6),
                        gflops, round(1980 * clock))

    def prepare(self, family: Any, config: dict[str, int]) -> None:
        self.prepared.append((family.name, dict(config)))

    def discard(self, family: Any, config: dict[str, int]) -> None:
        self.discarded.append((family.name, dict(config)))

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Measurement:
        if not family.accepts(config):
            raise AssertionError(f"a rejected config reached the evaluator: {config}")
        self.calls.append((family.name, dict(config), problem))
        if self.interrupt_after is not None and len(self.calls) == self.interrupt_after:
            os.kill(os.getpid(), signal.SIGINT)
        planted = self.fault(config)
        if planted is not None:
            return Measurement(state=planted, error=f"stand-in: planted {planted}",
                               compile_seconds=0.01)
        clock = self.clock(len(self.calls))
        gflops = model_gflops(family, config, problem) * clock
        ms = family.flops(problem.m, problem.n, problem.k) / (gflops * 1e6)
        return Measurement(
            state=OK, compile_seconds=0.01, registers=64, shared_bytes=16384, spill_bytes=0,
            occupancy=0.5, time_min_ms=ms * 0.99, time_median_ms=ms, time_max_ms=ms * 1.02,
            launches=10, gflops=gflops, sm_clock_mhz=1980 * clock,
        )

    def close(self) -> None:
        self.closed = True


# ------------------------------------------------------------------ stand-in GPU child backend


def probe() -> str | None:
    return os.environ.get("GEMMTUNE_STANDIN_NO_GPU") or None


# How many GPUs the stand-in's driver sees (default 1): a test gives --gpus all several.
GPUS_ENV = "GEMMTUNE_STANDIN_GPUS"


def device_count() -> int:
    return int(os.environ.get(GPUS_ENV) or 1)


class GpuFault(RuntimeError):
    """Stand-in for tuner.measure.gpu.GpuFault."""


# Seconds one evaluation takes in the stand-in GPU child where its options name none: a test
# that runs the command as a subprocess slows the child down through the environment.
MEASURE_ENV = "GEMMTUNE_STANDIN_MEASURE_S"


class GpuBench:
    """Stand-in for tuner.measure.gpu.GpuBench. ``faults`` maps a CUBIN's sha256 hex digest, or a
    kernel name (the first launch's), to what evaluating it does: "fault" (raise GpuFault), "hang"
    (never answer), "exit" (the process dies), "launch_error" or "wrong" (answered as such)."""

    def __init__(self, device: int = 0, faults: dict[str, str] | None = None,
                 measure_s: float = 0.0) -> None:
        self.device = device
        self.faults = faults or {}
        # Wall time one evaluation takes (slept, split 10/30/60 over load/verify/time), so that
        # bench/throughput.py shows on CPU how the loop overlaps with a busy GPU child.
        self.measure_s = measure_s or float(os.environ.get(MEASURE_ENV) or 0.0)
        self.problem: tuple[int, int, int] | None = None

    def info(self) -> dict[str, Any]:
        return StandInEvaluator().info() | {"uuid": f"GPU-stand-in-child-{os.getpid()}"}

    def arch(self) -> str:
        return "sm_90"

    def set_problem(self, m: int, n: int, k: int, seed: int = 0, layout: str = "nn", batch: int = 1) -> None:
        self.problem = (m, n, k)

    def baseline(self) -> dict[str, Any]:
        return self._timing(STANDIN_CUBLAS_GFLOPS) | {"library": "cublas"}

    def _timing(self, gflops: float) -> dict[str, Any]:
        if self.problem is None:
            raise RuntimeError("set_problem was not called")
        m, n, k = self.problem
        ms = 2.0 * m * n * k / (gflops * 1e6)
        return {"time_min_ms": ms, "time_median_ms": ms, "time_max_ms": ms, "launches": 5,
                "gflops": gflops, "sm_clock_mhz": 1980}

    def evaluate(self, cubin: bytes, launches: list, workspace_bytes: int, flops: int
                 ) -> dict[str, Any]:
        behaviour = self.faults.get(hashlib.sha256(cubin).hexdigest(),
                                    self.faults.get(launches[0].kernel))
        if behaviour == "fault":
            raise GpuFault("stand-in: CUDA_ERROR_ILLEGAL_ADDRESS")
        if behaviour == "hang":
            while True:
                time.sleep(1)
        if behaviour == "exit":
            os._exit(3)
        if behaviour == "launch_error":
            return {"state": "launch_error", "error": "stand-in: too many resources requested",
                    "rel_error": None, "time_min_ms": None, "time_median_ms": None,
                    "time_max_ms": None, "launches": None, "gflops": None, "sm_clock_mhz": None}
        phases = {name: self._pretend(share) for name, share in
                  (("load", 0.1), ("verify", 0.3), ("time", 0.6))}
        gflops = 1000.0 + int.from_bytes(hashlib.sha256(cubin).digest()[:2], "big") % 1000
        state = "wrong_result" if behaviour == "wrong" else "ok"
        timing = self._timing(gflops)
        return {"state": state, "error": "stand-in: max error 1.0" if state != "ok" else None,
                "rel_error": 1.0 if state != "ok" else 1e-7, "phases": phases,
                # the "kernel" ran for the timed share of the pretended work
                "kernel_s": phases["time"]} | timing

    def _pretend(self, share: float) -> float:
        start = time.perf_counter()
        if self.measure_s > 0:
            time.sleep(self.measure_s * share)
        return time.perf_counter() - start


# ------------------------------------------------------------------ planted kernels

_PLANTED_SOURCE = r"""
// A correct but slow GEMM (MODE 0), or a planted fault: an illegal address (MODE 1), a
// kernel that never ends (MODE 2), or source that does not compile (MODE 3).
// One thread per element of C. Wrong results for the verification's tests: IGNORE_BETA 1 (right
// only for beta = 0) and the kernel `nothing` (writes no output).
#if MODE == 3
#error planted compile error
#endif
#ifndef IGNORE_BETA
#define IGNORE_BETA 0
#endif
extern "C" __global__ void k(int M, int N, int K, float alpha, const float* A, int lda,
                             const float* B, int ldb, float beta, float* C, int ldc,
                             float* workspace, const float* bias, long long stride_a, long long stride_b,
                             long long stride_c, int splits, int raster) {
#if MODE == 1
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        volatile float* nowhere = (volatile float*)(0x10);
        *nowhere = 1.0f;
    }
#elif MODE == 2
    // Spin on a global load the compiler must keep: the inputs are finite, so this never ends
    // (a volatile local is not enough: ptxas folds it away).
    volatile const float* watched = A;
    while (watched[0] == watched[0] || clock64() > 0) {}
#endif
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)M * N) return;
    int row = (int)(idx / N), col = (int)(idx % N);
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) acc += A[(long long)row * lda + i] * B[(long long)i * ldb + col];
    float* c = C + (long long)row * ldc + col;
    *c = IGNORE_BETA || beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
}
extern "C" __global__ void nothing(int M, int N, int K, float alpha, const float* A, int lda,
                                   const float* B, int ldb, float beta, float* C, int ldc,
                                   float* workspace, const float* bias, long long stride_a,
                                   long long stride_b, long long stride_c, int splits, int raster) {}
"""

PLANTED_OK, PLANTED_ILLEGAL_ADDRESS, PLANTED_INFINITE_LOOP, PLANTED_COMPILE_ERROR = 0, 1, 2, 3


class PlantedFamily(kernels.Family):
    """A kernel family whose MODE parameter plants a fault: for testing the tuner's fault
    handling end to end (real NVRTC; on a GPU, a real illegal address and a real hang)."""

    name = "planted"
    rung = 99
    description = ("test family: correct (MODE 0), illegal address (1), infinite loop (2), "
                   "compile error (3)")
    source_file = ""
    params = (kernels.Param("MODE", (PLANTED_OK, PLANTED_ILLEGAL_ADDRESS, PLANTED_INFINITE_LOOP,
                                     PLANTED_COMPILE_ERROR),
                            "0 correct, 1 illegal address, 2 infinite loop, 3 compile error"),)
    kernel_name = "k"
    threads_per_block = 256

    @property
    def source(self) -> str:
        return _PLANTED_SOURCE

    def threads(self, c: Any) -> int:
        return self.threads_per_block

    def launches(self, c: Any, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> list:
        self.validate(c)
        blocks = -(-(m * n) // self.threads_per_block)
        return [kernels.Launch(self.kernel_name, (blocks, 1, 1), (self.threads_per_block, 1, 1), 0)]
