"""Rungs 7 and 8: multi-stage cp.async pipelining, and split-K on top of it."""
from kernels.families.warptile import WARP_CONSTRAINTS, WARP_PARAMS
from kernels.space import Config, Family, Param

STAGES = Param("STAGES", (2, 3, 4), "shared-memory tiles in flight (cp.async ring depth)")


class Pipelined(Family):
    name = "pipelined"
    rung = 7
    precision = "ffma"
    description = ("Warptiling fed by a STAGES-deep cp.async ring of shared-memory tiles, with "
                   "register fragments prefetched one k-step ahead.")
    source_file = "pipelined.cu"
    params = WARP_PARAMS + (STAGES,)
    constraints = WARP_CONSTRAINTS

    def threads(self, c: Config) -> int:
        return c["THREADS"]

    def shared_bytes(self, c: Config) -> int:
        return 4 * c["STAGES"] * c["BK"] * (c["BM"] + c["PADA"] + c["BN"])

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["BM"], c["BN"]


class SplitK(Pipelined):
    name = "splitk"
    rung = 8
    precision = "ffma"
    description = ("The pipelined kernel with K cut into SPLITK slices (blockIdx.z), partial sums in a "
                   "workspace and a reduction kernel; for small M*N and large K.")
    params = Pipelined.params + (Param("SPLITK", (2, 4, 8, 16, 32), "slices of K", launch_time=True,
                                           sums=True),)

    def splits(self, c: Config) -> int:
        return c["SPLITK"]
