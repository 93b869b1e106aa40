"""Rung 5: float4 global and shared accesses, A transposed and padded in shared memory."""
from kernels.families.blocked_sum import accumulators_fit
from kernels.families.blocktile2d import RASTER, block_threads
from kernels.space import Config, Constraint, Family, Param

PADA = Param("PADA", (0, 4), "floats of padding per row of the transposed A tile (bank spreading)")


class Vectorized(Family):
    name = "vectorized"
    rung = 5
    precision = "ffma"
    description = "2D blocking with float4 loads/stores, transposed+padded A tile, float4 fragment reads."
    source_file = "vectorized.cu"
    params = (
        Param("BM", (32, 64, 128, 256), "block tile rows"),
        Param("BN", (32, 64, 128, 256), "block tile columns"),
        Param("BK", (8, 16, 32), "depth of the shared-memory slice"),
        Param("TM", (4, 8, 16), "thread tile rows"),
        Param("TN", (4, 8, 16), "thread tile columns"),
        PADA,
        Param("PADB", (0, 4), "floats of padding per row of the B tile"),
        RASTER,
    )
    constraints = (
        Constraint("BM must be a multiple of TM", lambda c: c["BM"] % c["TM"] == 0),
        Constraint("BN must be a multiple of TN", lambda c: c["BN"] % c["TN"] == 0),
        accumulators_fit("TM*TN", lambda c: c["TM"] * c["TN"], block_threads),
        Constraint("the A tile's float4 count (BM*BK/4) must be a multiple of the thread count",
                   lambda c: (c["BM"] * c["BK"] // 4) % block_threads(c) == 0),
        Constraint("the B tile's float4 count (BK*BN/4) must be a multiple of the thread count",
                   lambda c: (c["BN"] * c["BK"] // 4) % block_threads(c) == 0),
    )

    def threads(self, c: Config) -> int:
        return block_threads(c)

    def shared_bytes(self, c: Config) -> int:
        return 4 * c["BK"] * (c["BM"] + c["PADA"] + c["BN"] + c["PADB"])

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], c["BN"]
