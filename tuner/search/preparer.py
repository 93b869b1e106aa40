"""The processes that prepare the command's next studies' start-ups (``tuner.search.prefetch``),
startable before the search is imported.

A live command starts it beside the GPU child and the compile processes (``tuner.run.tune``),
so that its own spawn and imports (the search, Optuna, scikit-learn: about 2 s on the H100
hosts) overlap the main process's imports instead of following the first study's start: its
start-ups are ready that much sooner, and a study's start no longer waited for one
(docs/measurement.md, "Start-ups prepared ahead"). This module imports nothing heavy: the parent
pickles ``_init`` by reference.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

from tuner.lifetime import child_init

# Niceness of the preparing process: below the compile pool and the GPU child, which serve the
# study that runs now.
NICENESS = 10


def _init(parent_pid: int) -> None:
    child_init(parent_pid)
    os.nice(NICENESS)
    # imported now, while the parent imports too, not at the first start-up it prepares
    # (what tuner.search.prefetch, which imports this module, builds on)
    import tuner.search.learned  # noqa: F401
    import tuner.search.study  # noqa: F401
    from tuner.search.costmodel import preload

    try:
        preload()
    except ImportError:  # no scikit-learn: the samplers that need it are refused at the parse
        pass


# Cores per start-up prepared at once. One process in turn was too slow on the H200 host (16
# cores): 90 s of start-ups for a 95-s command at fresh 2048^3, the studies waiting 25 s for
# theirs with the host's cores 66 % busy (docs/measurement.md, "Start-ups prepared ahead").
CORES_PER_PROCESS = 8
MAX_PROCESSES = 4


def processes(cores: int | None = None) -> int:
    """How many start-ups are prepared at once on a host of ``cores`` (default: this one's):
    one per CORES_PER_PROCESS cores, at least one, at most MAX_PROCESSES."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(MAX_PROCESSES, cores // CORES_PER_PROCESS))


def start(workers: int | None = None) -> ProcessPoolExecutor:
    """The preparing processes (``workers``, default ``processes()``), the first spawned now
    (its first job is a no-op), the others as start-ups are submitted; ``StartupPrefetch`` takes
    them over. End them with ``tuner.lifetime.kill_pool``."""
    executor = ProcessPoolExecutor(max_workers=workers or processes(), mp_context=mp.get_context("spawn"),
                                   initializer=_init, initargs=(os.getpid(),))
    executor.submit(os.getpid)
    return executor
