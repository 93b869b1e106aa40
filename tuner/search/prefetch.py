"""Prepare the next studies' start-ups while the current one measures (issue 19).

A study's start-up (``tuner.search.study.Startup``: its accepted configs enumerated, grouped by
geometry, the static prior's ranking, which compiles up to ``prior.MAX_COMPILES`` configs, where
the study will start from it, and the learned model's feature rows) is seconds of CPU with the
GPU idle. It depends on the family, the GPU and the problem only, so one child process prepares
the command's next studies', in order, while the current one runs
(a study of 80 trials can be over in seconds, before one start-up would be ready): a process,
not a thread, so that its pure-Python enumeration does not hold the main thread's GIL, and
niced, so that the current study's compiles keep the cores they need. Its compiles fill the
same CUBIN cache the candidates then hit. The study uses the prepared inputs exactly as it
would have computed them itself (``prepare_startup`` is that computation).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from collections import deque
from typing import Any, Callable, Iterable

import kernels

from tuner.lifetime import child_init
from tuner.measure.phases import STARTUP_BG
from tuner.problem import Problem
from tuner.search.study import Session, Startup, prepare_startup

log = logging.getLogger(__name__)

# Niceness of the preparing process: below the compile pool and the GPU child, which serve the
# study that runs now.
NICENESS = 10


def _init(parent_pid: int) -> None:
    child_init(parent_pid)
    os.nice(NICENESS)


def can_prefetch(session: Session, family: Any) -> bool:
    """Only a registered family (it travels by name) of a live run: a replay ranks its start-up
    from the resources its recording holds, in the main thread."""
    return (kernels.FAMILIES.get(family.name) is family
            and getattr(session.evaluator, "compiled_usage", None) is None)


# Start-ups prepared and not yet taken, at most: the process works through the command's
# studies in order and rests only this far ahead (each holds a family's accepted configs: a
# shape's eleven about 120 MB at 2048³, and for the model their feature rows, 64 MB more). A
# whole shape ahead, so that it does not rest while the first study (naive: seconds of GPU work
# per config, few cheap compiles) leaves cores to spare; with 4 it stopped after blocktile2d's
# and vectorized's start-ups there. (On a slow host it is busy the whole command anyway:
# bench/NOTES.md, session 14.)
AHEAD = 11


Key = tuple[str, Problem]


class StartupPrefetch:
    """The start-ups of the command's next studies, prepared in order by one process (one at a
    time: the prior's compiles already take a thread per core, and the cores are the running
    study's compiles' first). ``take`` each when its study starts; close (terminate) the
    process at the end, whatever the reason."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._executor: ProcessPoolExecutor | None = None
        self._queue: deque[tuple[Any, Problem, bool]] = deque()  # to be submitted, in order
        self._jobs: dict[Key, Future[Startup]] = {}  # submitted, not taken
        self._broken = False  # the process died (killed?): the studies compute their own

    def plan(self, studies: Iterable[tuple[Any, Problem]],
             rank: Callable[[Any, Problem], bool] | None = None) -> None:
        """Prepare these studies' start-ups in this order (after those already submitted),
        replacing the studies planned before and not yet begun. ``rank(family, problem)``:
        whether the study starts from the static prior (``study.ranks_prior``; default: every
        one whose sampler can), whose ranking is then prepared too."""
        self._queue = deque((family, problem, True if rank is None else rank(family, problem))
                            for family, problem in studies
                            if can_prefetch(self.session, family)
                            and (family.name, problem) not in self._jobs)
        self._top_up()

    def _top_up(self) -> None:
        session = self.session
        while self._queue and len(self._jobs) < AHEAD and not self._broken:
            family, problem, rank = self._queue.popleft()
            if self._executor is None:  # its process starts from this (the main) thread
                self._executor = ProcessPoolExecutor(max_workers=1,
                                                     mp_context=mp.get_context("spawn"),
                                                     initializer=_init,
                                                     initargs=(os.getpid(),))
            sm_count = int(session.evaluator.info().get("sm_count") or 0)
            cache = None if session.compile_cache is None else str(session.compile_cache)
            try:
                self._jobs[(family.name, problem)] = self._executor.submit(
                    prepare_startup, family.name, session.evaluator.arch(), problem,
                    session.sampler, sm_count, session.batch, session.seed,
                    session.prior_compiles, cache, rank)
            except BrokenProcessPool:
                self._give_up()

    def take(self, family: Any, problem: Problem) -> Startup | None:
        """The prepared start-up of ``family`` on ``problem`` (waiting for it), or None where
        none was planned for it or it failed (the study then computes its own)."""
        job = self._jobs.pop((family.name, problem), None)
        if job is None:
            return None
        self._top_up()  # the one after the last submitted, queued behind the ones ahead
        try:
            startup = job.result()
        except Exception as error:
            log.warning("preparing the start-up of %s ahead failed: %s", family.name, error)
            if isinstance(error, BrokenProcessPool):  # its process died (killed?): stop here
                self._give_up()
            return None
        # the process's time for the studies that use it (one left untaken is not counted)
        self.session.phases.add(STARTUP_BG, startup.seconds)
        return startup

    def _give_up(self) -> None:
        self.close()
        self._broken = True

    def close(self) -> None:
        """End the process at once: a job half done is of no use, and waiting for its
        compiles would hold up the command's exit."""
        executor, self._executor = self._executor, None
        self._queue, self._jobs = deque(), {}
        if executor is None:
            return
        # (Python 3.14 has executor.terminate_workers(); before it, its processes' handles)
        for process in list((getattr(executor, "_processes", None) or {}).values()):
            process.kill()
        executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> StartupPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
