"""Theoretical occupancy from a kernel's resources and the GPU's limits, without a GPU.

Follows the allocation rules the driver uses (cudaOccMaxActiveBlocksPerMultiprocessor): registers
are allocated per warp in units of 256 and split over 4 sub-partitions; shared memory per block is
rounded up to 128 bytes plus a 1 KiB per-block reservation (sm_80+); warps and blocks per SM are
capped by the architecture.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class ArchLimits:
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int = 65536
    max_registers_per_block: int = 65536
    shared_per_sm: int = 0                 # bytes usable by blocks (the largest carveout)
    reserved_shared_per_block: int = 1024
    shared_granularity: int = 128
    register_unit: int = 256               # registers per warp are allocated in these units
    sub_partitions: int = 4
    warp_size: int = 32

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size


ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits(2048, 32, shared_per_sm=167936),   # A100: 164 KiB
    "sm_86": ArchLimits(1536, 16, shared_per_sm=102400),   # GA10x: 100 KiB
    "sm_89": ArchLimits(1536, 24, shared_per_sm=102400),   # Ada: 100 KiB
    "sm_90": ArchLimits(2048, 32, shared_per_sm=233472),   # H100/H200: 228 KiB
}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    active_warps: int
    max_warps: int
    limiter: str          # "threads", "blocks", "registers" or "shared"

    @property
    def fraction(self) -> float:
        return self.active_warps / self.max_warps


def limits_for(arch: str) -> ArchLimits:
    try:
        return ARCH_LIMITS[arch.rstrip("a")]
    except KeyError:
        raise ValueError(f"no occupancy limits for {arch!r}; known: {', '.join(ARCH_LIMITS)}") from None


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


# Pure in its arguments, and asked for the same few hundred of them again and again: the cost
# model's feature rows ask it twice per config, for 214,440 split-K configs per study.
@lru_cache(maxsize=4096)
def occupancy(arch: str, threads_per_block: int, registers_per_thread: int,
              shared_bytes_per_block: int) -> Occupancy:
    lim = limits_for(arch)
    if threads_per_block < 1 or threads_per_block > 1024:
        raise ValueError(f"threads per block must be in [1, 1024], got {threads_per_block}")
    warps = -(-threads_per_block // lim.warp_size)
    by_threads = lim.max_warps_per_sm // warps
    by_blocks = lim.max_blocks_per_sm

    regs_per_warp = _round_up(max(registers_per_thread, 1) * lim.warp_size, lim.register_unit)
    if regs_per_warp * _round_up(warps, lim.sub_partitions) > lim.max_registers_per_block:
        by_regs = 0
    else:
        warps_per_partition = (lim.registers_per_sm // lim.sub_partitions) // regs_per_warp
        by_regs = (warps_per_partition * lim.sub_partitions) // warps

    shared = _round_up(shared_bytes_per_block + lim.reserved_shared_per_block, lim.shared_granularity)
    by_shared = lim.shared_per_sm // shared if shared_bytes_per_block > 0 else by_blocks

    limits = {"threads": by_threads, "blocks": by_blocks, "registers": by_regs, "shared": by_shared}
    limiter = min(limits, key=lambda k: limits[k])
    blocks = max(0, limits[limiter])
    return Occupancy(blocks, blocks * warps, lim.max_warps_per_sm, limiter)


# Registers a tile kernel's thread holds beside its accumulators (fragments, addresses, loop
# state): ptxas' median on the tile families. The prior's register estimate and the FFMA ladder's
# blocked-sum constraint both count on it.
REGISTERS_BESIDE_OUTPUTS = 64


@lru_cache(maxsize=256)
def max_registers(arch: str, threads_per_block: int) -> int:
    """The most registers per thread with which one block of this many threads fits on an SM:
    what ptxas holds a kernel to under ``__launch_bounds__(threads)`` (every family declares
    it), spilling what does not fit. 64 for 1024 threads, 128 for 512, 255 from 256 down."""
    for registers in range(255, 0, -1):
        if occupancy(arch, threads_per_block, registers, 0).blocks_per_sm >= 1:
            return registers
    return 0
