"""Rung 1: one thread per element of C, with and without coalesced access."""
from kernels.space import Config, Family, Param


class Naive(Family):
    name = "naive"
    rung = 1
    precision = "ffma"
    description = "One thread per element of C; COALESCED maps consecutive threads to consecutive columns."
    source_file = "naive.cu"
    params = (
        Param("BX", (8, 16, 32, 64, 128), "threads along the fast dimension"),
        Param("BY", (1, 2, 4, 8, 16, 32), "threads along the slow dimension"),
        Param("COALESCED", (0, 1), "1: threadIdx.x walks columns (coalesced); 0: walks rows"),
    )

    def threads(self, c: Config) -> int:
        return c["BX"] * c["BY"]

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return (c["BY"], c["BX"]) if c["COALESCED"] else (c["BX"], c["BY"])

    # A warp along each row of C, coalesced: the command's first study is this family's, and a
    # declared point is what the GPU measures while the search starts (docs/measurement.md,
    # "The command's start and end").
    starting_points = ({"BX": 32, "BY": 4, "COALESCED": 1},)
