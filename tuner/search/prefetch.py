"""Prepare the next studies' start-ups while the current one measures (issue 19).

A study's start-up (``tuner.search.study.Startup``: its accepted configs enumerated, grouped by
geometry, and the static prior's ranking, which compiles up to ``prior.MAX_COMPILES`` configs)
is seconds of CPU with the GPU idle. It depends on the family, the GPU and the problem only, so
one child process prepares the command's next studies', in order, while the current one runs
(a study of 80 trials can be over in seconds, before one start-up would be ready): a process,
not a thread, so that its pure-Python enumeration does not hold the main thread's GIL, and
niced, so that the current study's compiles keep the cores they need. Its compiles fill the
same CUBIN cache the candidates then hit. The study uses the prepared inputs exactly as it
would have computed them itself (``prepare_startup`` is that computation).

A second process, niced further, then compiles each prepared start-up's configs
(``warm_startup``: the prior compiles one per group, the study first asks three per group), so
that a study's first window is cache hits; it never delays a ranking (a start-up ranked late
costs the GPU more than one compiled late) and a study that begins first drops its warming.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from collections import deque
from typing import Any, Iterable

import kernels
from kernels.compiler import cached_config

from tuner.lifetime import child_init
from tuner.measure.phases import STARTUP_BG
from tuner.problem import Problem
from tuner.search.study import Session, Startup, prepare_startup

log = logging.getLogger(__name__)

# Niceness of the preparing process: below the compile pool and the GPU child, which serve the
# study that runs now.
NICENESS = 10
# Niceness of the warming process, below the preparing one: a start-up ranked late costs the
# GPU more than a start-up compiled late (bench/NOTES.md, session 10).
WARM_NICENESS = 15


def _init(parent_pid: int, niceness: int = NICENESS) -> None:
    child_init(parent_pid)
    os.nice(niceness)


def warm_startup(family_name: str, arch: str, configs: list[dict[str, int]],
                 cache_dir: str | None) -> int:
    """Compile a prepared start-up's configs into the CUBIN cache (the prior compiled one per
    geometry group; the study asks three per group first): its first window is then cache hits
    instead of compiles the GPU waits for. Returns the compiles that were needed."""
    family = kernels.get_family(family_name)

    def compile_one(config: dict[str, int]) -> int:
        if cached_config(family, config, arch, cache_dir) is not None:
            return 0
        try:
            kernels.compile_config(family, config, arch, cache_dir=cache_dir)
        except (kernels.CompileError, kernels.ConfigError):
            pass  # the study meets the same error and records it
        return 1

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as threads:
        return sum(threads.map(compile_one, configs))


def can_prefetch(session: Session, family: Any) -> bool:
    """Only a registered family (it travels by name) of a live run: a replay ranks its start-up
    from the resources its recording holds, in the main thread."""
    return (kernels.FAMILIES.get(family.name) is family
            and getattr(session.evaluator, "compiled_usage", None) is None)


# Start-ups prepared and not yet taken, at most: the process works through the command's
# studies in order and rests only this far ahead (each holds a family's accepted configs).
AHEAD = 4


Key = tuple[str, Problem]


class StartupPrefetch:
    """The start-ups of the command's next studies, prepared in order by one process (one at a
    time: the prior's compiles already take a thread per core, and the cores are the running
    study's compiles' first). ``take`` each when its study starts; close (terminate) the
    process at the end, whatever the reason."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._executor: ProcessPoolExecutor | None = None
        self._queue: deque[tuple[Any, Problem]] = deque()  # to be submitted, in order
        self._jobs: dict[Key, Future[Startup]] = {}  # submitted, not taken
        self._broken = False  # the process died (killed?): the studies compute their own
        # A second process compiles each prepared start-up's configs (warm_startup), one after
        # the other as they are prepared, never holding up the preparing one; a study that
        # begins before its warming does drops it (its own compiles take over).
        self._warmer: ProcessPoolExecutor | None = None
        self._warming: dict[Key, Future[int]] = {}
        self._lock = threading.Lock()  # _jobs and _warming, between take and _warm

    def plan(self, studies: Iterable[tuple[Any, Problem]]) -> None:
        """Prepare these studies' start-ups in this order (after those already submitted),
        replacing the studies planned before and not yet begun."""
        self._queue = deque((family, problem) for family, problem in studies
                            if can_prefetch(self.session, family)
                            and (family.name, problem) not in self._jobs)
        self._top_up()

    def _top_up(self) -> None:
        session = self.session
        while self._queue and len(self._jobs) < AHEAD and not self._broken:
            family, problem = self._queue.popleft()
            if self._executor is None:  # their processes start from this (the main) thread
                self._executor = self._process(NICENESS)
                self._warmer = self._process(WARM_NICENESS)
                self._warmer.submit(os.getpid)  # starts it here (see CompilePool._pool)
            sm_count = int(session.evaluator.info().get("sm_count") or 0)
            cache = None if session.compile_cache is None else str(session.compile_cache)
            key = (family.name, problem)
            try:
                job = self._jobs[key] = self._executor.submit(
                    prepare_startup, family.name, session.evaluator.arch(), problem,
                    session.sampler, sm_count, session.batch, session.seed,
                    session.prior_compiles, cache)
            except BrokenProcessPool:
                self._give_up()
                return
            if session.prior_compiles:
                arch = session.evaluator.arch()
                job.add_done_callback(lambda done, key=key: self._warm(key, done, arch, cache))

    @staticmethod
    def _process(niceness: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                   initializer=_init, initargs=(os.getpid(), niceness))

    def _warm(self, key: Key, done: Future[Startup], arch: str, cache: str | None) -> None:
        """(The preparing executor's thread, when a start-up is ready.) Queue its warming,
        unless its study has begun meanwhile."""
        if done.cancelled() or done.exception() is not None or not done.result().ranked:
            return
        with self._lock:
            if self._warmer is None or key not in self._jobs:
                return
            try:
                self._warming[key] = self._warmer.submit(warm_startup, key[0], arch,
                                                         done.result().ranked, cache)
            except (BrokenProcessPool, RuntimeError):  # closed meanwhile, or its process died
                pass

    def take(self, family: Any, problem: Problem) -> Startup | None:
        """The prepared start-up of ``family`` on ``problem`` (waiting for it), or None where
        none was planned for it or it failed (the study then computes its own)."""
        with self._lock:
            job = self._jobs.pop((family.name, problem), None)
            warming = self._warming.pop((family.name, problem), None)
        if warming is not None:
            warming.cancel()  # where not begun: the study's own compiles take over
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
        with self._lock:
            executors = [self._executor, self._warmer]
            self._executor, self._warmer = None, None
            self._queue, self._jobs, self._warming = deque(), {}, {}
        for executor in executors:
            if executor is None:
                continue
            # (Python 3.14 has executor.terminate_workers(); before it, its processes' handles)
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                process.kill()
            executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> StartupPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
