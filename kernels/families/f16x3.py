"""Rung 12: FP32 accuracy from FP16 tensor cores — scaled hi/lo splits on wgmma, TF32 where FP16's range cannot hold a row (sm_90a)."""
import dataclasses

from kernels.families.blocktile2d import RASTER
from kernels.families.hopper import CONSUMER_REGS, SPLITK, STAGES, WGS, HopperFamily
from kernels.space import Config, Constraint, Launch, Param, TensorMap, div_up

THREADS = 256          # gemm_pack
SCALE_THREADS = 1024   # gemm_scale
PACK_MAX_BLOCKS = 4096
PACK_K = 64  # k per tile of gemm_pack (f16x3.cu)
REGS_BESIDE_TILES = 32  # descriptors, addresses and loop state
MAX_BOX_ROWS = 256      # a TMA box spans at most 256 rows


def round256(x: int) -> int:
    return div_up(x, 256) * 256


def padded(x: int, to: int) -> int:
    return div_up(x, to) * to


def block_m(c: Config) -> int:
    return 64 * c["MW"] * c["WGS"]


def stage_bytes(c: Config) -> int:
    """Hi and lo parts of A's and B's tiles: ATOMS rows of 128 bytes per tile row."""
    return 2 * c["ATOMS"] * (block_m(c) + c["BN"]) * 128


def consumer_registers(c: Config) -> int:
    """The tensor-core partial, the correction accumulator and the FP32 total, BN/2 each per tile."""
    return 3 * c["MW"] * c["BN"] // 2 + REGS_BESIDE_TILES


@dataclasses.dataclass(frozen=True)
class WorkspaceLayout:
    """Byte offsets, as f16x3.cu's workspace_layout."""
    flags: int
    amax: int
    bmax: int
    fits: int
    apack: int
    bpack: int
    end: int


def workspace_layout(c: Config, m: int, n: int, k: int, batch: int = 1) -> WorkspaceLayout:
    splits = c["SPLITK"]
    flags = round256(4 * batch * splits * m * n) if splits > 1 else 0
    amax = flags + round256(4 * batch)
    bmax = amax + round256(4 * batch * m)
    fits = bmax + round256(4 * batch * n)
    apack = fits + round256(4 * batch * (div_up(m, 32) + div_up(n, 32)))
    bpack = apack + round256(8 * batch * m * padded(k, 4))
    return WorkspaceLayout(flags, amax, bmax, fits, apack, bpack, bpack + round256(8 * batch * n * padded(k, 4)))


class F16x3(HopperFamily):
    name = "f16x3"
    rung = 12
    description = ("FP32 accuracy from FP16 tensor cores: each row of A and column of B scaled by a power of "
                   "two and split into FP16 hi + lo*2^-11, three products per product on wgmma (both "
                   "operands TMA-fed from shared memory), cross terms in an accumulator of their own; "
                   "3xTF32 in the same kernel where a row's range does not fit FP16, decided on the device.")
    source_file = "f16x3.cu"
    precision = "fp32-tc"
    params = (
        WGS,
        Param("MW", (1, 2), "64-row wgmma tiles per consumer warpgroup (BM = 64 * MW * WGS)"),
        Param("BN", (64, 96, 128), "columns of C per block (the wgmma N extent)"),
        Param("ATOMS", (1, 2), "128-byte rows per tile row and stage: 64 k each on the FP16 path, 32 on TF32"),
        STAGES,
        Param("FLUSH", (2, 4), "FP16 path: k-steps (16 deep) summed on the tensor core before each FP32 add "
              "(the TF32 path flushes every 4 k-steps of 8, as wgmma)",
              sums=True),
        SPLITK,
        RASTER,
    )
    constraints = (
        Constraint("the three accumulators (3*MW*BN/2 + 32 registers) must fit the consumer's register budget "
                   "after setmaxnreg (255 / 232 / 152 for 1 / 2 / 3 consumer warpgroups)",
                   lambda c: consumer_registers(c) <= CONSUMER_REGS[c["WGS"]]),
        Constraint(f"BM = 64*MW*WGS rows of A must fit one TMA box (at most {MAX_BOX_ROWS} rows)",
                   lambda c: block_m(c) <= MAX_BOX_ROWS),
    )
    starting_points = tuple(
        dict(zip(("WGS", "MW", "BN", "ATOMS", "STAGES", "FLUSH", "SPLITK", "RASTER"), values))
        for values in ((2, 1, 128, 1, 3, 4, 1, 8), (2, 1, 96, 1, 4, 4, 1, 8), (2, 1, 64, 1, 4, 4, 1, 8),
                       (1, 2, 64, 1, 4, 4, 1, 8), (2, 1, 128, 1, 3, 4, 4, 8))
    )

    def stage_bytes(self, c: Config) -> int:
        return stage_bytes(c)

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return block_m(c), c["BN"]

    def launches(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> list[Launch]:
        gemm_launches = super().launches(c, m, n, k, layout, batch)
        ws = workspace_layout(c, m, n, k, batch)
        k16, k32 = padded(k, 8), padded(k, 4)
        bm, bn = block_m(c), c["BN"]

        def parts(rows: int, box: int, offset: int) -> tuple[TensorMap, TensorMap]:
            """One operand's [batch][2][rows][Kp] parts: as FP16 (64 k per box row), as FP32 (32); the
            parts are 4 * rows * k32 bytes apart on both paths (entries on different paths do not overlap)."""
            return (TensorMap("workspace", dims=(k16, rows, 2 * batch), box=(64, box, 1),
                              strides=(2 * k16, 4 * rows * k32), offset=offset, element="f16"),
                    TensorMap("workspace", dims=(k32, rows, 2 * batch), box=(32, box, 1),
                              strides=(4 * k32, 4 * rows * k32), offset=offset))

        a16, a32 = parts(m, bm, ws.apack)
        b16, b32 = parts(n, bn, ws.bpack)
        main = dataclasses.replace(gemm_launches[0], tensor_maps=(a16, b16, a32, b32))
        values = self.launch_values(c)
        scale = Launch("gemm_scale", (div_up(m, 32) + div_up(n, 32), 1, batch), (SCALE_THREADS, 1, 1), 0,
                       follows=self.follows_previous, **values)
        tiles = div_up(max(m, n), 32) * div_up(k16, PACK_K)
        pack = Launch("gemm_pack", (min(tiles, PACK_MAX_BLOCKS), 2, batch), (THREADS, 1, 1), 0,
                      follows=self.follows_previous, **values)
        return [scale, pack, main, *gemm_launches[1:]]

    def workspace_bytes(self, c: Config, m: int, n: int, k: int, layout: str = "nn", batch: int = 1) -> int:
        return workspace_layout(c, m, n, k, batch).end
