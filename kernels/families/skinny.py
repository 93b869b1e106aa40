"""Rung 10: small-M GEMM that streams B once through per-warp cp.async rings, no block barriers."""
from kernels.families.blocked_sum import accumulators_fit
from kernels.space import Config, Family, Param

BN = 128  # columns per block: 32 lanes x 4 (skinny.cu)


def stage_floats(c: Config) -> int:
    """One ring slot: UNROLL rows of B's 128-column slice and the TM x UNROLL corner of A."""
    return c["UNROLL"] * BN + c["TM"] * c["UNROLL"]


class Skinny(Family):
    name = "skinny"
    rung = 10
    precision = "ffma"
    description = ("Small M against a large B (bandwidth-bound, e.g. 16x4096x4096): each warp streams "
                   "batches of B rows through its own cp.async ring, lanes keep TM x 4 outputs; warps "
                   "split K in the block, SPLITK across blocks.")
    source_file = "skinny.cu"
    params = (
        Param("TM", (1, 2, 4, 8, 16), "rows of A (and C) per block"),
        Param("UNROLL", (4, 8, 16, 32), "rows of B per batch (one ring slot)"),
        Param("STAGES", (2, 3, 4, 6, 8), "ring slots per warp (batches in flight)"),
        Param("WK", (1, 2, 4, 8, 16), "warps per block, taking turns over the block's K range", sums=True),
        Param("SPLITK", (1, 2, 4, 8, 16, 32), "slices of K (blockIdx.z), reduced by a second kernel", launch_time=True,
              sums=True),
    )
    constraints = (accumulators_fit("4*TM", lambda c: 4 * c["TM"], lambda c: 32 * c["WK"]),)

    # From the full sweep on the H100 at 16x4096x4096: the fastest that fit in 99 KiB of shared
    # memory (so every architecture accepts them), 38.9 us each; the sweep's best, 38.0 us,
    # needs 204 KiB (docs/kernels.md, "skinny starting points").
    starting_points = (
        {"TM": 4, "UNROLL": 8, "STAGES": 3, "WK": 4, "SPLITK": 4},
        {"TM": 8, "UNROLL": 4, "STAGES": 8, "WK": 2, "SPLITK": 8},
    )

    def threads(self, c: Config) -> int:
        return 32 * c["WK"]

    def shared_bytes(self, c: Config) -> int:
        rings = c["WK"] * c["STAGES"] * stage_floats(c)
        partials = c["WK"] * c["TM"] * BN if c["WK"] > 1 else 0  # reuses the rings at the end
        return 4 * max(rings, partials)

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["TM"], BN

    def splits(self, c: Config) -> int:
        return c["SPLITK"]
