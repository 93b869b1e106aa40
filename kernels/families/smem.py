"""Rung 2: square tiles of A and B cached in shared memory."""
from kernels.space import Config, Family, Param


class SharedMemory(Family):
    name = "smem"
    rung = 2
    precision = "ffma"
    description = "TILE x TILE tiles of A and B staged in shared memory; one thread per element of C."
    source_file = "smem.cu"
    params = (Param("TILE", (8, 16, 32), "tile edge; the block has TILE*TILE threads"),)

    def threads(self, c: Config) -> int:
        return c["TILE"] ** 2

    def tiles(self, c: Config, m: int, n: int) -> tuple[int, int]:
        return c["TILE"], c["TILE"]
