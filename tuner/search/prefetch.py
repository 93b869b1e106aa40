"""Prepare the next studies' start-ups while the current one measures (docs/measurement.md,
"Start-ups prepared ahead").

A study's start-up (``tuner.search.study.Startup``: its accepted configs enumerated, grouped by
geometry, the static prior's ranking, which compiles up to ``prior.MAX_COMPILES`` configs, where
the study will start from it, and the learned model's feature rows and first fit) is seconds
of CPU with the GPU idle. It depends on the family, the GPU, the problem (and the model's
examples) only, so child processes prepare the command's next studies', in order, while the
current one runs (a study of 80 trials can be over in seconds, before one start-up would be
ready): processes, not threads, so that their pure-Python enumeration does not hold the main
thread's GIL, niced, so that the current study's compiles keep the cores they need, and one per
eight cores (``preparer.processes``), since one in turn fell behind the studies. Its compiles fill the
same CUBIN cache the candidates then hit. The study uses the prepared inputs exactly as it
would have computed them itself (``prepare_startup`` is that computation).
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import tempfile
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import lru_cache
from typing import Any, Callable, Iterable, NamedTuple

import kernels
from kernels.compiler import cubin_key

from tuner.lifetime import kill_pool
from tuner.measure.phases import STARTUP_BG, STARTUP_WAIT
from tuner.problem import Problem
from tuner.search.costmodel import Example
from tuner.search import preparer
from tuner.search.learned import (bundled_examples, database_examples, examples_for_study,
                                  without_shape)
from tuner.search.choices import LEARNING
from tuner.search.study import Session, Startup, prepare_startup

log = logging.getLogger(__name__)


# The compile-ahead threads take at most this fraction of the cores (1/4): off the critical
# path, they need not finish fast, and with a thread per core their burst, niced but on the same
# logical CPUs, slowed the running study's own compiles (docs/measurement.md, "Start-ups
# prepared ahead").
AHEAD_SHARE = 4

# In the preparing process: compiles of the model's first picks, left running after their
# start-up is handed back (a study never waits for them; its own compile of a config that is
# being built here waits on the cache entry's lock instead of building it twice).
_ahead: ThreadPoolExecutor | None = None


def _compile_quietly(family: Any, config: dict[str, int], arch: str, cache_dir: str | None
                     ) -> None:
    try:
        kernels.compile_config(family, config, arch, cache_dir=cache_dir)
    except Exception as error:  # the study compiles it again and records what went wrong
        log.debug("compiling %s ahead failed: %s", family.name, error)


class ExamplesFile(NamedTuple):
    """The model's examples of one problem, as files the preparing processes read (each file
    once): pickled by the command's process for every start-up submitted and unpickled for every
    one prepared, the H200's 54,136 bundled examples (6.7 MB) took 0.12 s and 0.45 s each on the
    2-core machine; written once per problem, the pickling still held the main thread 0.9 s at
    each shape change, the GPU idle (docs/measurement.md, "Shape changes"). So the
    bundled examples, the same for every problem but its own shape's, are written once per
    command (``bundled``), and per problem only the results database's (``path``)."""
    path: str  # the database's examples (or the session's training examples, all of them)
    bundled: str | None = None  # every bundled example of ``gpu``, less ``shape``'s when read
    gpu: str = ""
    shape: str = ""

    def read(self) -> list[Example]:
        examples = list(_read_examples(self.path))
        if self.bundled is not None:
            examples += _bundled_less(self.bundled, self.gpu, self.shape)
        return examples


@lru_cache(maxsize=3)  # the bundled examples, and a shape's studies come in a row
def _read_examples(path: str) -> list[Example]:
    with open(path, "rb") as file:
        return pickle.load(file)


@lru_cache(maxsize=2)
def _bundled_less(path: str, gpu: str, shape: str) -> tuple[Example, ...]:
    return without_shape(_read_examples(path), gpu, shape)


def prepare(family_name: str, arch: str, problem: Problem, sampler: str, sm_count: int,
            batch: int, seed: int | None, prior_compiles: int, cache_dir: str | None,
            rank: bool, examples: list[Example] | ExamplesFile | None) -> Startup:
    """``prepare_startup`` and the compiles of the model's first picks begun
    (``Startup.first_picks``, ``batch`` of them): with the prior's ranking gone where the model
    learns the family elsewhere, nothing else would compile them before the study asks (where
    it starts from the prior, whose ranking compiled its first asks, the model asks next)
    (docs/measurement.md, "Start-ups prepared ahead")."""
    global _ahead
    if isinstance(examples, ExamplesFile):
        examples = examples.read()
    startup = prepare_startup(family_name, arch, problem, sampler, sm_count, batch, seed,
                              prior_compiles, cache_dir, rank, examples)
    if not startup.first_picks:
        return startup
    if _ahead is None:
        _ahead = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 1) // AHEAD_SHARE),
                                    thread_name_prefix="compile-ahead")
    family = kernels.bind(kernels.get_family(family_name), problem.layout, problem.batch)  # its layout's programs
    programs = set()
    for config in startup.first_picks:
        program = cubin_key(family, config, arch)
        if program not in programs:  # the picks' RASTER and SPLITK variants share a CUBIN
            programs.add(program)
            _ahead.submit(_compile_quietly, family, config, arch, cache_dir)
    return startup


def can_prefetch(session: Session, family: Any) -> bool:
    """Only a registered family (it travels by name) of a live run: a replay ranks its start-up
    from the resources its recording holds, in the main thread."""
    return (kernels.FAMILIES.get(family.name) is getattr(family, "base", family)
            and getattr(session.evaluator, "compiled_usage", None) is None)


# Start-ups prepared and not yet taken, at most: the processes work through the studies planned
# in order and rest only this far ahead (each holds a family's accepted configs: a shape's
# eleven about 120 MB at 2048³, and for the model their feature rows, 64 MB more). A whole
# shape's (they are planned shape by shape), so that the processes do not rest while the first
# study (naive: seconds of GPU work per config, few cheap compiles) leaves cores to spare; with
# 4 they stopped after blocktile2d's and vectorized's start-ups there (docs/measurement.md,
# "Start-ups prepared ahead").
AHEAD = 11


Key = tuple[str, Problem]


class StartupPrefetch:
    """The start-ups of the command's next studies, prepared in order by the preparing
    processes (``preparer.processes()`` at once: the prior's compiles already take a thread per
    core, and the cores are the running study's compiles' first). ``take`` each when its study
    starts; close (terminate) the processes at the end, whatever the reason."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._executor: ProcessPoolExecutor | None = None
        self._started: ProcessPoolExecutor | None = session.prefetch_process  # not yet taken
        self._queue: deque[tuple[Any, Problem, bool]] = deque()  # to be submitted, in order
        self._jobs: dict[Key, Future[Startup]] = {}  # submitted, not taken
        self._broken = False  # the process died (killed?): the studies compute their own
        self._examples_read: dict[Problem, list[Example]] = {}
        self._from_database: dict[Problem, list[Example]] = {}
        self._examples_files: dict[Problem, ExamplesFile] = {}
        self._bundled_file: str | None = None  # the GPU model's bundled examples, written once
        self._written = 0  # files in the folder
        self._folder: str | None = None  # the examples' files, removed at close
        self._here: ThreadPoolExecutor | None = None  # prepare_here's thread

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
        while self._queue and len(self._jobs) < AHEAD and not self._broken:
            family, problem, rank = self._queue.popleft()
            if self._executor is None:  # started by the command, else from this (the main) thread
                self._executor, self._started = self._started or preparer.start(), None
            try:
                self._jobs[(family.name, problem)] = self._executor.submit(
                    prepare, *self._arguments(family, problem, rank, self._examples_file(problem)))
            except BrokenProcessPool:
                self._give_up()

    def _arguments(self, family: Any, problem: Problem, rank: bool, examples: Any) -> tuple[Any, ...]:
        session = self.session
        sm_count = int(session.evaluator.info().get("sm_count") or 0)
        cache = None if session.compile_cache is None else str(session.compile_cache)
        return (family.name, session.evaluator.arch(), problem, session.sampler, sm_count,
                session.batch, session.seed, session.prior_compiles, cache, rank, examples)

    def prepare_here(self, family: Any, problem: Problem, rank: bool) -> None:
        """Prepare a shape's first start-up on a thread of this process, while the main thread
        waits for the GPU child to set the shape up (inputs, float64 reference, cuBLAS
        baseline), instead of after it with the GPU idle: at the command's start the process
        would take longer to start than the start-up takes. (Measured at fresh 2048³ on the
        H100: at most 0.3 s less idle before the first answer; docs/measurement.md, "Start-ups
        prepared ahead".)"""
        if not can_prefetch(self.session, family) or self._broken:
            return
        if self._here is None:
            self._here = ThreadPoolExecutor(max_workers=1, thread_name_prefix="first-startup")
        # (no compiles ahead here: the study's own pool starts them as soon as it asks; the
        # prior's compiles run in that pool too, idle until then)
        pool = getattr(self.session.evaluator, "pool", None)
        self._jobs[(family.name, problem)] = self._here.submit(
            prepare_startup, *self._arguments(family, problem, rank, self._examples(problem)),
            usage=None if pool is None else pool.usage(family))

    def _examples(self, problem: Problem) -> list[Example] | None:
        """The model's examples of other problems as a study of ``problem`` reads them
        (``learned.examples_for_study``; its first fit is then made ahead too), for the samplers
        that learn: read once per problem, for all its families (the database, 0.05-0.2 s of
        the main thread each time, does not change in between; where it has by a study's start,
        the study fits on its own)."""
        session = self.session
        if session.sampler not in LEARNING:
            return None
        if session.training is not None:
            return list(session.training)
        if problem not in self._examples_read:
            self._examples_read[problem] = examples_for_study(
                session.database, session.gpu_name, problem, session.learn_from_recordings,
                from_database=self._database_examples(problem))
        return self._examples_read[problem]

    def _database_examples(self, problem: Problem) -> list[Example]:
        """The first part of ``_examples``: the results database's (read once per problem)."""
        if problem not in self._from_database:
            self._from_database[problem] = database_examples(
                self.session.database, self.session.gpu_name, problem)
        return self._from_database[problem]

    def _examples_file(self, problem: Problem) -> ExamplesFile | None:
        """``_examples(problem)`` as files the preparing processes read: the database's part
        per problem, the bundled recordings' once (``ExamplesFile``)."""
        found = self._examples_files.get(problem)
        if found is not None:
            return found
        session = self.session
        if session.sampler not in LEARNING:
            return None
        if session.training is not None:
            found = ExamplesFile(self._write(list(session.training)))
        else:
            bundled = None
            if session.learn_from_recordings:
                if self._bundled_file is None:
                    self._bundled_file = self._write(list(bundled_examples(session.gpu_name)))
                bundled = self._bundled_file
            found = ExamplesFile(self._write(self._database_examples(problem)), bundled,
                                 session.gpu_name, problem.shape)
        self._examples_files[problem] = found
        return found

    def _write(self, examples: list[Example]) -> str:
        """``examples`` pickled to a new file of the command's examples folder; its path."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="gemmtune-examples-")
        path = os.path.join(self._folder, f"{self._written}.pickle")
        self._written += 1
        with open(path, "wb") as file:
            pickle.dump(examples, file, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    def take(self, family: Any, problem: Problem) -> Startup | None:
        """The prepared start-up of ``family`` on ``problem`` (waiting for it), or None where
        none was planned for it or it failed (the study then computes its own)."""
        job = self._jobs.pop((family.name, problem), None)
        if job is None:
            return None
        self._top_up()  # the one after the last submitted, queued behind the ones ahead
        try:
            with self.session.phases.timed(STARTUP_WAIT):
                startup = job.result()
        except Exception as error:
            log.warning("preparing the start-up of %s ahead failed: %s", family.name, error)
            if isinstance(error, BrokenProcessPool):  # its process died (killed?): stop here
                self._give_up()
            return None
        # the process's time for the studies that use it (one left untaken is not counted)
        self.session.phases.add(STARTUP_BG, startup.seconds)
        return startup

    def peek(self, family: Any, problem: Problem) -> Startup | None:
        """The prepared start-up of ``family`` on ``problem`` where it is ready now, left for
        ``take``; else None (not waited for)."""
        job = self._jobs.get((family.name, problem))
        if job is None or not job.done() or job.cancelled() or job.exception() is not None:
            return None
        return job.result()

    def _give_up(self) -> None:
        self.close()
        self._broken = True

    def close(self) -> None:
        """End the process at once: a job half done is of no use, and waiting for its
        compiles would hold up the command's exit."""
        if self._here is not None:  # a thread cannot be killed: its start-up is left to end
            self._here.shutdown(wait=False, cancel_futures=True)
            self._here = None
        executors = [e for e in (self._executor, self._started) if e is not None]
        self._executor = self._started = None
        self._queue, self._jobs = deque(), {}
        for executor in executors:
            kill_pool(executor)
        if self._folder is not None:  # after the processes that read it are gone
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder, self._examples_files, self._bundled_file = None, {}, None

    def __enter__(self) -> StartupPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
