"""What a compiled config uses: per block with the occupancy that follows (dry run and live),
and per thread as the search's static prior reads it (compiled, recorded or estimated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import kernels

from tuner.problem import Problem


@dataclass(frozen=True)
class Usage:
    """Per-thread resources of a config's main kernel (compiled, or estimated)."""

    registers: int
    shared_static_bytes: int = 0
    spill_bytes: int = 0


# A config's Usage where known (None: absent, or it does not compile).
Resources = Callable[[Mapping[str, int]], "Usage | None"]


def usage_of(main: Any) -> Usage:
    """The Usage of a compiled main kernel from its ptxas report (``kernels.Resources``)."""
    return Usage(main.registers, main.shared_static_bytes,
                 main.spill_store_bytes + main.spill_load_bytes)


@dataclass(frozen=True)
class ResourceSummary:
    kernel: str  # the main (first launched) kernel; a split-K reduction is not the bottleneck
    threads: int
    registers: int
    shared_bytes: int  # static (ptxas) + dynamic (launch) per block
    spill_bytes: int  # stores + loads
    occupancy: float
    limiter: str


def summarize(family: Any, config: Mapping[str, int], problem: Problem,
              resources: Mapping[str, Any], arch: str) -> ResourceSummary:
    main = family.main_launch(dict(config), problem.m, problem.n, problem.k)
    used = resources[main.kernel]
    threads = main.block[0] * main.block[1] * main.block[2]
    shared = int(used.shared_static_bytes) + int(main.shared_bytes)
    occ = kernels.occupancy(arch, threads, int(used.registers), shared)
    return ResourceSummary(
        kernel=main.kernel,
        threads=threads,
        registers=int(used.registers),
        shared_bytes=shared,
        spill_bytes=int(used.spill_store_bytes) + int(used.spill_load_bytes),
        occupancy=float(occ.fraction),
        limiter=str(occ.limiter),
    )
