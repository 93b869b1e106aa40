"""``python -m tuner --worker``: take tuning jobs for this GPU's model from the database, run them.

A job (db.Job, queued by the API) names a GPU model, a problem, optionally the families and a
budget. The worker claims the oldest job for its model (db.Database.claim_job: two workers never
get the same one), runs the normal studies for it (tuner.run.session.tune_all) and marks it done
or failed with the reason. While a job runs, a thread refreshes its heartbeat; a job whose worker
died (no heartbeat for --stale-after seconds) is claimed again by the next worker. The first
Ctrl-C or SIGTERM ends the trial in hand, puts the job back in the queue and exits with 130.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, TextIO

from tuner.lifetime import StopRequest
from tuner.run.options import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, BudgetOptions,
                               Options, SearchOptions, WorkerOptions)
from tuner.run.tune import (Stores, new_session, open_stores, recorded_families, register_gpu,
                            start_live)
from tuner.search.fleet import Heartbeat

log = logging.getLogger(__name__)


class _JobStop:
    """What the studies of one job check between trials: the worker was told to stop, or the
    job was taken over by another worker (our heartbeat went stale), so our work is no longer
    wanted. Quacks like tuner.lifetime.StopRequest, which is all tune_all and run_study read."""

    def __init__(self, worker_stop: Any) -> None:
        self.worker_stop = worker_stop
        self.lost = threading.Event()

    @property
    def requested(self) -> bool:
        return self.worker_stop.requested or self.lost.is_set()

    def request(self) -> None:
        self.worker_stop.request()


def _job_beat(database: Any, job_id: int, worker: str, stop: _JobStop) -> Callable[[], None]:
    """One refresh of the job's heartbeat (for tuner.search.fleet.Heartbeat's thread, which logs
    a failed one and tries again next time); a lost job stops its studies."""

    def beat() -> None:
        if not stop.lost.is_set() and not database.heartbeat_job(job_id, worker):
            log.warning("job %d: another worker took it over (our heartbeat went stale); "
                        "stopping after the trial in hand", job_id)
            stop.lost.set()

    return beat


@dataclasses.dataclass
class Worker:
    """Claims and runs jobs for one GPU; `run()` returns the command's exit status."""

    evaluator: Any
    stores: Stores  # the results database (jobs too), the Optuna storage, heartbeat settings
    stop: Any  # tuner.lifetime.StopRequest
    resolve_families: Callable[[list[str]], list[Any]]  # job's family names → family objects
    check_problem: Callable[[Any], str | None]  # a reason this evaluator cannot tune it, or None
    options: WorkerOptions
    budget: BudgetOptions  # where a job's budget does not say
    search: SearchOptions
    compile_cache: Any = None  # CUBIN cache folder (None: kernels' default)
    command: str = "python -m tuner --worker"  # stored with each run, followed by "# job <id>"
    out: TextIO | None = None  # None: sys.stdout at the time of printing
    gpu_id: int = dataclasses.field(init=False, default=0)
    gpu_name: str = dataclasses.field(init=False, default="")
    name: str = dataclasses.field(
        default_factory=lambda: f"{socket.gethostname()}/pid{os.getpid()}/{uuid.uuid4().hex[:8]}")

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] worker: {text}", file=self.out or sys.stdout, flush=True)

    @property
    def database(self) -> Any:  # db.Database
        return self.stores.database

    def run(self) -> int:
        # Registering the GPU makes its model known, so jobs for it can be queued at once.
        self.gpu_id, self.gpu_name = register_gpu(self.database, self.evaluator)
        self.say(f"{self.name} takes jobs for {self.gpu_name!r} from {self.database!r}"
                 + (" (the jobs queued now, then exit)" if self.options.once
                    else f", looking every {self.options.poll_s:g} s"))
        done = 0
        while not self.stop.requested:
            job = self.database.claim_job(self.gpu_name, self.name,
                                          stale_after_s=self.stores.stale_after_s)
            if job is None:
                if self.options.once:
                    break
                self._sleep(self.options.poll_s)
                continue
            if not self._run_job(job):
                break
            done += 1
            if self.options.max_jobs is not None and done >= self.options.max_jobs:
                break
        interrupted = self.stop.requested
        self.say(f"{'stopped' if interrupted else 'exiting'} after {done} job(s)")
        return EXIT_INTERRUPTED if interrupted else EXIT_OK

    def _sleep(self, seconds: float) -> None:
        # Short naps: a signal only sets the flag, and time.sleep resumes after a handler.
        deadline = time.monotonic() + seconds
        while not self.stop.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))

    def _run_job(self, job: Any) -> bool:
        """Runs one claimed job to its end; False when the worker was stopped during it."""
        from tuner.problem import Problem

        families_text = ", ".join(job.families) or "default families"
        self.say(f"job {job.id}: {job.label} on {job.gpu_name} ({families_text}; budget "
                 f"{job.budget or 'default'}; claim {job.attempts})")
        problem = Problem(job.m, job.n, job.k, job.dtype, job.layout, job.general_alpha_beta, job.batch)
        try:
            families = self.resolve_families(job.families)
            refused = self.check_problem(problem)
        except ValueError as error:  # an unknown family, one the recording lacks
            families, refused = [], str(error)
        if refused is not None:
            self._end(job, "failed", f"cannot run it here: {refused}", [])
            return True

        job_stop = _JobStop(self.stop)
        started = time.monotonic()
        summary = None
        try:
            with Heartbeat(self.stores.heartbeat_s,
                           [_job_beat(self.database, job.id, self.name, job_stop)]):
                summary = self._tune(job, problem, families, job_stop)
        except KeyboardInterrupt:  # a second Ctrl-C: hand the job back before going
            self._release(job, "its worker was aborted")
            raise
        except Exception as error:
            log.exception("job %d failed", job.id)
            first = (str(error).strip().splitlines() or [""])[0]
            self._end(job, "failed", f"{type(error).__name__}: {first}"[:2000], [])
            return True
        run_ids = [outcome.run_id for _, _, outcome in summary.outcomes]
        if job_stop.lost.is_set():
            self.say(f"job {job.id}: taken over by another worker; runs {run_ids} stay recorded")
            return not self.stop.requested
        if self.stop.requested:
            self._release(job, f"its worker was stopped after runs {run_ids}; the studies resume")
            return False
        print(summary.table(), file=self.out or sys.stdout, flush=True)
        self._end(job, "done", _verdict(summary, problem, time.monotonic() - started), run_ids)
        return True

    def _tune(self, job: Any, problem: Any, families: list[Any], job_stop: _JobStop) -> Any:
        from tuner.run.session import tune_all

        budget, total = self.budget.for_job(job.budget)
        session = new_session(self.stores, self.evaluator, (self.gpu_id, self.gpu_name),
                              self.search, compile_cache=self.compile_cache,
                              command=f"{self.command} # job {job.id}", stop=job_stop)
        return tune_all(session, families, [problem], budget, total_seconds=total)

    def _end(self, job: Any, state: str, reason: str, run_ids: list[int]) -> None:
        import db

        try:
            self.database.finish_job(job.id, self.name, state, reason=reason, run_ids=run_ids)
        except db.InvalidInputError as error:  # taken over meanwhile: the new holder ends it
            self.say(f"job {job.id}: could not mark it {state}: {error}")
            return
        self.say(f"job {job.id}: {state}: {reason}")

    def _release(self, job: Any, reason: str) -> None:
        try:
            self.database.release_job(job.id, self.name, reason=reason)
            self.say(f"job {job.id}: back in the queue ({reason})")
        except Exception as error:  # it will be reclaimed once its heartbeat is stale
            self.say(f"job {job.id}: could not put it back in the queue: {error}")


def _verdict(summary: Any, problem: Any, seconds: float) -> str:
    best = summary.best(problem)
    if best is None:
        return f"no verified config in {seconds:.0f} s"
    family, outcome = best
    text = f"best {family.name} {outcome.best_gflops:,.0f} GFLOP/s"
    baseline = summary.baselines.get(problem)
    if baseline is not None:
        text += f" ({outcome.best_gflops / baseline.gflops:.2f} of cuBLAS)"
    return f"{text}, {len(summary.outcomes)} studies in {seconds:.0f} s"


def worker_main(options: Options) -> int:
    """``python -m tuner --worker``: the evaluator (live GPU or --replay), the stores, the loop."""
    if options.shapes_named:
        print("python -m tuner: --worker takes its shapes from the jobs; drop --shape",
              file=sys.stderr)
        return EXIT_USAGE
    if options.replay:
        from tuner.measure.recording import RecordingError
        from tuner.measure.replay import ReplayEvaluator

        try:
            evaluator = ReplayEvaluator.open(options.replay)
        except RecordingError as error:
            print(f"python -m tuner: --replay: {error}", file=sys.stderr)
            return EXIT_USAGE
        resolve, check = _replay_rules(options, evaluator)
    else:
        from tuner.measure.live import GpuUnavailable

        try:
            evaluator = start_live(options.evaluator)
        except (GpuUnavailable, RuntimeError) as reason:
            last = (str(reason).strip().splitlines() or ["unknown error"])[-1]
            print(f"python -m tuner: --worker: no usable {options.evaluator.describe()}: {last}",
                  file=sys.stderr)
            return EXIT_FAILED
        resolve, check = _live_rules(options.families)
    with evaluator:
        try:
            return _serve(options, evaluator, resolve, check)
        except KeyboardInterrupt:
            print("python -m tuner: aborted", file=sys.stderr)
            return EXIT_INTERRUPTED


def _serve(options: Options, evaluator: Any, resolve: Callable[[list[str]], list[Any]],
           check: Callable[[Any], str | None]) -> int:
    stores = open_stores(options.stores)
    if stores is None:
        return EXIT_USAGE
    with stores.database, StopRequest() as stop:
        worker = Worker(evaluator=evaluator, stores=stores, stop=stop, resolve_families=resolve,
                        check_problem=check, options=options.worker, budget=options.budget,
                        search=options.search, compile_cache=options.evaluator.cache_dir,
                        command=options.command)
        return worker.run()


def _known_families(names: list[str], family: Callable[[Any], Any]) -> list[Any]:
    """A job's family names as this worker's family objects; ValueError for an unknown name."""
    import kernels

    unknown = [n for n in names if n not in kernels.FAMILIES]
    if unknown:
        raise ValueError(f"unknown kernel family {', '.join(map(repr, unknown))}; this "
                         f"worker has {', '.join(kernels.FAMILIES)}")
    return [family(kernels.FAMILIES[n]) for n in names]


def _live_rules(default_families: list[Any]) -> tuple[Callable, Callable]:
    def resolve(names: list[str]) -> list[Any]:
        if not names:
            return list(default_families)  # --kernel, else every family
        return _known_families(names, lambda family: family)

    return resolve, lambda problem: None


def _replay_rules(options: Options, evaluator: Any) -> tuple[Callable, Callable]:
    """A replay worker can only answer what its recording holds."""
    recorded = evaluator.problems()

    def resolve(names: list[str]) -> list[Any]:
        if not names:
            return recorded_families(evaluator, options)
        return _known_families(names, evaluator.family)

    def check(problem: Any) -> str | None:
        if problem in recorded:
            return None
        return (f"the recording ({options.replay}) has no {problem.label}; it holds "
                f"{', '.join(p.shape for p in recorded)}")

    return resolve, check
