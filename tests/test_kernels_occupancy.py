"""The occupancy calculator against hand-computed cases."""
import pytest

from kernels import occupancy


def test_1024_thread_blocks_fit_once_on_a_1536_thread_sm():
    occ = occupancy("sm_86", 1024, 32, 0)
    assert (occ.blocks_per_sm, occ.limiter) == (1, "threads")
    assert occ.fraction == pytest.approx(32 / 48)


def test_register_bound():
    # 128 regs/thread -> 4096 regs/warp; 16384 regs per sub-partition -> 4 warps each -> 16 warps
    occ = occupancy("sm_90", 256, 128, 0)
    assert (occ.blocks_per_sm, occ.active_warps, occ.limiter) == (2, 16, "registers")
    assert occ.fraction == 0.25


def test_register_allocation_rounds_to_256_per_warp():
    # 255 regs -> 8160 -> 8192 per warp -> 2 warps per sub-partition -> 8 warps -> one 8-warp block
    assert occupancy("sm_90", 256, 255, 0).blocks_per_sm == 1
    # 16 warps x 8192 registers exceed the 64K per block: the launch cannot run at all
    assert occupancy("sm_90", 512, 255, 0).blocks_per_sm == 0


def test_shared_memory_bound():
    # 100 KiB + 1 KiB reserved per block, 228 KiB per SM -> 2 blocks
    occ = occupancy("sm_90", 128, 32, 100 * 1024)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared")
    # same block on a 100 KiB SM (sm_86): 0 blocks... 101 KiB > 100 KiB
    assert occupancy("sm_86", 128, 32, 100 * 1024).blocks_per_sm == 0
    # granularity: 47 KiB + 1 KiB = 48 KiB -> 4 blocks in 228 KiB (not 4.75)
    assert occupancy("sm_90", 128, 32, 47 * 1024).blocks_per_sm == 4


def test_block_count_bound():
    occ = occupancy("sm_80", 32, 16, 0)
    assert (occ.blocks_per_sm, occ.limiter) == (32, "blocks")
    assert occ.fraction == 0.5


def test_unknown_arch_is_named():
    with pytest.raises(ValueError, match="sm_50"):
        occupancy("sm_50", 128, 32, 0)
