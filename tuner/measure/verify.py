"""Verification on the GPU: ``kernels.reference.relative_error`` of a kernel's C against
alpha*ref + beta*C0, reduced on the device in float64 so that only three numbers come back.

The float64 reference and C0 stay on the device for the whole problem; per check, one small
reduction kernel (compiled once per process with NVRTC) and one 24-byte download replace the
host's download of C and its NumPy pass, during which the GPU used to idle.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from kernels.compiler import compile_program

THREADS = 256       # per block; a multiple of 32 (the reduction goes warp by warp)
MAX_BLOCKS = 1024   # enough to fill any GPU; each thread strides through the rest
NAN_BITS = 0x7FC00000  # float32 quiet NaN: the poison a kernel must overwrite

SOURCE = r"""
// sums[0] += sum (out - e)^2 over finite out, sums[1] += sum e^2, sums[2] += count of non-finite
// out, where e = alpha*ref + beta*c0 in float64 (c0 is not read when beta == 0).
extern "C" __global__ void verify_sums(const float* __restrict__ out, const double* __restrict__ ref,
                                       const float* __restrict__ c0, double alpha, double beta,
                                       long long count, double* __restrict__ sums) {
    double diff2 = 0.0, ref2 = 0.0, bad = 0.0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        // _rn intrinsics: no fused multiply-add, so e rounds as NumPy's alpha*ref + beta*c0 does
        double e = __dmul_rn(alpha, ref[i]);
        if (beta != 0.0) e = __dadd_rn(e, __dmul_rn(beta, (double)c0[i]));
        float o = out[i];
        if ((__float_as_uint(o) & 0x7f800000u) == 0x7f800000u) {  // NaN or Inf
            bad += 1.0;
        } else {
            double d = (double)o - e;
            diff2 += d * d;
        }
        ref2 += e * e;
    }
    for (int s = 16; s > 0; s >>= 1) {
        diff2 += __shfl_down_sync(0xffffffffu, diff2, s);
        ref2 += __shfl_down_sync(0xffffffffu, ref2, s);
        bad += __shfl_down_sync(0xffffffffu, bad, s);
    }
    __shared__ double part[3][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { part[0][warp] = diff2; part[1][warp] = ref2; part[2][warp] = bad; }
    __syncthreads();
    if (warp != 0) return;
    bool mine = lane < (int)(blockDim.x >> 5);
    diff2 = mine ? part[0][lane] : 0.0;
    ref2 = mine ? part[1][lane] : 0.0;
    bad = mine ? part[2][lane] : 0.0;
    for (int s = 16; s > 0; s >>= 1) {
        diff2 += __shfl_down_sync(0xffffffffu, diff2, s);
        ref2 += __shfl_down_sync(0xffffffffu, ref2, s);
        bad += __shfl_down_sync(0xffffffffu, bad, s);
    }
    if (lane == 0) {  // double atomicAdd: sm_60 and newer
        atomicAdd(&sums[0], diff2);
        atomicAdd(&sums[1], ref2);
        atomicAdd(&sums[2], bad);
    }
}
"""
KERNEL = "verify_sums"
_PARAM_TYPES = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_double,
                ctypes.c_longlong, ctypes.c_void_p)


def compile_verify(arch: str) -> bytes:
    """The reduction's CUBIN for ``arch`` ("sm_90")."""
    return compile_program(SOURCE, arch, "verify.cu")[0]


def relative_from_sums(diff2: float, ref2: float, nonfinite: float) -> float:
    """``relative_error``'s rules over the device's sums: any NaN/Inf output gives inf; a zero
    reference gives the difference's norm; else ||out - ref|| / ||ref||."""
    if nonfinite:
        return math.inf
    diff, denom = math.sqrt(diff2), math.sqrt(ref2)
    return diff / denom if denom > 0 else diff


class DeviceCheck:
    """The loaded reduction and its 3-double result buffer, in the current context, for the
    process's life (as GpuBench's stream and events)."""

    def __init__(self, arch: str):
        from cuda.bindings import driver

        from kernels.runtime import check

        self.module = check(driver.cuModuleLoadData(compile_verify(arch)), "cuModuleLoadData(verify)")
        self.function = check(driver.cuModuleGetFunction(self.module, KERNEL.encode()),
                              f"cuModuleGetFunction({KERNEL})")
        self.sums = int(check(driver.cuMemAlloc(3 * 8), "cuMemAlloc(verify sums)"))
        self.host = np.zeros(3, np.float64)

    def relative_error(self, out: int, ref: int, c0: int, alpha: float, beta: float, count: int,
                       stream: Any) -> float:
        """relative_error(out, alpha*ref + beta*c0) over ``count`` elements of the device arrays
        (out, c0: float32; ref: float64), queued on ``stream`` after whatever wrote ``out``;
        waits for the stream once, for the 24-byte result."""
        from cuda.bindings import driver

        from kernels.runtime import check

        check(driver.cuMemsetD32Async(self.sums, 0, 6, stream), "cuMemsetD32Async(verify sums)")
        blocks = max(1, min(MAX_BLOCKS, -(-count // THREADS)))
        args = (out, ref, c0, alpha, beta, count, self.sums)
        check(driver.cuLaunchKernel(self.function, blocks, 1, 1, THREADS, 1, 1, 0, stream,
                                    (args, _PARAM_TYPES), 0), f"cuLaunchKernel({KERNEL})")
        check(driver.cuMemcpyDtoHAsync(self.host.ctypes.data, self.sums, self.host.nbytes, stream),
              "cuMemcpyDtoHAsync(verify sums)")
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return relative_from_sums(*map(float, self.host))

