"""The register cost of blocked_sum.cuh: the FFMA families' two-level sums over K (the ladder's and
skinny's) keep two FP32 registers per output (the chunk's partial sum and the running total)."""
from collections.abc import Callable

from kernels.occupancy import REGISTERS_BESIDE_OUTPUTS, max_registers
from kernels.space import Config, Constraint


def fits_twice(outputs: int, threads: int) -> bool:
    """Whether both sets of a thread's accumulators fit in the registers ptxas may give each of
    `threads` threads (every family's __launch_bounds__ holds it to one resident block), with
    room for the rest; the register file is the same on every architecture the families run on."""
    if not 1 <= threads <= 1024:  # no block of that many runs at all
        return False
    return 2 * outputs + REGISTERS_BESIDE_OUTPUTS <= max_registers("sm_90", threads)  # lru-cached


def accumulators_fit(outputs: str, outputs_per_thread: Callable[[Config], int],
                     threads: Callable[[Config], int]) -> Constraint:
    """The constraint, its reason naming the family's count of outputs per thread."""
    return Constraint(
        f"2 x accumulators per thread ({outputs}) + {REGISTERS_BESIDE_OUTPUTS} must fit in the registers a "
        "block's thread may use (255 up to 256 threads, 128 at 512, 64 at 1024): blocked sums "
        "over K keep a partial and a total per output",
        lambda c: fits_twice(outputs_per_thread(c), threads(c)))
