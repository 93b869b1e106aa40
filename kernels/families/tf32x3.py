"""Rung 9: 3xTF32 — FP32-accurate GEMM on TF32 tensor cores (mma.sync m16n8k8), with split-K."""
from kernels.families.blocktile2d import RASTER
from kernels.space import Config, Constraint, Family, Param

K_PAD, MN_PAD = 4, 8  # shared-memory row pads of tf32x3.cu (bank-conflict-free fragment reads)


def tile_floats(rows: int, bk: int) -> int:
    """A stage's tile of A (rows = BM) or B (rows = BN) in either orientation: tf32x3.cu keeps
    the larger, so a config needs the same shared memory in every layout."""
    return max(rows * (bk + K_PAD), bk * (rows + MN_PAD))


def warps(c: Config) -> int:
    return (c["BM"] // c["WM"]) * (c["BN"] // c["WN"])


class Tf32x3(Family):
    name = "tf32x3"
    rung = 9
    precision = "fp32-tc"
    description = ("Tensor cores at FP32 accuracy: each operand split into a TF32 part and its "
                   "remainder, three mma.sync per product; cp.async ring; optional split-K.")
    source_file = "tf32x3.cu"
    params = (
        # 96 and 192 let a tile grid fit the SM count where powers of two leave a nearly empty
        # last wave (1023x1025 in 64x64 tiles is 272 blocks for 264 slots).
        Param("BM", (16, 32, 64, 96, 128, 192, 256), "block tile rows"),
        Param("BN", (32, 64, 96, 128, 192, 256), "block tile columns"),
        Param("BK", (8, 16, 32), "depth of a shared-memory slice"),
        Param("WM", (16, 32, 48, 64, 128), "warp tile rows (16-row mma tiles)"),
        Param("WN", (16, 32, 48, 64, 128), "warp tile columns (8-column mma tiles)"),
        Param("KGROUP", (1, 2, 4),
              "k-steps (8 deep) summed on the tensor core before each FP32 add", sums=True),
        Param("STAGES", (2, 3, 4), "shared-memory slices in flight (cp.async ring depth)"),
        Param("SPLITK", (1, 2, 4, 8, 16), "slices of K (blockIdx.z), reduced by a second kernel", launch_time=True,
              sums=True),
        RASTER,
    )
    constraints = (
        Constraint("BM must be a multiple of WM", lambda c: c["BM"] % c["WM"] == 0),
        Constraint("BN must be a multiple of WN", lambda c: c["BN"] % c["WN"] == 0),
        Constraint("a group of KGROUP k-steps (8*KGROUP) must divide BK",
                   lambda c: c["BK"] % (8 * c["KGROUP"]) == 0),
        Constraint("warps per block ((BM/WM)*(BN/WN)) must be 1 to 16",
                   lambda c: 1 <= warps(c) <= 16),
        Constraint("accumulators per thread (WM*WN/32) must be at most 128",
                   lambda c: c["WM"] * c["WN"] // 32 <= 128),
    )

    # Fastest measured on the H100, one per shape class: large square, 1024³, odd sizes
    # (one-wave 96x96 grid), 128-row, 16-row and small-MN/long-K problems (docs/kernels.md,
    # "tf32x3 starting points").
    starting_points = tuple(
        dict(zip(("BM", "BN", "BK", "WM", "WN", "KGROUP", "STAGES", "SPLITK", "RASTER"), values))
        for values in ((128, 64, 32, 64, 32, 4, 2, 1, 1), (64, 64, 32, 32, 32, 4, 3, 1, 8),
                       (96, 96, 32, 48, 48, 4, 3, 1, 8), (128, 128, 32, 64, 32, 4, 2, 8, 1),
                       (16, 128, 32, 16, 32, 4, 4, 8, 1), (64, 32, 16, 32, 16, 2, 4, 16, 8))
    )

    def threads(self, c: Config) -> int:
        return 32 * warps(c)

    def shared_bytes(self, c: Config) -> int:
        return 4 * c["STAGES"] * (tile_floats(c["BM"], c["BK"]) + tile_floats(c["BN"], c["BK"]))

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], c["BN"]

    def splits(self, c: Config) -> int:
        return c["SPLITK"]
