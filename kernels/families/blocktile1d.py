"""Rung 3: 1D register blocking (each thread computes TM rows of one column)."""
from kernels.space import Config, Constraint, Family, Param

TILE = (16, 32, 64, 128, 256)


class BlockTile1D(Family):
    name = "blocktile1d"
    rung = 3
    precision = "ffma"
    description = "BM x BN block tile, BK-deep shared-memory slices; each thread accumulates TM results."
    source_file = "blocktile1d.cu"
    params = (
        Param("BM", TILE, "block tile rows"),
        Param("BN", TILE, "block tile columns"),
        Param("BK", (8, 16, 32, 64), "depth of the shared-memory slice"),
        Param("TM", (1, 2, 4, 8, 16), "results per thread (rows)"),
    )
    constraints = (Constraint("BM must be a multiple of TM", lambda c: c["BM"] % c["TM"] == 0),)

    def threads(self, c: Config) -> int:
        return c["BM"] * c["BN"] // c["TM"]

    def shared_bytes(self, c: Config) -> int:
        return 4 * c["BK"] * (c["BM"] + c["BN"])

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], c["BN"]
