"""In-process GPU measurement: verify a CUBIN against a float64 reference, then time it.

Runs inside the tuner's GPU child process. Family-agnostic: the parent ships a CUBIN and the
launch list; everything here is driver API calls, cuBLAS (through ctypes), NumPy and the
verification's reduction kernel (tuner/measure/verify.py), so the comparison runs on the GPU.
"""
from __future__ import annotations

import ctypes
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from kernels import Launch, nvrtc_version
from kernels.layout import stored_shapes, transposed
from kernels.reference import tolerance
from kernels.runtime import CudaError, LoadedKernel, check, device_arch, use_device
from tuner.measure.hold import StreamHold
from tuner.measure.verify import NAN_BITS, DeviceCheck

L2_FLUSH_FACTOR = 3          # rotate through enough input sets to cover 3x the L2
MAX_INPUT_SETS = 16
TIMING_TARGET_S = 0.08       # timed kernel time per candidate
MIN_REPS, MAX_REPS = 15, 400
HOLD_CHUNK = 64              # timed calls queued behind one hold: well within the driver's launch queue
MAX_HOLD_RETRIES = 8         # rounds timed again after a hold gave up, per process
HEAD_START = 4               # calls queued before the release where the host outpaces the GPU
VERIFY_ALPHA_BETA = ((1.25, 0.0), (0.75, -0.5))   # beta = 0 with C poisoned; then a general update


def calls_ahead(queue_s_per_call: float, gpu_s_per_call: float) -> int:
    """How many calls of a timing round to queue before releasing its hold: where the host
    queues a call in under half the time the GPU runs it, a head start of HEAD_START calls keeps
    the host ahead for the rest of the round, and the GPU idles only while those are queued;
    otherwise the whole round, HOLD_CHUNK calls at a time."""
    return HEAD_START if queue_s_per_call < 0.5 * gpu_s_per_call else HOLD_CHUNK


class GpuFault(RuntimeError):
    """A sticky CUDA error: this process's context is dead and the process must be replaced."""


def probe() -> str | None:
    """None if a CUDA driver and GPU are usable here, else the reason they are not."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return f"cuda-python is not installed ({e})"
    try:
        err, = driver.cuInit(0)
    except Exception as e:  # the bindings raise when libcuda.so itself cannot be loaded
        return f"no CUDA driver library: {e}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"no usable CUDA driver or GPU (cuInit: {getattr(err, 'name', err)})"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "the CUDA driver reports no GPU"
    return None


def device_count() -> int:
    """How many GPUs the driver sees (after ``probe`` found it usable)."""
    from cuda.bindings import driver

    err, count = driver.cuDeviceGetCount()
    return count if err == driver.CUresult.CUDA_SUCCESS else 0


# ---- cuBLAS through ctypes (the GPU host ships it; kept out of the core dependencies) --------
CUDA_R_32F, CUDA_R_64F = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_GEMM_DEFAULT = 0, 1, -1


def _load_cublas() -> ctypes.CDLL:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:
        pass
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("cuBLAS not found: install the 'gpu' extra (nvidia-cublas) for the baseline")


class Cublas:
    def __init__(self, stream: int):
        self.lib = _load_cublas()
        self.handle = ctypes.c_void_p()
        self._ok(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self._ok(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream")

    @staticmethod
    def _ok(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def gemm(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
             double: bool = False, layout: str = "nn", batch: int = 1) -> None:
        """Row-major C = alpha*op(A)*op(B) + beta*C for dense operands stored as ``layout``
        says (kernels/layout.py), a strided batch of ``batch``; computed as column-major
        C^T = op(B)^T op(A)^T (a row-major stored operand is its transpose, column-major).
        FP32 uses CUBLAS_COMPUTE_32F: no TF32."""
        scalar = ctypes.c_double if double else ctypes.c_float
        dtype, compute = (CUDA_R_64F, CUBLAS_COMPUTE_64F) if double else (CUDA_R_32F, CUBLAS_COMPUTE_32F)
        al, be = scalar(alpha), scalar(beta)
        ta, tb = transposed(layout)
        (ra, ca), (rb, cb) = stored_shapes(layout, m, n, k)
        op_b, op_a = (CUBLAS_OP_T if tb else CUBLAS_OP_N), (CUBLAS_OP_T if ta else CUBLAS_OP_N)
        if batch == 1:
            self._ok(self.lib.cublasGemmEx(
                self.handle, op_b, op_a, n, m, k, ctypes.byref(al),
                ctypes.c_void_p(b), dtype, cb, ctypes.c_void_p(a), dtype, ca, ctypes.byref(be),
                ctypes.c_void_p(c), dtype, n, compute, CUBLAS_GEMM_DEFAULT), "cublasGemmEx")
            return
        self._ok(self.lib.cublasGemmStridedBatchedEx(
            self.handle, op_b, op_a, n, m, k, ctypes.byref(al),
            ctypes.c_void_p(b), dtype, cb, ctypes.c_longlong(rb * cb), ctypes.c_void_p(a), dtype, ca,
            ctypes.c_longlong(ra * ca), ctypes.byref(be), ctypes.c_void_p(c), dtype, n, ctypes.c_longlong(m * n),
            batch, compute, CUBLAS_GEMM_DEFAULT), "cublasGemmStridedBatchedEx")


# ---- SM clock through NVML, when the host has it ------------------------------------------------
class SmClock:
    def __init__(self, device: int):
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        except Exception:
            self.nvml = None

    def mhz(self) -> int | None:
        if self.handle is None:
            return None
        try:
            return int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        except Exception:
            return None

    def driver_version(self) -> str | None:
        if self.handle is None:
            return None
        v = self.nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v


@dataclass
class Timing:
    times_ms: list[float]
    sm_clock_mhz: int | None
    warm_ms: list[float] | None = None  # the warm-up launches (timed too, not reported)

    def summary(self, flops: int) -> dict:
        med = statistics.median(self.times_ms)
        return {"time_min_ms": min(self.times_ms), "time_median_ms": med, "time_max_ms": max(self.times_ms),
                "launches": len(self.times_ms), "gflops": flops / (med * 1e-3) / 1e9,
                "sm_clock_mhz": self.sm_clock_mhz}


class DeviceBuffer:
    def __init__(self, nbytes: int):
        from cuda.bindings import driver

        self.nbytes = nbytes
        self.ptr = int(check(driver.cuMemAlloc(max(nbytes, 4)), f"cuMemAlloc({nbytes})"))

    def upload(self, host: np.ndarray) -> None:
        from cuda.bindings import driver

        host = np.ascontiguousarray(host)
        check(driver.cuMemcpyHtoD(self.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def download(self, host: np.ndarray) -> np.ndarray:
        from cuda.bindings import driver

        check(driver.cuMemcpyDtoH(host.ctypes.data, self.ptr, host.nbytes), "cuMemcpyDtoH")
        return host

    def free(self) -> None:
        from cuda.bindings import driver

        if self.ptr:
            driver.cuMemFree(self.ptr)
            self.ptr = 0


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Inputs uniform in [-1, 1), drawn as float32: drawn as float64 and converted, a 4096³
    problem's took 0.9 s of the GPU child (2-core machine) while the GPU waited at its shape
    change (docs/measurement.md, "Shape changes"); 0.05 s so."""
    values = rng.random(shape, dtype=np.float32)
    values *= 2
    values -= 1
    return values


class GpuBench:
    """One per GPU child process. set_problem, then baseline/evaluate any number of candidates."""

    def __init__(self, device: int = 0):
        from cuda.bindings import driver

        reason = probe()
        if reason:
            raise RuntimeError(reason)
        self.device = device
        use_device(device)
        self.stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
        # one (start, stop) pair per launch of a timing round: no launch waits for the host
        self.events = [tuple(check(driver.cuEventCreate(0), "cuEventCreate") for _ in range(2))
                       for _ in range(MAX_REPS)]
        self.clock = SmClock(device)
        self.cublas = Cublas(int(self.stream))
        self.verifier = DeviceCheck(self.arch())
        self.holder = StreamHold(self.arch())
        self._queue_s_per_call = 0.0  # the host's time to queue one timed call, last round (_timed)
        self.sets: list[tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer]] = []
        # set 0's float64 A*B and C0, resident for the problem: verification reads them on the GPU
        self.ref: DeviceBuffer | None = None
        self.c0: DeviceBuffer | None = None
        self.problem: tuple[int, int, int] | None = None
        self.layout, self.batch = "nn", 1

    # ---- identity ---------------------------------------------------------------------------
    def arch(self) -> str:
        return device_arch(self.device)

    def info(self) -> dict:
        from cuda.bindings import driver

        attr = driver.CUdevice_attribute
        dev = self.device

        def get(a):
            return check(driver.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")

        name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
        uuid = check(driver.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes
        h = bytes(uuid).hex()
        cuda = check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
        return {
            "name": name.split(b"\0")[0].decode(),
            "uuid": f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}",
            "compute_capability": f"{get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)}."
                                  f"{get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)}",
            "sm_count": get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            "memory_bytes": int(check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
            "max_sm_clock_mhz": get(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) // 1000,
            "driver_version": self.clock.driver_version() or _driver_version_from_proc(),
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "nvrtc_version": nvrtc_version(),
        }

    def l2_bytes(self) -> int:
        from cuda.bindings import driver

        return check(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
                                                 self.device), "L2 size")

    # ---- problem ----------------------------------------------------------------------------
    def set_problem(self, m: int, n: int, k: int, seed: int = 0, layout: str = "nn", batch: int = 1) -> None:
        """Random inputs in rotating sets (so small problems are not timed out of L2) and the
        float64 reference of set 0, computed by cuBLAS DGEMM on the GPU. A and B are stored
        as ``layout`` says, densely, ``batch`` of each (kernels/layout.py)."""
        self._free()
        rng = np.random.default_rng(seed)
        (ra, ca), (rb, cb) = stored_shapes(layout, m, n, k)
        a_shape, b_shape, c_shape = (batch, ra, ca), (batch, rb, cb), (batch, m, n)
        set_bytes = 4 * batch * (m * k + k * n + m * n)
        count = max(1, min(MAX_INPUT_SETS, math.ceil(L2_FLUSH_FACTOR * self.l2_bytes() / set_bytes)))
        host_a, host_b = _uniform(rng, a_shape), _uniform(rng, b_shape)
        self.c0 = DeviceBuffer(4 * batch * m * n)
        self.c0.upload(_uniform(rng, c_shape))
        for i in range(count):
            a, b, c = DeviceBuffer(host_a.nbytes), DeviceBuffer(host_b.nbytes), DeviceBuffer(4 * batch * m * n)
            if i == 0:
                a.upload(host_a)
                b.upload(host_b)
            else:
                a.upload(_uniform(rng, a_shape))
                b.upload(_uniform(rng, b_shape))
            self.sets.append((a, b, c))
        self.layout, self.batch = layout, batch
        self.ref = self._reference(m, n, k, host_a, host_b)
        self.problem = (m, n, k)

    def operands(self) -> tuple[int, int, int, tuple[int, int, int]]:
        """lda, ldb, ldc and the batch strides of the problem's dense operands."""
        m, n, k = self._need_problem()
        (ra, ca), (rb, cb) = stored_shapes(self.layout, m, n, k)
        strides = (ra * ca, rb * cb, m * n) if self.batch > 1 else (0, 0, 0)
        return ca, cb, n, strides

    def _reference(self, m: int, n: int, k: int, host_a: np.ndarray, host_b: np.ndarray) -> DeviceBuffer:
        """float64 op(A)*op(B) on the device (kept there: verification reads it on every candidate)."""
        a64, b64, c64 = (DeviceBuffer(8 * host_a.size), DeviceBuffer(8 * host_b.size),
                         DeviceBuffer(8 * self.batch * m * n))
        try:
            a64.upload(host_a.astype(np.float64))
            b64.upload(host_b.astype(np.float64))
            self.cublas.gemm(m, n, k, 1.0, a64.ptr, b64.ptr, 0.0, c64.ptr, double=True, layout=self.layout,
                             batch=self.batch)
            self._sync()
            return c64
        except BaseException:
            c64.free()
            raise
        finally:
            a64.free()
            b64.free()

    def _free(self) -> None:
        for buf in [b for s in self.sets for b in s] + [self.ref, self.c0]:
            if buf is not None:
                buf.free()
        self.sets, self.ref, self.c0 = [], None, None

    def _sync(self) -> None:
        from cuda.bindings import driver

        try:
            check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        except CudaError as e:
            if e.sticky:
                raise GpuFault(str(e)) from e
            raise

    # ---- timing -----------------------------------------------------------------------------
    def _time(self, run: Callable[[tuple[DeviceBuffer, ...]], None]) -> Timing:
        """Median-ready per-launch times with CUDA events; input sets rotate between launches."""
        # One call outside any hold first: a call's first launch of a kernel may load it (lazy
        # module loading), and loading waits for the device, which a hold keeps busy until the
        # host releases it: the two would wait for each other until the hold gives up.
        run(self.sets[0])
        warm = self._timed(run, 3, ahead=3)  # waited for: they decide how many launches to time
        reps = int(min(MAX_REPS, max(MIN_REPS, TIMING_TARGET_S / max(min(warm) * 1e-3, 1e-6))))
        times = self._timed(run, reps, ahead=calls_ahead(self._queue_s_per_call, min(warm) * 1e-3))
        return Timing(times, self.clock.mhz(), warm)

    def _timed(self, run: Callable[[tuple[DeviceBuffer, ...]], None], count: int, ahead: int) -> list[float]:
        """``count`` launches queued back to back, each alone between its own pair of events,
        then one wait: the host's round trip no longer separates the launches. They queue
        behind a hold, released once ``ahead`` calls are queued (``calls_ahead``; then every
        HOLD_CHUNK calls behind a hold of their own where ``ahead`` is HOLD_CHUNK), so the GPU
        runs them at its own pace, not at the pace the host queues them (tuner/measure/hold.py).
        Sets ``_queue_s_per_call``: the host's seconds to queue one."""
        from cuda.bindings import driver

        pairs = self.events[:count]
        first_hold = self.holder.target + 1
        every_chunk = ahead >= HOLD_CHUNK
        began = time.perf_counter()
        for i, (start, stop) in enumerate(pairs):
            if i == 0 or (every_chunk and i % HOLD_CHUNK == 0):
                self.holder.hold(self.stream)
            check(driver.cuEventRecord(start, self.stream), "cuEventRecord")
            run(self.sets[i % len(self.sets)])
            check(driver.cuEventRecord(stop, self.stream), "cuEventRecord")
            queued = i + 1
            if queued == count or queued == ahead or (every_chunk and queued % HOLD_CHUNK == 0):
                self.holder.release()
        self._queue_s_per_call = (time.perf_counter() - began) / count
        check(driver.cuEventSynchronize(pairs[-1][1]), "cuEventSynchronize")
        if self.holder.gave_up() >= first_hold:  # timed at the host's pace somewhere: once more
            self.holder.retries += 1
            if self.holder.retries <= MAX_HOLD_RETRIES:
                return self._timed(run, count, ahead)
        return [float(check(driver.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))
                for start, stop in pairs]

    def baseline(self) -> dict:
        m, n, k = self._need_problem()
        timing = self._time(lambda s: self.cublas.gemm(m, n, k, 1.0, s[0].ptr, s[1].ptr, 0.0, s[2].ptr,
                                                       layout=self.layout, batch=self.batch))
        return {"library": "cublas", **timing.summary(2 * m * n * k * self.batch)}

    # ---- candidates -------------------------------------------------------------------------
    def evaluate(self, cubin: bytes, launches: Sequence[Launch], workspace_bytes: int, flops: int) -> dict:
        m, n, k = self._need_problem()
        # Wall seconds per phase and the kernel time run (bench/throughput.py's accounting):
        # perf_counter reads outside the event-timed region, so the timing itself is unchanged.
        phases = {"load": 0.0, "verify": 0.0, "time": 0.0}
        result: dict[str, Any] = {"state": "ok", "error": None, "rel_error": None,
                                  "phases": phases, "kernel_s": 0.0}
        kernel = workspace = None
        mark = time.perf_counter()
        try:
            try:
                kernel = LoadedKernel(cubin, launches)
                workspace = DeviceBuffer(workspace_bytes) if workspace_bytes else None
            except CudaError as e:
                return self._launch_error(result, e)
            phases["load"], mark = time.perf_counter() - mark, time.perf_counter()
            ws = workspace.ptr if workspace else 0
            lda, ldb, ldc, strides = self.operands()
            worst = 0.0
            a, b, c = self.sets[0]
            for alpha, beta in VERIFY_ALPHA_BETA:
                self._reset_c(beta)
                try:
                    kernel.launch(m, n, k, alpha, a.ptr, lda, b.ptr, ldb, beta, c.ptr, ldc, ws, self.stream,
                                  strides=strides)
                except CudaError as e:
                    return self._launch_error(result, e)
                worst = max(worst, self._device_error(alpha, beta))
            result["rel_error"] = worst
            phases["verify"], mark = time.perf_counter() - mark, time.perf_counter()
            if not worst <= tolerance(k):
                result.update(state="wrong_result",
                              error=f"relative error {worst:.3g} exceeds {tolerance(k):.3g} (K={k})")
                return result
            timing = self._time(lambda s: kernel.launch(m, n, k, 1.0, s[0].ptr, lda, s[1].ptr, ldb, 0.0,
                                                         s[2].ptr, ldc, ws, self.stream, strides=strides))
            phases["time"] = time.perf_counter() - mark
            result.update(timing.summary(flops))
            # every event-timed launch (warm-up included) plus the verification launches, taken
            # at the median: the GPU's kernel time for this candidate
            timed_ms = sum(timing.times_ms) + sum(timing.warm_ms or [])
            verify_ms = len(VERIFY_ALPHA_BETA) * result["time_median_ms"]
            result["kernel_s"] = (timed_ms + verify_ms) / 1e3
            return result
        except CudaError as e:
            if e.sticky:
                raise GpuFault(str(e)) from e
            return self._launch_error(result, e)
        finally:
            if workspace:
                workspace.free()
            if kernel:
                kernel.unload()

    # ---- verification (on the device: the GPU does not wait on a host comparison) -----------
    def _reset_c(self, beta: float) -> None:
        """Set 0's C before a verification launch: NaN for beta = 0 (so an unwritten or a read C
        shows), else C0."""
        from cuda.bindings import driver

        m, n, _ = self._need_problem()
        c = self.sets[0][2]
        if beta == 0.0:
            check(driver.cuMemsetD32Async(c.ptr, NAN_BITS, self.batch * m * n, self.stream), "cuMemsetD32Async(poison)")
        else:
            assert self.c0 is not None
            check(driver.cuMemcpyDtoDAsync(c.ptr, self.c0.ptr, 4 * self.batch * m * n, self.stream),
                  "cuMemcpyDtoDAsync(C0)")

    def _device_error(self, alpha: float, beta: float) -> float:
        """relative_error(set 0's C, alpha*A*B + beta*C0) once the launches queued before it ran."""
        m, n, _ = self._need_problem()
        assert self.ref is not None and self.c0 is not None  # set with the problem
        return self.verifier.relative_error(self.sets[0][2].ptr, self.ref.ptr, self.c0.ptr, alpha, beta,
                                            self.batch * m * n, self.stream)

    def _launch_error(self, result: dict, e: CudaError) -> dict:
        if e.sticky:
            raise GpuFault(str(e)) from e
        result.update(state="launch_error", error=str(e))
        return result

    def _need_problem(self) -> tuple[int, int, int]:
        if self.problem is None:
            raise RuntimeError("set_problem(m, n, k) first")
        return self.problem


def _driver_version_from_proc() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.readline().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    return os.environ.get("NVIDIA_DRIVER_VERSION")
