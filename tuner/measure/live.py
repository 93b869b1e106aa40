"""The live evaluator: NVRTC compiles in a pool of CPU processes, measurement in a GPU child.

The GPU child runs ``tuner.measure.gpu.GpuBench`` (or a stand-in backend with the same names). A
candidate that kills the CUDA context (GpuFault), the child process, or hangs past the timeout
is recorded as crashed / timeout, and the child is replaced and given the problem again.

Requests are asynchronous (``submit`` / ``collect``): up to ``QUEUE_DEPTH`` candidates
wait in each child's pipe, answered in order. A failure of the one being measured replaces the
child and hands the ones queued behind it, unmeasured, to the new child.

Several GPUs of one host (``device`` a list, or "all") are one evaluator: one compile pool, and
one GPU child per device (a *lane*); each candidate goes to the lane with the fewest waiting, so
the search asks as one search with a batch as many times larger (docs/fleet.md, "Several GPUs
in one command").
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping

import kernels
from kernels.compiler import MAIN_KERNEL, cached_cubin, cubin_key

from tuner.lifetime import child_init, kill_pool
from tuner.measure.evaluator import COMPILE_ERROR, CRASHED, TIMEOUT, Baseline, Measurement
from tuner.measure.phases import (COMPILE_WAIT, GPU_SEND, GPU_WAIT, PREPARE, REPLACE, SETUP,
                                  Phases)
from tuner.measure.resources import Resources, Usage, summarize, usage_of
from tuner.problem import Problem, config_key

log = logging.getLogger(__name__)

DEFAULT_TRIAL_TIMEOUT_S = 30.0
# Context creation, the float64 reference of a large problem, the cuBLAS baseline.
SETUP_TIMEOUT_S = 600.0
# Candidates handed to the GPU child at once: one it measures, the others waiting in its pipe,
# so that the next starts the moment the last is answered while the main thread records that
# one, tells the sampler and asks again. The child still measures one at a time. Three, not two:
# an ask or a pull now and then outlasts one ~0.1 s measurement (H100, 2048³, warm cache: the
# child's idle time inside studies 6.5 → 4.7 s, busy 75.9 → 80.5%; docs/measurement.md,
# "The GPU child's queue").
QUEUE_DEPTH = 3

# What the GPU child measures with: a backend's public name (the value of
# $GEMMTUNE_GPU_BACKEND and of LiveEvaluator's ``backend``, as README and tests spell it) → its
# module. Any other name is taken as a module path.
BACKENDS = {"tuner.gpu": "tuner.measure.gpu", "tuner.testing": "tuner.measure.testing"}
DEFAULT_BACKEND = "tuner.gpu"
# For tests only: "tuner.testing" here makes the whole command (compile pool, child process,
# signals, database) run on the CPU stand-in instead of a GPU.
BACKEND_ENV = "GEMMTUNE_GPU_BACKEND"


def backend_module(name: str) -> ModuleType:
    """The module behind a backend name: ``probe()``, ``GpuFault`` and ``GpuBench``."""
    return importlib.import_module(BACKENDS.get(name, name))


class GpuUnavailable(RuntimeError):
    """No usable CUDA driver or GPU (the reason from ``probe()``)."""


class ChildTimeout(RuntimeError):
    pass


class ChildCrashed(RuntimeError):
    pass


class ChildFault(RuntimeError):
    """The child's CUDA context is dead (GpuFault); the process has to be replaced."""


# ------------------------------------------------------------------ the GPU child process


def _child_main(conn: Connection, backend: str, device: int, options: dict[str, Any],
                parent_pid: int) -> None:
    child_init(parent_pid)
    try:
        gpu = backend_module(backend)
        reason = gpu.probe()
        if reason is not None:
            conn.send(("unavailable", reason))
            return
        bench = gpu.GpuBench(device, **options)
        conn.send(("ready", {"info": bench.info(), "arch": bench.arch(), "devices": gpu.device_count()}))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        op, args = request[0], request[1:]
        if op == "stop":
            return
        try:
            if op == "problem":
                bench.set_problem(*args)
                conn.send(("ok", None))
            elif op == "baseline":
                conn.send(("ok", bench.baseline()))
            elif op == "evaluate":
                began = time.monotonic()  # one clock for every process: the idle gaps between
                result = bench.evaluate(*args)  # answers are found from these spans
                conn.send(("ok", {**result, "span": (began, time.monotonic())}))
            else:
                conn.send(("error", f"unknown request {op!r}"))
        except gpu.GpuFault as fault:
            conn.send(("fault", str(fault)))
            return  # a sticky error: this process's context is unusable
        except Exception:
            conn.send(("error", traceback.format_exc()))


class GpuChild:
    """The parent's handle on one GPU child process."""

    def __init__(self, device: int, backend: str, options: dict[str, Any]) -> None:
        self.device, self.backend, self.options = device, backend, options
        self.process: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.info: dict[str, Any] = {}
        self.arch = ""
        self.devices = 0  # how many GPUs the child's driver sees
        # Messages go out through a thread: a CUBIN larger than the pipe's buffer would block
        # the main thread until the child, busy measuring, reads it.
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None

    def start(self, timeout: float = SETUP_TIMEOUT_S) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process; returns at once (``wait_ready`` waits for its CUDA start)."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main,
            args=(child, self.backend, self.device, self.options, os.getpid()),
            name=f"gemmtune-gpu{self.device}", daemon=True,
        )
        self.process.start()
        child.close()
        self.conn = parent
        self._outbox = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, args=(parent, self._outbox),
                                        name=f"gemmtune-gpu{self.device}-send", daemon=True)
        self._sender.start()

    def wait_ready(self, timeout: float = SETUP_TIMEOUT_S) -> None:
        """Wait for the launched process's first word: ready, or why it cannot measure
        (GpuUnavailable, RuntimeError; the process is stopped then)."""
        kind, payload = self._receive(timeout, "starting")
        if kind == "unavailable":
            self.stop()
            raise GpuUnavailable(payload)
        if kind != "ready":
            self.stop()
            raise RuntimeError(f"the GPU process failed to start:\n{payload}")
        self.info, self.arch, self.devices = payload["info"], payload["arch"], payload["devices"]

    def _receive(self, timeout: float, what: str) -> tuple[str, Any]:
        assert self.conn is not None and self.process is not None
        deadline = time.monotonic() + timeout
        # Poll in short steps so that a child that dies without a word is noticed quickly.
        while not self.conn.poll(min(0.25, max(0.0, deadline - time.monotonic()))):
            if not self.process.is_alive():
                if self.conn.poll(0):
                    break
                raise ChildCrashed(
                    f"GPU process died while {what} (exit code {self.process.exitcode})"
                )
            if time.monotonic() >= deadline:
                raise ChildTimeout(f"GPU process gave no answer within {timeout:g} s while {what}")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1)
            raise ChildCrashed(
                f"GPU process died while {what} (exit code {self.process.exitcode})"
            ) from None

    @staticmethod
    def _send_loop(conn: Connection, outbox: queue.SimpleQueue[tuple | None]) -> None:
        while (message := outbox.get()) is not None:
            try:
                conn.send(message)
            except (BrokenPipeError, OSError):  # the child died: the receiving side says so
                return

    def post(self, message: tuple) -> None:
        """Queue a message for the child; returns at once (answers come in order)."""
        self._outbox.put(message)

    def answer(self, timeout: float, what: str) -> Any:
        """The child's answer to the oldest request not yet answered."""
        kind, payload = self._receive(timeout, what)
        if kind == "ok":
            return payload
        if kind == "fault":
            raise ChildFault(payload)
        raise RuntimeError(payload)

    def request(self, message: tuple, timeout: float, what: str) -> Any:
        self.post(message)
        return self.answer(timeout, what)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.is_alive():
            self.post(("stop",))
            self.process.join(2)
        if self.process.is_alive():
            self.process.kill()  # a hung kernel: only the process's death frees the GPU
            self.process.join(10)
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(5)  # a send blocked on the dead child fails, and the thread ends
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn, self._sender = None, None, None


# ------------------------------------------------------------------ the compile pool


@dataclass(frozen=True)
class _Compiled:
    cubin: bytes | None
    resources: dict[str, Any]
    seconds: float
    error: str | None = None


def _compile_job(family_ref: Any, config: dict[str, int], arch: str, cache_dir: str | None
                 ) -> _Compiled:
    family = kernels.get_family(family_ref) if isinstance(family_ref, str) else family_ref
    start = time.perf_counter()
    try:
        compiled = kernels.compile_config(family, config, arch=arch, cache_dir=cache_dir)
    except kernels.CompileError as error:
        return _Compiled(None, {}, time.perf_counter() - start, str(error))
    return _Compiled(compiled.cubin, dict(compiled.resources), compiled.seconds)


def family_id(family: Any) -> tuple:
    """A family as it builds programs: its name and source, and the layout and batch it is
    bound to (one command tunes several layouts of a family: their programs differ)."""
    return (family.name, family.source_hash, *kernels.bound_to(family))


def program_id(family: Any, config: Mapping[str, int]) -> tuple:
    """A config's program, cheaply: ``family_id`` and the config."""
    return (*family_id(family), config_key(config))


def _family_ref(family: Any) -> Any:
    # Registered families travel by name; others (planted test kernels) as pickled objects.
    return family.name if kernels.FAMILIES.get(family.name) is family else family


# Compile workers ``compile_ahead`` leaves idle: the search's next asks that it did not foresee
# start at once instead of queueing behind a guess.
SPARE_WORKERS = 2

# Cores left to the main thread (asks, tells, stores) and the GPU child (launches, verification).
RESERVED_CORES = 2


def default_workers(cores: int | None = None) -> int:
    """Compile processes for this host: every core but the main thread's and the GPU child's
    (a 16-core GPU host: 14). NVRTC is single-threaded and a compile takes 0.1-3 s of CPU
    (docs/measurement.md, "Compile time (bench/compile_time.py)"), so compile workers bound
    configs per second."""
    cores = (os.cpu_count() or 2) if cores is None else cores
    return max(1, cores - RESERVED_CORES)


@dataclass
class Ticket:
    """One candidate handed to the evaluator by ``submit``; ``collect`` turns it into its
    Measurement. ``answer`` is set at once where no GPU is needed (a compile error), or when the
    answer was read ahead of its collect (a synchronous request had to pass it)."""

    request: tuple | None
    common: dict[str, Any] = field(default_factory=dict)
    posted_at: float = 0.0
    answer: Measurement | None = None
    lane: _Lane | None = None  # the GPU it was posted to


def _worker_init(parent_pid: int) -> None:
    child_init(parent_pid)
    kernels.nvrtc_version()  # loads NVRTC now: the first compile then only compiles


class CompilePool:
    def __init__(self, arch: str | None, cache_dir: Path | str | None, workers: int) -> None:
        self.arch = arch  # None until known (LiveEvaluator: the GPU child says), before a submit
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        # compiles queued or running, by the CUBIN they build (``cubin_key``)
        self._building: dict[str, Future[_Compiled]] = {}
        self._begun: set[str] = set()  # CUBINs ``begin`` started or found cached
        self._keys: dict[tuple, str] = {}  # ``_cubin_key``'s
        self._ahead: set[str] = set()  # CUBINs ``begin`` started that no submit has asked for
        self.ahead_begun = 0  # compiles ``begin`` started
        self.ahead_taken = 0  # of those, asked for by a submit afterwards

    def _pool(self) -> ProcessPoolExecutor:
        # The executor starts its processes from the calling thread, and each one's
        # parent-death signal is tied to that thread (tuner.lifetime): submit from a thread
        # that lives as long as the pool (the tuner's main thread does).
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=mp.get_context("spawn"),
                initializer=_worker_init, initargs=(os.getpid(),),
            )
        return self._executor

    def start(self) -> list[Future[int]]:
        """Start every worker process now (each imports the tuner and loads NVRTC, ~1-2 s),
        instead of at the first compiles, where the GPU would wait for them (docs/measurement.md, "Compile pool"): the
        executor starts one per job submitted while none is idle. Each answers its pid."""
        pool = self._pool()
        return [pool.submit(os.getpid) for _ in range(self.workers)]

    def submit(self, family: Any, config: dict[str, int]) -> Future[_Compiled]:
        """The config's compile, queued on the workers; a CUBIN the cache holds already (the
        prior's compiles, an earlier command's) is read here instead, a millisecond, so that it
        does not wait in the queue behind other compiles (a new study's first candidates queued
        behind the compiles its predecessor left running). A config whose CUBIN is being built
        for another (they differ only in launch-time parameters) gets that compile's future:
        a second job would hold a worker waiting on the cache entry's lock."""
        assert self.arch is not None, "the pool's architecture is set before its first compile"
        try:
            key: str | None = self._cubin_key(family, config)
        except kernels.ConfigError:
            key = None  # the worker raises it, as for any rejected config
        if key in self._ahead:
            self._ahead.discard(key)
            self.ahead_taken += 1
        found = self._cached(key) if key is not None else None
        if found is not None:
            return found
        building = self._building.get(key) if key is not None else None
        if building is not None and not building.cancelled():
            return building
        return self._start(key, family, config)

    def compiled(self, family: Any, config: dict[str, int]) -> Future[_Compiled] | None:
        """The config's compile where it is done now (a finished job, or a CUBIN the cache
        holds), else None: nothing is started or waited for."""
        try:
            key = self._cubin_key(family, config)
        except kernels.ConfigError:
            return None
        building = self._building.get(key)
        if building is not None:
            return building if building.done() and not building.cancelled() else None
        return self._cached(key)

    def _cached(self, key: str) -> Future[_Compiled] | None:
        found = cached_cubin(key, self.arch, self.cache_dir)
        if found is None:
            return None
        done: Future[_Compiled] = Future()
        done.set_result(_Compiled(found.cubin, dict(found.resources), found.seconds))
        return done

    def _start(self, key: str | None, family: Any, config: dict[str, int]
               ) -> Future[_Compiled]:
        job = self._pool().submit(_compile_job, _family_ref(family), dict(config), self.arch,
                                  self.cache_dir)
        if key is not None:
            self._building[key] = job
            job.add_done_callback(lambda _: self._building.pop(key, None))  # cached from now on
        return job

    def _cubin_key(self, family: Any, config: Mapping[str, int]) -> str:
        """``cubin_key`` (the program's text rendered and hashed, on the main thread) once per
        config: a config ``begin`` started is submitted again when it is asked for."""
        name = program_id(family, config)
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = cubin_key(family, config, self.arch)
        return key

    def run(self, job: Callable[..., Any], *args: Any) -> Future[Any]:
        """Other CPU work on these processes, queued behind the compiles asked so far: what the
        command's start has for them while they are idle (nothing waits on it to compile)."""
        return self._pool().submit(job, *args)

    def idle(self) -> int:
        """Workers with no compile queued for them (each job in ``_building`` holds one)."""
        return max(0, self.workers - len(self._building))

    def building(self) -> tuple[int, int]:
        """Compiles queued or running now, and how many of them ``begin`` started that no
        submit has asked for yet (bench/throughput.py samples both)."""
        keys = list(self._building)  # (read from a sampling thread: copy before iterating)
        return len(keys), sum(key in self._ahead for key in keys)

    def begin(self, family: Any, config: dict[str, int]) -> bool:
        """Start the config's compile for the cache where its CUBIN is neither cached nor
        being built; whether one was started. Nothing waits for it: a later ``submit`` of it
        (or of a config sharing its CUBIN) takes it from the cache or shares the job."""
        try:
            key = self._cubin_key(family, config)
        except kernels.ConfigError:
            return False
        if key in self._begun or key in self._building:
            return False
        self._begun.add(key)
        if cached_cubin(key, self.arch, self.cache_dir) is not None:
            return False
        self._start(key, family, config)
        self._ahead.add(key)
        self.ahead_begun += 1
        return True

    def usage(self, family: Any) -> Resources:
        """The static prior's ``Resources`` compiled by these processes (blocking, through the
        CUBIN cache): a command's first start-up ranks while they are otherwise idle, instead
        of compiling on threads of the main process, whose NVRTC is cold and whose other
        threads hold the GIL meanwhile. None where a config does not compile."""

        def usage(config: Mapping[str, int]) -> Usage | None:
            try:
                compiled = self.submit(family, dict(config)).result()
            except kernels.ConfigError:
                return None
            main = compiled.resources.get(MAIN_KERNEL)
            return None if compiled.error is not None or main is None else usage_of(main)

        return usage

    def close(self) -> None:
        """End the workers now, compiles in flight too: what the command still needed it has
        collected; the rest would only be cached for a later one."""
        if self._executor is not None:
            kill_pool(self._executor)
            self._executor = None
        self._building.clear()


# ------------------------------------------------------------------ the evaluator


ALL_DEVICES = "all"


@dataclass(frozen=True)
class Opening:
    """What the GPU measures first, while the command's search is still starting (its imports,
    the stores, the first study's start-up): the first problem, with its inputs, reference and
    cuBLAS baseline, and candidates its studies ask for first whatever their search (declared
    starting points), chosen once the GPU's architecture is known (``candidates(arch)``: bound
    families and configs, in the order they are asked). Each answer waits for the study's ask,
    which takes it instead of measuring again (docs/measurement.md, "The command's start and
    end")."""

    problem: Problem
    candidates: Callable[[str], list[tuple[Any, dict[str, int]]]]
    # Called with the evaluator once its GPU processes are ready, before the candidates are
    # listed: other work of the start that needs the GPU's model, architecture or SM count
    # (tuner.run.tune.opening: the first shape's prior compiles).
    ready: Callable[[Any], None] | None = None


# How often the opening's thread looks whether the command has stopped it (wait_started).
_OPENING_POLL_S = 0.05


@dataclass
class _Lane:
    """One GPU of the evaluator: its child process and the tickets posted to it, not yet
    answered, in order."""

    child: GpuChild
    queued: deque[Ticket] = field(default_factory=deque)
    answered_at: float = 0.0  # when the child's last answer was read


class LiveEvaluator:
    """Evaluator on a real GPU (or, with ``backend="tuner.testing"``, on the CPU stand-in), or
    on several GPUs of one host."""

    def __init__(
        self,
        device: int | Iterable[int] | str = 0,
        *,
        cache_dir: Path | str | None = None,
        workers: int | None = None,
        trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
        setup_timeout_s: float = SETUP_TIMEOUT_S,
        backend: str = DEFAULT_BACKEND,
        backend_options: dict[str, Any] | None = None,
        queue_depth: int = QUEUE_DEPTH,
        wait: bool = True,
        opening: Opening | None = None,
    ) -> None:
        """Starts the GPU children and the compile processes. ``device``: a CUDA device index,
        several (one child each), or ``"all"`` (every GPU the first child's driver sees).
        ``wait``: return once they are ready (raising GpuUnavailable or RuntimeError where a
        child cannot measure or the GPUs are of several models); else at once, and
        ``wait_started`` does that later (the caller imports meanwhile). ``opening``: measured
        from the moment the children are ready: with ``wait`` all of it is posted before the
        return; else on a thread, as its compiles finish, until the caller first hands the
        evaluator work (``_take_over``)."""
        self.trial_timeout_s = trial_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.queue_depth = max(1, queue_depth)
        self.phases = Phases()  # the command's one accumulator (the study run adds its own)
        self._backend, self._backend_options = backend, backend_options or {}
        self._count_devices = device == ALL_DEVICES
        if self._count_devices:
            devices = [0]
        elif isinstance(device, int):
            devices = [device]
        else:
            devices = list(device)  # type: ignore[arg-type]
        if not devices or len(set(devices)) != len(devices):
            raise ValueError(f"devices must be distinct CUDA device indices, got {devices}")
        self.lanes = [_Lane(GpuChild(d, backend, self._backend_options)) for d in devices]
        # the compile processes start while the GPU children do (part of the one-time start)
        self.pool = CompilePool(None, cache_dir, workers or default_workers())
        self.problem: Problem | None = None
        self.replacements = 0
        self._compiles: dict[tuple, Future[_Compiled]] = {}
        self._warming: list[Future[int]] = []
        # the opening's: tickets posted, by (program, problem); compiles not yet posted when
        # wait_started stopped it (then prepared compiles); the cuBLAS baseline (or its error)
        self._opened: dict[tuple, Ticket] = {}
        self._opening_left: dict[tuple, tuple[Any, dict[str, int], Future[_Compiled]]] = {}
        self._opening_baseline: tuple[Problem, dict[str, Any] | RuntimeError] | None = None
        self._stop_opening = threading.Event()
        self._ready = threading.Event()  # the children and the compile processes started
        self._start_error: BaseException | None = None
        self._starting: threading.Thread | None = None  # the start's, then the opening's
        self._started = False
        try:
            self._warming = self.pool.start()
            for lane in self.lanes:
                lane.child.launch()
        except BaseException:
            self.close()
            raise
        if wait:
            self._start(opening)
            self.wait_started()
        else:
            self._starting = threading.Thread(target=self._start, args=(opening,),
                                              name="gemmtune-start", daemon=True)
            self._starting.start()

    @property
    def child(self) -> GpuChild:
        """The first GPU's child: the GPU model and the cuBLAS baseline come from it."""
        return self.lanes[0].child

    @property
    def devices(self) -> list[int]:
        return [lane.child.device for lane in self.lanes]

    def wait_started(self) -> None:
        """Wait until the GPU children are ready and every compile process has started (at
        once after the first time); the opening goes on posting until ``_take_over``. A child
        that cannot measure raises GpuUnavailable or RuntimeError, as do GPUs of several
        models, and the evaluator is closed."""
        if self._started:
            return
        if self._starting is not None:
            self._ready.wait()
        try:
            if self._start_error is not None:
                self._take_over()
                error, self._start_error = self._start_error, None
                raise error
            if self._count_devices:
                self._take_over()  # the opening's thread posts to the lanes this adds to
                self._add_counted_lanes()
        except BaseException:
            self.close()
            raise
        self._started = True

    def _take_over(self) -> None:
        """The caller's first work for the evaluator (a compile, a ticket, a problem): the
        opening stops where it is, and what it has not posted yet stays as prepared compiles.
        Until then it posts each candidate as its compile finishes, through the imports, the
        stores' opening and the first study's set-up, while the GPU would otherwise wait
        (docs/measurement.md, "The command's start and end"). From here only the caller's
        thread touches the children."""
        if self._starting is None:
            return
        self._stop_opening.set()
        self._starting.join()
        self._starting = None
        for key, (family, config, future) in self._opening_left.items():
            self._compiles.setdefault(key[0], future)
        self._opening_left.clear()

    def _start(self, opening: Opening | None) -> None:
        """The start (``wait_started`` raises what it raised), then the opening: on the
        caller's thread, or on the evaluator's start thread while the command imports."""
        try:
            for lane in self.lanes:
                lane.child.wait_ready(self.setup_timeout_s)
            self._check_one_model()
            self.pool.arch = self.child.arch
            for future in self._warming:
                future.result()
            if opening is not None:
                self._open(opening)
        except BaseException as error:  # noqa: BLE001  raised again by wait_started
            self._start_error = error
            return
        finally:
            self._ready.set()
        if opening is None:
            return
        try:
            self._post_opening(opening.problem)
        except BaseException:  # noqa: BLE001  the command goes on without the rest of it
            log.warning("the opening stopped on an error; the search measures without it",
                        exc_info=True)

    def _add_counted_lanes(self) -> None:
        """With ``"all"``: a lane for each other GPU the first child counted, given the problem
        the opening set. Launched here, on the command's thread: a child's parent-death signal
        is tied to the thread that started it (tuner.lifetime), and the start thread ends."""
        if not self._count_devices:
            return
        self._count_devices = False
        more = [_Lane(GpuChild(d, self._backend, self._backend_options))
                for d in range(1, self.child.devices)]
        self.lanes += more
        for lane in more:
            lane.child.launch()
        for lane in more:
            lane.child.wait_ready(self.setup_timeout_s)
        self._check_one_model()
        if self.problem is not None:
            for lane in more:
                lane.child.request(_problem_request(self.problem), self.setup_timeout_s,
                                   f"preparing problem {self.problem.shape}")

    def _check_one_model(self) -> None:
        models = {lane.child.device: lane.child.info.get("name") for lane in self.lanes}
        if len(set(models.values())) > 1:
            raise RuntimeError(
                "one command tunes one GPU model, and these are several: "
                + ", ".join(f"GPU {d} is {name}" for d, name in models.items())
                + "; name the GPUs of one model, and tune the others with a command of their own")

    def _open(self, opening: Opening) -> None:
        """Set the opening's problem up and time cuBLAS on it while its candidates compile.
        (Off the main thread: no phases are timed here, and nothing else reads the children
        until ``_take_over``.)"""
        problem = opening.problem
        if opening.ready is not None:
            try:
                opening.ready(self)
            except Exception:  # noqa: BLE001  as the candidates below
                log.warning("the start's work for a ready GPU failed; the search starts "
                            "without it", exc_info=True)
        try:
            candidates = opening.candidates(self.arch())
        except Exception:  # noqa: BLE001  a faster start is not worth a failed command
            log.warning("the opening's candidates could not be listed; the search starts "
                        "without them", exc_info=True)
            candidates = []
        for family, config in candidates:
            key = (self._key(family, config), problem)
            if key not in self._opening_left:
                self._opening_left[key] = (family, config, self.pool.submit(family, config))
        self._post_problem(problem)
        try:
            self._opening_baseline = (problem, self._request_baseline())
        except RuntimeError as error:  # no cuBLAS: raised again at the command's baseline
            self._opening_baseline = (problem, error)

    def _post_opening(self, problem: Problem) -> None:
        """Post each opening candidate as its compile finishes, until ``_take_over``."""
        while self._opening_left and not self._stop_opening.is_set():
            futures = [future for _, _, future in self._opening_left.values()]
            wait(futures, timeout=_OPENING_POLL_S, return_when=FIRST_COMPLETED)
            for key in [key for key, (_, _, future) in self._opening_left.items() if future.done()]:
                family, config, future = self._opening_left.pop(key)
                self._open_compiled(key, family, config, future)

    def _open_compiled(self, key: tuple, family: Any, config: dict[str, int],
                       compiled: Future[_Compiled]) -> None:
        """Post a candidate asked for ahead of its study (``key``: its program and problem) once
        its compile is done; its answer waits in ``_opened`` for the study's ask. A compile
        that raised is left to the ask, which compiles it and says why."""
        try:
            done = compiled.result()
        except Exception:  # noqa: BLE001
            return
        self._opened[key] = self._send(self._ticket(family, config, key[1], done))

    def post_ahead(self, family: Any, configs: Iterable[dict[str, int]]) -> int:
        """Hand the GPU children these configs of the current problem now, as the opening does
        at the command's start, for a study not yet built that asks them first: their answers
        wait for its asks (``submit`` takes them), or are read in turn and dropped where none
        comes. Only those compiled already (a tuned shape's, in the CUBIN cache): the others'
        compiles go on as prepared compiles for the asks, never waited for here. How many were
        posted."""
        return self._post_configs(family, configs, compile=True)

    def post_compiled(self, family: Any, configs: Iterable[dict[str, int]], limit: int) -> int:
        """``post_ahead`` of at most ``limit`` configs, of those whose compile is done now:
        nothing is compiled for the others (the running study's compiles keep the workers)."""
        return self._post_configs(family, configs, compile=False, limit=limit)

    def _post_configs(self, family: Any, configs: Iterable[dict[str, int]], compile: bool,
                      limit: int | None = None) -> int:
        self._take_over()
        if self.problem is None:
            return 0
        posted = 0
        for config in configs:
            if limit is not None and posted >= limit:
                break
            key = (self._key(family, config), self.problem)
            if key in self._opened:
                continue
            future = self._compiles.pop(key[0], None)
            if future is None:
                future = (self.pool.submit(family, config) if compile
                          else self.pool.compiled(family, config))
                if future is None:
                    continue
            if not future.done():
                self._compiles[key[0]] = future
                continue
            self._open_compiled(key, family, config, future)
            opened = self._opened.get(key)
            posted += opened is not None and opened.request is not None  # (not a compile error)
        return posted

    def posted(self, family: Any, problem: Problem) -> list[dict[str, int]]:
        """The configs of ``family`` posted ahead for ``problem`` (the opening, ``post_ahead``)
        that no ask has taken: measured, or being measured, for a study that has not asked for
        them (``StudyRun._take_posted`` takes them before its run ends)."""
        identity = family_id(family)
        return [dict(program[-1]) for program, posted_for in self._opened
                if posted_for == problem and program[:-1] == identity]

    def posted_ahead(self) -> int:
        """Configs posted ahead of their studies (``post_ahead``, the opening) whose answers
        have not been read yet: about what the GPU has still to measure for studies not
        asking yet."""
        return sum(1 for ticket in self._opened.values() if ticket.answer is None)

    @property
    def tickets(self) -> int:
        """Candidates it takes at once: ``queue_depth`` for each GPU child. (The search once
        kept ``queue_depth`` in all: three in flight for four GPUs left one idle at every
        moment; docs/fleet.md, "What holds several GPUs back".)"""
        return self.queue_depth * len(self.lanes)

    @property
    def batch(self) -> int:
        """How many candidates the search should keep in flight: one compiling per worker
        besides those queued with the GPU children, so compiles run ahead of the GPUs."""
        return self.pool.workers + self.tickets

    def info(self) -> dict[str, Any]:
        return dict(self.child.info)

    def arch(self) -> str:
        return self.child.arch

    def set_problem(self, problem: Problem) -> None:
        self._take_over()
        if problem == self.problem:
            return  # inputs and the float64 reference are already in place
        self._drain()
        self._opened.clear()  # answered by the drain, for another problem
        with self.phases.timed(SETUP):
            self._post_problem(problem)

    def _post_problem(self, problem: Problem) -> None:
        for lane in self.lanes:  # every GPU builds its inputs at the same time
            lane.child.post(_problem_request(problem))
        for lane in self.lanes:
            lane.child.answer(self.setup_timeout_s, f"preparing problem {problem.shape}")
        self.problem = problem

    def baseline(self) -> Baseline:
        """cuBLAS on the first GPU: the study's one baseline, whichever GPU measured a config
        (the opening's, where it timed this problem)."""
        self._take_over()
        opened, self._opening_baseline = self._opening_baseline, None
        if opened is not None and opened[0] == self.problem:
            result = opened[1]
            if isinstance(result, RuntimeError):
                raise result
        else:
            self._drain()
            with self.phases.timed(SETUP):
                result = self._request_baseline()
        return Baseline(result.get("library", "cublas"), float(result["time_median_ms"]),
                        float(result["gflops"]), result.get("sm_clock_mhz"))

    def _request_baseline(self) -> dict[str, Any]:
        return self.child.request(("baseline",), self.setup_timeout_s, "timing cuBLAS")

    def _key(self, family: Any, config: dict[str, int]) -> tuple:
        return program_id(family, config)

    def prepare(self, family: Any, config: dict[str, int]) -> None:
        self._take_over()
        key = self._key(family, config)
        if key not in self._compiles and (key, self.problem) not in self._opened:
            with self.phases.timed(PREPARE):
                self._compiles[key] = self.pool.submit(family, config)

    def discard(self, family: Any, config: dict[str, int]) -> None:
        """The study let a prepared candidate go: its compile is cancelled where it has not
        begun and no other prepared config shares it, and its result is not kept (it was held
        until the evaluator closed)."""
        self._take_over()
        key = self._key(family, config)
        self._opened.pop((key, self.problem), None)  # (answered in turn, then dropped)
        future = self._compiles.pop(key, None)
        if future is not None and not any(other is future for other in self._compiles.values()):
            future.cancel()

    def compile_ahead(self, family: Any, configs: Iterable[dict[str, int]]) -> int:
        """Begin the compiles of ``configs`` (in order; those cached or being built are
        skipped) on workers that are idle now, leaving ``SPARE_WORKERS`` idle for the
        candidates asked next; how many began. For the configs a search will likely ask
        for next (``ModelSampler.upcoming``): when it asks, their compiles are done or
        under way instead of starting then."""
        self._take_over()
        began, configs = 0, iter(configs)
        with self.phases.timed(PREPARE):
            while self.pool.idle() > SPARE_WORKERS:  # (checked before one more is taken)
                config = next(configs, None)
                if config is None:
                    break
                began += self.pool.begin(family, config)
        return began

    def ready(self, family: Any, config: dict[str, int]) -> bool:
        """Whether the config's compile (``prepare``) has finished: submit takes it at once."""
        self._take_over()
        key = self._key(family, config)
        future = self._compiles.get(key)
        return (key, self.problem) in self._opened or (future is not None and future.done())

    def wait_any(self, family: Any, configs: Iterable[dict[str, int]]) -> None:
        """Block until the compile of one of the prepared ``configs`` is done (at once where
        one is, or none of them is prepared)."""
        self._take_over()
        futures = [future for config in configs
                   if (future := self._compiles.get(self._key(family, config))) is not None]
        if futures:
            with self.phases.timed(COMPILE_WAIT):
                wait(futures, return_when=FIRST_COMPLETED)

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Measurement:
        return self.collect(self.submit(family, config, problem))

    def submit(self, family: Any, config: dict[str, int], problem: Problem) -> Ticket:
        """Wait for the config's compile and hand it to the GPU child; returns at once after
        (the opening's ticket, where it posted this config). Collect tickets in the order they
        were submitted."""
        self._take_over()
        if problem != self.problem:
            self.set_problem(problem)
        key = self._key(family, config)
        opened = self._opened.pop((key, problem), None)
        if opened is not None:
            return opened
        future = self._compiles.pop(key, None)
        if future is None:
            with self.phases.timed(PREPARE):
                future = self.pool.submit(family, config)
        with self.phases.timed(COMPILE_WAIT):
            compiled = future.result()
        ticket = self._ticket(family, config, problem, compiled)
        if ticket.request is None:
            return ticket
        with self.phases.timed(GPU_SEND):
            return self._send(ticket)

    def _ticket(self, family: Any, config: dict[str, int], problem: Problem,
                compiled: _Compiled) -> Ticket:
        """The GPU child's request for a compiled config (answered at once: a compile error)."""
        if compiled.cubin is None:
            return Ticket(None, answer=Measurement(state=COMPILE_ERROR, error=compiled.error,
                                                   compile_seconds=compiled.seconds))
        used = summarize(family, config, problem, compiled.resources, self.arch())
        common = {
            "compile_seconds": compiled.seconds, "registers": used.registers,
            "shared_bytes": used.shared_bytes, "spill_bytes": used.spill_bytes,
            "occupancy": used.occupancy,
        }
        m, n, k = problem.m, problem.n, problem.k
        return Ticket(("evaluate", compiled.cubin, family.launches(config, m, n, k),
                       family.workspace_bytes(config, m, n, k), family.flops(m, n, k)), common)

    def _send(self, ticket: Ticket) -> Ticket:
        """Post a ticket with a request to the GPU with the fewest waiting."""
        if ticket.request is None:
            return ticket
        lane = min(self.lanes, key=lambda lane: len(lane.queued))  # the first among equals
        ticket.lane = lane
        self._post(lane, ticket)
        lane.queued.append(ticket)
        return ticket

    def collect(self, ticket: Ticket) -> Measurement:
        """The measurement of a submitted candidate (blocks until its GPU's child answers it)."""
        self._take_over()
        while ticket.answer is None:
            lane = ticket.lane
            assert lane is not None and lane.queued, "a ticket of another evaluator"
            # answers come in order per GPU: one read ahead of its collect is kept on its ticket
            head = lane.queued[0]
            head.answer = self._answer(lane, head)
        return ticket.answer

    def _post(self, lane: _Lane, ticket: Ticket) -> None:
        assert ticket.request is not None
        ticket.posted_at = time.monotonic()
        lane.child.post(ticket.request)

    def _answer(self, lane: _Lane, ticket: Ticket) -> Measurement:
        """Read the answer to the lane's oldest queued ticket. Its time limit runs from when the
        child could start on it: its posting, or the answer before it, whichever came later."""
        started = max(ticket.posted_at, lane.answered_at)
        remaining = max(0.0, started + self.trial_timeout_s - time.monotonic())
        common = ticket.common
        try:
            with self.phases.timed(GPU_WAIT):
                result = lane.child.answer(remaining, "evaluating a candidate")
        except ChildTimeout:
            why = (f"GPU process gave no answer within {self.trial_timeout_s:g} s while "
                   "evaluating a candidate")
            lane.queued.popleft()
            self._replace_child(lane, why)
            return Measurement(state=TIMEOUT, error=f"{why}; the GPU process was replaced",
                               **common)
        except (ChildFault, ChildCrashed) as error:
            lane.queued.popleft()
            self._replace_child(lane, str(error))
            return Measurement(state=CRASHED, error=f"{error}; the GPU process was replaced",
                               **common)
        except RuntimeError as error:  # the bench itself raised: keep the text, start clean
            lane.queued.popleft()
            self._replace_child(lane, "unexpected error in the GPU process")
            return Measurement(state=CRASHED, error=str(error), **common)
        lane.queued.popleft()
        lane.answered_at = time.monotonic()
        self.phases.add_child(result.get("phases"), result.get("kernel_s"),
                              lane.answered_at - ticket.posted_at, result.get("span"))
        return Measurement(
            state=result["state"], error=result.get("error"),
            time_min_ms=result.get("time_min_ms"), time_median_ms=result.get("time_median_ms"),
            time_max_ms=result.get("time_max_ms"), launches=result.get("launches"),
            gflops=result.get("gflops"), sm_clock_mhz=result.get("sm_clock_mhz"), **common,
        )

    def _drain(self) -> None:
        """Read every queued answer (kept on its ticket) before a synchronous request."""
        for lane in self.lanes:
            while lane.queued:
                head = lane.queued[0]
                head.answer = self._answer(lane, head)

    def _replace_child(self, lane: _Lane, why: str) -> None:
        log.warning("replacing the GPU process of GPU %d: %s", lane.child.device,
                    why.splitlines()[0] if why else why)
        with self.phases.timed(REPLACE):
            lane.child.stop()
            lane.child.start(self.setup_timeout_s)
            self.replacements += 1
            if self.problem is not None:  # (not set_problem: it would wait for the queues)
                problem, self.problem = self.problem, None  # unset if the new child fails too
                lane.child.request(_problem_request(problem), self.setup_timeout_s,
                                   f"preparing problem {problem.shape}")
                self.problem = problem
        # the candidates queued behind the failed one were never measured: the new child gets them
        lane.answered_at = time.monotonic()
        for ticket in lane.queued:
            self._post(lane, ticket)

    def close(self) -> None:
        self._stop_opening.set()
        if self._ready.is_set():
            self._take_over()  # (its thread posts no more to the children stopped below)
        left = list(self._opening_left.values())  # (one step: the start thread may still post)
        for future in [*self._compiles.values(), *(future for _, _, future in left)]:
            future.cancel()
        self._compiles.clear()
        self.pool.close()
        for lane in self.lanes:
            lane.child.stop()

    def __enter__(self) -> LiveEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _problem_request(problem: Problem) -> tuple:
    return ("problem", problem.m, problem.n, problem.k, 0, problem.layout, problem.batch)
