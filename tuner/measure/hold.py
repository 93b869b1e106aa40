"""Timing free of the host's launch cost: a one-thread kernel holds the stream until every launch
of a timing round is queued behind it (nvbench's "blocking kernel").

Without it, launches queued back to back between their own events are timed at the host's pace
wherever the host takes longer to queue a call than the GPU takes to run it: a `wgmma` call
(three kernels through cuda-python) costs the host 24-52 µs against 29-40 µs on the GPU at
1024³ or 256×256×16384, so with the compile pool's processes busy the tuner timed those shapes
up to 1.4x slow, and ranked their configs by host time (docs/measurement.md, "Timing held
until the round is queued").

The release is a counter in pinned, device-mapped host memory that only grows: each hold waits
for its own number, so rounds never race on a reset. The kernel gives up after TIMEOUT_NS (its
number is then in the counter's second word) so that a host that fails between hold and
release, or a launch queue too short for a round, never leaves the GPU spinning. Nothing
launched behind a hold may be launched there for the first time: with lazy module loading
(CUDA's default) a kernel's first launch loads it, loading waits for the device, and the device
waits for the release.
"""
from __future__ import annotations

import ctypes
from typing import Any

from kernels.compiler import compile_program

KERNEL = "hold_stream"
TIMEOUT_NS = 2_000_000_000
SOURCE = r"""
// Spins (sleeping between reads) until flag[0] reaches `target` or `timeout_ns` has passed; on a
// timeout it writes `target` to flag[1].
extern "C" __global__ void hold_stream(volatile unsigned* flag, unsigned target, unsigned long long timeout_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (flag[0] < target) {
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) {
            flag[1] = target;
            return;
        }
    }
}
"""
_PARAM_TYPES = (ctypes.c_void_p, ctypes.c_uint, ctypes.c_ulonglong)


def compile_hold(arch: str) -> bytes:
    """The holding kernel's CUBIN for ``arch`` ("sm_90")."""
    return compile_program(SOURCE, arch, "hold.cu")[0]


class StreamHold:
    """The loaded kernel and its counter, in the current context, for the process's life."""

    def __init__(self, arch: str):
        from cuda.bindings import driver

        from kernels.runtime import check

        self.module = check(driver.cuModuleLoadData(compile_hold(arch)), "cuModuleLoadData(hold)")
        self.function = check(driver.cuModuleGetFunction(self.module, KERNEL.encode()),
                              f"cuModuleGetFunction({KERNEL})")
        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        self.host = int(check(driver.cuMemHostAlloc(8, flags), "cuMemHostAlloc(hold)"))
        self.device = int(check(driver.cuMemHostGetDevicePointer(self.host, 0), "cuMemHostGetDevicePointer(hold)"))
        self.counter = (ctypes.c_uint * 2).from_address(self.host)
        self.counter[0] = self.counter[1] = 0
        self.target = 0
        self.retries = 0  # rounds timed again because a hold gave up (GpuBench._timed)
        # its own first launch loads the kernel: done here, while nothing is held
        self.hold(0)
        self.release()
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def hold(self, stream: Any) -> None:
        """Queue a hold on ``stream``: what is queued after it waits for ``release``."""
        from cuda.bindings import driver

        from kernels.runtime import check

        self.target += 1
        check(driver.cuLaunchKernel(self.function, 1, 1, 1, 1, 1, 1, 0, stream,
                                    ((self.device, self.target, TIMEOUT_NS), _PARAM_TYPES), 0),
              f"cuLaunchKernel({KERNEL})")

    def release(self) -> None:
        """Let the last hold go (the GPU sees the write within microseconds)."""
        self.counter[0] = self.target

    def gave_up(self) -> int:
        """The number of the last hold that timed out before its release (0: none)."""
        return self.counter[1]
