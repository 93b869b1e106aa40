"""Rung 11: Hopper-native 3xTF32 — wgmma from TMA-fed shared memory, warp-specialized (sm_90a)."""
import dataclasses

from kernels.families.blocktile2d import RASTER
from kernels.families.hopper import CONSUMER_REGS, SPLITK, STAGES, WGS, HopperFamily
from kernels.layout import transposed
from kernels.space import Config, Constraint, Launch, Param, TensorMap, div_up

PACK_THREADS = 256
PACK_MAX_BLOCKS = 4096
REGS_BESIDE_TILES = 32  # addresses, loop state and descriptors, beside accumulators and fragments


def round64(x: int) -> int:
    return div_up(x, 64) * 64


def padded(x: int) -> int:
    """K (or N) rounded up to 4 floats: rows of the packed copies are 16-byte aligned for TMA."""
    return div_up(x, 4) * 4


def stage_bytes(c: Config) -> int:
    a = 2 * c["BM"] * c["BK"] * 4            # A's big and small parts
    b = c["BK"] * block_n(c) * 4             # B as read, split in registers
    return a + b


def block_n(c: Config) -> int:
    return 64 * c["MW"] * c["WGS"]


def consumer_registers(c: Config) -> int:
    """Accumulators (tensor-core partial + FP32 total) and one 32-deep slice of B fragments (big and small)."""
    return c["MW"] * (c["BM"] + 32) + REGS_BESIDE_TILES


# Workspace layout in floats, as wgmma.cu's ws_a_offset / ws_b_offset: split-K partials
# [batch][splits][M][N], A's parts [batch][2][M][Kp], B's aligned copy [batch][K][Np] (or
# [batch][N][Kp] for a transposed B).
def ws_a_offset(c: Config, m: int, n: int, batch: int = 1) -> int:
    return round64(batch * c["SPLITK"] * m * n) if c["SPLITK"] > 1 else 0


def ws_b_offset(c: Config, m: int, n: int, k: int, batch: int = 1) -> int:
    return ws_a_offset(c, m, n, batch) + round64(2 * batch * m * padded(k))


def b_copy_floats(layout: str, n: int, k: int) -> int:
    """One batch entry of B's aligned copy: its stored rows padded to 4 floats."""
    return n * padded(k) if transposed(layout)[1] else k * padded(n)


class Wgmma(HopperFamily):
    name = "wgmma"
    rung = 11
    description = ("Hopper path to FP32 accuracy: 3xTF32 on warpgroup MMAs (wgmma) fed by TMA through an "
                   "mbarrier ring; one producer and WGS consumer warpgroups (setmaxnreg); A pre-split into "
                   "big/small parts, B split in registers; optional split-K.")
    source_file = "wgmma.cu"
    precision = "fp32-tc"
    params = (
        Param("BM", (64, 96, 128), "rows of C per block (the wgmma N extent)"),
        Param("BK", (32, 64), "depth of a shared-memory stage (32-deep swizzle atoms)"),
        WGS,
        Param("MW", (1, 2), "64-column wgmma tiles per consumer warpgroup"),
        STAGES,
        # 4 only: 1 measured 20 % slower; 2 was never the fastest on any recorded shape or pack
        # entry, and sums K >= 4096 less accurately than cuBLAS FP32 in the accumulation model
        # (docs/kernels.md, "Accuracy: FLUSH and round-to-nearest splits").
        Param("FLUSH", (4,), "k-steps (8 deep) summed on the tensor core before each FP32 add",
              sums=True),
        SPLITK,
        RASTER,
        Param("ASPLIT", (0, 1), "A split by the pre-pass (0) or, where A is 16-byte aligned, in shared "
                                "memory by the producer warpgroup's idle warps (1)", before=0),
    )
    constraints = (
        Constraint("accumulators and fragments (MW*(BM+32) + 32 registers) must fit the consumer's "
                   "register budget after setmaxnreg (255 / 232 / 152 for 1 / 2 / 3 consumer warpgroups)",
                   lambda c: consumer_registers(c) <= CONSUMER_REGS[c["WGS"]]),
    )

    # Fastest measured on the H100, one per shape class: 4096³ and 2048³, 8192³, 1024³, odd
    # sizes (1023x1025x999), 128-row, 16-row, small-MN/long-K, and small N (16384x128x1024,
    # where splitting A in the kernel wins: 1.54x against 0.79x); docs/kernels.md, "wgmma
    # starting points".
    starting_points = tuple(
        dict(zip(("BM", "BK", "WGS", "MW", "STAGES", "FLUSH", "SPLITK", "RASTER", "ASPLIT"), values))
        for values in ((128, 64, 2, 1, 2, 4, 1, 8, 0), (96, 32, 2, 1, 3, 4, 1, 8, 0), (96, 64, 2, 1, 2, 4, 1, 8, 0),
                       (64, 64, 2, 1, 2, 4, 1, 8, 0), (64, 32, 3, 1, 3, 4, 1, 8, 0), (128, 32, 2, 1, 4, 4, 4, 8, 0),
                       (64, 32, 2, 1, 3, 4, 4, 8, 0), (64, 32, 2, 1, 6, 4, 16, 4, 1), (128, 64, 2, 1, 2, 4, 1, 8, 1))
    )

    def stage_bytes(self, c: Config) -> int:
        return stage_bytes(c)

    def shared_bytes(self, c: Config) -> int:
        # ASPLIT: a third mbarrier per stage, A split in shared memory (wgmma.cu's SPLIT_DONE)
        return super().shared_bytes(c) + 8 * c["STAGES"] * c["ASPLIT"]

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], block_n(c)

    def launches(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> list[Launch]:
        gemm_launches = super().launches(c, m, n, k, layout, batch)
        ta, tb = transposed(layout)
        kp, np_ = padded(k), padded(n)
        # Every map is 3-D: its last coordinate picks the batch entry (2 * entry + part for A's
        # packed big/small parts).
        a_maps = TensorMap("workspace", dims=(kp, m, 2 * batch), box=(32, c["BM"], 1),
                           strides=(4 * kp, 4 * m * kp), offset=4 * ws_a_offset(c, m, n, batch))
        if c["ASPLIT"] and not ta:  # A in place where TMA can read it (the kernel splits it), else packed
            a_maps = TensorMap("a", dims=(k, m, batch), box=(32, c["BM"], 1), fallback=a_maps)
        b_offset = 4 * ws_b_offset(c, m, n, k, batch)
        if tb:  # B stored N x K: boxes of BN rows by 32 k
            b_copy = TensorMap("workspace", dims=(k, n, batch), box=(32, block_n(c), 1), strides=(4 * kp, 4 * n * kp),
                               offset=b_offset)
            b_map = TensorMap("b", dims=(k, n, batch), box=(32, block_n(c), 1), fallback=b_copy)
        else:  # B stored K x N: boxes of BK rows by 32 columns
            b_copy = TensorMap("workspace", dims=(n, k, batch), box=(32, c["BK"], 1), strides=(4 * np_, 4 * k * np_),
                               offset=b_offset)
            b_map = TensorMap("b", dims=(n, k, batch), box=(32, c["BK"], 1), fallback=b_copy)
        main = dataclasses.replace(gemm_launches[0], tensor_maps=(a_maps, b_map))
        work = max(m * kp, b_copy_floats(layout, n, k)) // 4  # quads
        # one batch entry per blockIdx.y; the pre-pass finds A's workspace slot past the partials
        # With A split in the kernel, the pre-pass only copies what TMA cannot read in place; a
        # call with both operands aligned skips it (docs/kernels.md, "wgmma's pre-pass")
        pack = Launch("gemm_pack", (min(div_up(work, PACK_THREADS), PACK_MAX_BLOCKS), batch, 1),
                      (PACK_THREADS, 1, 1), 0, follows=self.follows_previous,
                      only_for_fallbacks=bool(c["ASPLIT"]) and not ta, **self.launch_values(c))
        return [pack, main, *gemm_launches[1:]]

    def workspace_bytes(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> int:
        return 4 * (ws_b_offset(c, m, n, k, batch) + batch * b_copy_floats(layout, n, k))
