"""Rung 4: 2D register blocking (TM x TN outer products per thread)."""
from kernels.families.blocked_sum import accumulators_fit
from kernels.space import Config, Constraint, Family, Param

TILE = (16, 32, 64, 128, 256)


def block_threads(c: Config) -> int:
    """Threads per block: one per TM x TN patch of the block tile."""
    return (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])


RASTER = Param("RASTER", (1, 4, 8, 16), "block-order group height for L2 reuse (1 = row-major order)", launch_time=True)


class BlockTile2D(Family):
    name = "blocktile2d"
    rung = 4
    precision = "ffma"
    description = "Each thread computes a TM x TN outer product per k from register fragments."
    source_file = "blocktile2d.cu"
    params = (
        Param("BM", TILE, "block tile rows"),
        Param("BN", TILE, "block tile columns"),
        Param("BK", (8, 16, 32), "depth of the shared-memory slice"),
        Param("TM", (1, 2, 4, 8, 16), "thread tile rows"),
        Param("TN", (1, 2, 4, 8, 16), "thread tile columns"),
        RASTER,
    )
    constraints = (
        Constraint("BM must be a multiple of TM", lambda c: c["BM"] % c["TM"] == 0),
        Constraint("BN must be a multiple of TN", lambda c: c["BN"] % c["TN"] == 0),
        accumulators_fit("TM*TN", lambda c: c["TM"] * c["TN"], block_threads),
    )

    def threads(self, c: Config) -> int:
        return block_threads(c)

    def shared_bytes(self, c: Config) -> int:
        return 4 * c["BK"] * (c["BM"] + c["BN"])

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], c["BN"]
