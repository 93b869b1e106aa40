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
from typing import Any

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
    """The preparing processes (``workers``, default ``processes()``), all spawned now from
    this thread, one no-op job each (the executor spawns a process for a job that finds none
    idle): a child dies with the thread that spawned it (``tuner.lifetime``), and the first
    job after these may come from the evaluator's start thread (``compile_prior``), which
    ends. ``StartupPrefetch`` takes them over. End them with ``tuner.lifetime.kill_pool``."""
    count = workers or processes()
    executor = ProcessPoolExecutor(max_workers=count, mp_context=mp.get_context("spawn"),
                                   initializer=_init, initargs=(os.getpid(),))
    for _ in range(count):
        executor.submit(os.getpid)
    return executor


def compile_prior(families: list[str], gpu: str, arch: str, problem: Any, sm_count: int,
                  batch: int, seed: int | None, cache_dir: str | None, sampler: str,
                  prior_compiles: int | None = None) -> str | None:
    """At the command's start, in a preparing process: the static prior's compiles of the
    studies of ``families`` (the first problem's after its first, in order) that will start
    from the prior as far as this GPU model's bundled recordings tell (``study.ranks_prior``;
    a results database that holds the family elsewhere makes them unneeded: niced, at the
    start, they delay nothing the command waits for), up to the first whose prior ranks (a
    space larger than the start-up: smem's three configs are all of its start-up). Its start-up,
    planned once the stores are open, then finds them in the CUBIN cache, or waits on the
    compiles still running instead of starting them: planned only then, blocktile1d's at
    fresh 1024³ on the H200 came 4.9-5.2 s after its study began, the GPU idle
    (docs/measurement.md, "The first shape's prior compiles"). ``prior_compiles``: as the
    session's (default ``prior.MAX_COMPILES``). The name of that family, or None."""
    import kernels
    from tuner.measure.recording import manifest
    from tuner.search import prior
    from tuner.search.study import prepare_startup, ranks_prior

    recorded = [(gpu, family, shape) for entry in manifest()["recordings"].values()
                if entry.get("gpu") == gpu
                for family in entry.get("families", []) for shape in entry.get("shapes", [])]
    for name in families:
        if not ranks_prior(sampler, kernels.get_family(name), (gpu, name, problem.shape),
                           recorded):
            continue
        startup = prepare_startup(name, arch, problem, sampler, sm_count, batch, seed,
                                  prior.MAX_COMPILES if prior_compiles is None else prior_compiles,
                                  cache_dir)
        if startup.accepted is not None and len(startup.accepted) > len(startup.ranked or []):
            return name
    return None
