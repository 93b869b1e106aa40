"""Rung 6: warptiling, block -> warp -> thread tiles as in CUTLASS."""
from kernels.families.blocked_sum import accumulators_fit
from kernels.families.blocktile2d import RASTER
from kernels.families.vectorized import PADA
from kernels.space import Config, Constraint, Family, Param

WARP_PARAMS = (
    Param("BM", (32, 64, 128, 256), "block tile rows"),
    Param("BN", (32, 64, 128, 256), "block tile columns"),
    Param("BK", (8, 16, 32), "depth of a shared-memory slice"),
    Param("WM", (16, 32, 64, 128), "warp tile rows"),
    Param("WN", (16, 32, 64, 128), "warp tile columns"),
    Param("WNITER", (1, 2, 4), "sub-tiles per warp along N (WMITER follows from the rest)"),
    Param("TM", (4, 8), "thread tile rows per sub-tile"),
    Param("TN", (4, 8), "thread tile columns per sub-tile"),
    Param("THREADS", (64, 128, 256, 512), "threads per block = 32 * (BM/WM) * (BN/WN)"),
    PADA,
    RASTER,
)


def wmiter(c: Config) -> float:
    return c["WM"] * c["WN"] / (32 * c["TM"] * c["TN"] * c["WNITER"])


def _lanes_cover_subtile(c: Config) -> bool:
    mi = wmiter(c)
    if mi < 1 or mi != int(mi) or c["WM"] % int(mi) or c["WN"] % c["WNITER"]:
        return False
    sub_m, sub_n = c["WM"] // int(mi), c["WN"] // c["WNITER"]
    return sub_m % c["TM"] == 0 and sub_n % c["TN"] == 0 and (sub_m // c["TM"]) * (sub_n // c["TN"]) == 32


WARP_CONSTRAINTS = (
    Constraint("BM must be a multiple of WM", lambda c: c["BM"] % c["WM"] == 0),
    Constraint("BN must be a multiple of WN", lambda c: c["BN"] % c["WN"] == 0),
    Constraint("THREADS must equal 32 * (BM/WM) * (BN/WN) (one warp per warp tile)",
               lambda c: c["THREADS"] == 32 * (c["BM"] // c["WM"]) * (c["BN"] // c["WN"])),
    Constraint("the warp tile must split into WMITER x WNITER sub-tiles whose TM x TN patches "
               "cover exactly 32 lanes", _lanes_cover_subtile),
    accumulators_fit("WM*WN/32", lambda c: c["WM"] * c["WN"] // 32, lambda c: c["THREADS"]),
    Constraint("the B tile's float4 count (BK*BN/4) must be a multiple of THREADS",
               lambda c: (c["BK"] * c["BN"] // 4) % c["THREADS"] == 0),
)


class WarpTile(Family):
    name = "warptile"
    rung = 6
    precision = "ffma"
    description = "Block tile -> warp tiles -> per-lane TM x TN patches; float4 loads through registers."
    source_file = "warptile.cu"
    params = WARP_PARAMS
    constraints = WARP_CONSTRAINTS + (
        Constraint("the A tile's float4 count (BM*BK/4) must be a multiple of THREADS",
                   lambda c: (c["BM"] * c["BK"] // 4) % c["THREADS"] == 0),
    )

    def threads(self, c: Config) -> int:
        return c["THREADS"]

    def shared_bytes(self, c: Config) -> int:
        return 4 * c["BK"] * (c["BM"] + c["PADA"] + c["BN"])

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], c["BN"]
