"""``python -m tuner --worker``: take tuning jobs for this GPU's model from the database, run them.

A job (db.Job, queued by the API) names a GPU model, a problem, optionally the families and a
budget. The worker claims the oldest job for its model (db.Database.claim_job: two workers never
get the same one), runs the normal studies for it (tuner.run.session.tune_all) and marks it done or
failed with the reason. While a job runs, a thread refreshes its heartbeat; a job whose worker
died (no heartbeat for --stale-after seconds) is claimed again by the next worker. The first
Ctrl-C or SIGTERM ends the trial in hand, puts the job back in the queue and exits with 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, TextIO

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 10.0
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_STALE_AFTER_S = 300.0  # a job's heartbeat older than this: its worker is taken as dead
DEFAULT_JOB_SECONDS = 780.0  # a job's studies share this wall time unless its budget says


def add_worker_arguments(parser: argparse.ArgumentParser, positive_int: Callable[[str], int],
                         positive_seconds: Callable[[str], float]) -> None:
    group = parser.add_argument_group(
        "worker", "python -m tuner --worker: take tuning jobs (POST /api/jobs, /api/best?tune=true) "
                  "for this GPU's model from the results database; --trials, --patience, "
                  "--sampler, --seed apply where a job does not say")
    group.add_argument("--worker", action="store_true",
                       help="run queued tuning jobs for this GPU's model until stopped")
    group.add_argument("--poll", type=positive_seconds, default=DEFAULT_POLL_S, metavar="SECONDS",
                       help="wait between looks at an empty queue (default: %(default)s)")
    group.add_argument("--once", action="store_true",
                       help="run the jobs queued now, then exit instead of waiting for more")
    group.add_argument("--max-jobs", type=positive_int, default=None, metavar="N",
                       help="exit after N jobs (default: no limit)")
    group.add_argument("--heartbeat", type=positive_seconds, default=DEFAULT_HEARTBEAT_S,
                       metavar="SECONDS",
                       help="how often a running job's heartbeat is refreshed (default: %(default)s)")
    group.add_argument("--stale-after", type=positive_seconds, default=DEFAULT_STALE_AFTER_S,
                       metavar="SECONDS",
                       help="claim a running job whose heartbeat is older than this: its worker "
                            "died (default: %(default)s; keep it well above --heartbeat on "
                            "every worker)")


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


class _Heartbeat:
    """A thread that refreshes the job's heartbeat every `interval` seconds until stopped."""

    def __init__(self, database: Any, job_id: int, worker: str, interval: float,
                 stop: _JobStop) -> None:
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-job-{job_id}",
                                        args=(database, job_id, worker, interval, stop),
                                        daemon=True)

    def _beat(self, database: Any, job_id: int, worker: str, interval: float,
              stop: _JobStop) -> None:
        while not self._done.wait(interval):
            try:
                if not database.heartbeat_job(job_id, worker):
                    log.warning("job %d: another worker took it over (our heartbeat went "
                                "stale); stopping after the trial in hand", job_id)
                    stop.lost.set()
                    return
            except Exception as error:  # a database hiccup: try again next beat
                log.warning("job %d: heartbeat failed: %s", job_id, error)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


@dataclasses.dataclass
class Worker:
    """Claims and runs jobs for one GPU; `run()` returns the command's exit status."""

    args: argparse.Namespace
    evaluator: Any
    database: Any  # db.Database
    storage: Any  # optuna storage
    stop: Any  # tuner.lifetime.StopRequest
    resolve_families: Callable[[list[str]], list[Any]]  # job's family names → family objects
    check_problem: Callable[[Any], str | None]  # a reason this evaluator cannot tune it, or None
    out: TextIO | None = None  # None: sys.stdout at the time of printing
    claim_trials: bool = False  # several workers on one study (tuner.search.study.Session)
    gpu_id: int = dataclasses.field(init=False, default=0)
    gpu_name: str = dataclasses.field(init=False, default="")
    name: str = dataclasses.field(
        default_factory=lambda: f"{socket.gethostname()}/pid{os.getpid()}/{uuid.uuid4().hex[:8]}")

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] worker: {text}", file=self.out or sys.stdout, flush=True)

    def run(self) -> int:
        import db
        from tuner.run.cli import EXIT_INTERRUPTED, EXIT_OK

        known = {f.name for f in dataclasses.fields(db.GpuInfo)}
        gpu_info = db.GpuInfo(**{k: v for k, v in self.evaluator.info().items() if k in known})
        # Registering the GPU makes its model known, so jobs for it can be queued at once.
        self.gpu_id = self.database.ensure_gpu(gpu_info)
        self.gpu_name = gpu_info.name
        self.say(f"{self.name} takes jobs for {self.gpu_name!r} from {self.database!r}"
                 + (" (the jobs queued now, then exit)" if self.args.once
                    else f", looking every {self.args.poll:g} s"))
        done = 0
        while not self.stop.requested:
            job = self.database.claim_job(self.gpu_name, self.name,
                                          stale_after_s=self.args.stale_after)
            if job is None:
                if self.args.once:
                    break
                self._sleep(self.args.poll)
                continue
            if not self._run_job(job):
                break
            done += 1
            if self.args.max_jobs is not None and done >= self.args.max_jobs:
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
        self.say(f"job {job.id}: {job.shape} on {job.gpu_name} ({families_text}; budget "
                 f"{job.budget or 'default'}; claim {job.attempts})")
        problem = Problem(job.m, job.n, job.k, job.dtype, job.layout, job.general_alpha_beta)
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
            with _Heartbeat(self.database, job.id, self.name, self.args.heartbeat, job_stop):
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
        from tuner.run.cli import DEFAULT_PATIENCE, DEFAULT_TRIALS, cache_dir
        from tuner.run.session import tune_all
        from tuner.search.study import Budget, Session

        args = self.args
        patience = job.budget.get("patience", getattr(args, "patience", DEFAULT_PATIENCE))
        budget = Budget(trials=job.budget.get("trials", getattr(args, "trials", DEFAULT_TRIALS)),
                        timeout_s=getattr(args, "timeout", None), patience=patience or None)
        total = job.budget.get("total_seconds")
        if total is None and budget.timeout_s is None:
            total = DEFAULT_JOB_SECONDS
        session = Session(
            database=self.database, evaluator=self.evaluator, storage=self.storage,
            gpu_id=self.gpu_id, gpu_name=self.gpu_name, sampler=getattr(args, "sampler", "default"),
            seed=getattr(args, "seed", 0), batch=getattr(self.evaluator, "batch", 1),
            progress=getattr(args, "progress", True), host=socket.gethostname(),
            command=f"{shlex.join(['python', '-m', 'tuner', *(args.argv or sys.argv[1:])])} "
                    f"# job {job.id}",
            stop=job_stop, claim_trials=self.claim_trials, heartbeat_s=args.heartbeat,
            stale_after_s=args.stale_after, compile_cache=cache_dir(args),
        )
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


def worker_main(args: argparse.Namespace) -> int:
    """``python -m tuner --worker``: the evaluator (live GPU or --replay), the stores, the loop."""
    from tuner.run.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, cache_dir

    if args.shape:
        print("python -m tuner: --worker takes its shapes from the jobs; drop --shape",
              file=sys.stderr)
        return EXIT_USAGE
    if args.replay:
        from tuner.measure.recording import RecordingError
        from tuner.measure.replay import ReplayEvaluator

        try:
            evaluator = ReplayEvaluator.open(args.replay)
        except RecordingError as error:
            print(f"python -m tuner: --replay: {error}", file=sys.stderr)
            return EXIT_USAGE
        resolve, check = _replay_rules(args, evaluator)
    else:
        from tuner.measure.live import GpuUnavailable, LiveEvaluator
        from tuner.run.cli import BACKEND_ENV

        try:
            evaluator = LiveEvaluator(args.gpu, cache_dir=cache_dir(args), workers=args.workers,
                                      trial_timeout_s=args.trial_timeout,
                                      backend=os.environ.get(BACKEND_ENV) or "tuner.gpu")
        except (GpuUnavailable, RuntimeError) as reason:
            last = (str(reason).strip().splitlines() or ["unknown error"])[-1]
            print(f"python -m tuner: --worker: no usable GPU {args.gpu}: {last}", file=sys.stderr)
            return EXIT_FAILED
        resolve, check = _live_rules(args)
    with evaluator:
        try:
            return _serve(args, evaluator, resolve, check)
        except KeyboardInterrupt:
            print("python -m tuner: aborted", file=sys.stderr)
            return EXIT_INTERRUPTED


def _serve(args: argparse.Namespace, evaluator: Any, resolve: Callable[[list[str]], list[Any]],
           check: Callable[[Any], str | None]) -> int:
    import db

    from tuner.lifetime import StopRequest
    from tuner.run.cli import EXIT_USAGE
    from tuner.run.storage import is_server, open_storage

    try:
        database = db.open_database(args.db)
    except (db.StorageError, db.InvalidInputError) as error:
        print(f"python -m tuner: cannot use the results database: {error}", file=sys.stderr)
        return EXIT_USAGE
    storage_url = args.storage or os.environ.get("GEMMTUNE_STORAGE") or database.url
    try:
        # safe when several workers open a fresh database together (tuner/run/storage.py)
        storage = open_storage(storage_url, heartbeat_s=args.heartbeat, stale_after_s=args.stale_after)
    except Exception as error:  # Optuna raises several kinds for a bad URL or unusable store
        print(f"python -m tuner: cannot use the Optuna storage {storage_url!r}: {error}",
              file=sys.stderr)
        database.close()
        return EXIT_USAGE
    with database, StopRequest() as stop:
        claims = getattr(args, "claim_trials", None)
        worker = Worker(args=args, evaluator=evaluator, database=database, storage=storage,
                        stop=stop, resolve_families=resolve, check_problem=check,
                        claim_trials=is_server(storage_url) if claims is None else claims)
        return worker.run()


def _live_rules(args: argparse.Namespace) -> tuple[Callable, Callable]:
    import kernels

    def resolve(names: list[str]) -> list[Any]:
        if not names:
            return list(args.families)  # --kernel, else every family
        unknown = [n for n in names if n not in kernels.FAMILIES]
        if unknown:
            raise ValueError(f"unknown kernel family {', '.join(map(repr, unknown))}; this "
                             f"worker has {', '.join(kernels.FAMILIES)}")
        return [kernels.FAMILIES[n] for n in names]

    return resolve, lambda problem: None


def _replay_rules(args: argparse.Namespace, evaluator: Any) -> tuple[Callable, Callable]:
    """A replay worker can only answer what its recording holds."""
    import kernels

    recorded = [entry.problem for entry in evaluator.recording.problems]

    def resolve(names: list[str]) -> list[Any]:
        if not names:
            return ([evaluator.family(f) for f in args.families] if args.kernel
                    else evaluator.families())
        unknown = [n for n in names if n not in kernels.FAMILIES]
        if unknown:
            raise ValueError(f"unknown kernel family {', '.join(map(repr, unknown))}; this "
                             f"worker has {', '.join(kernels.FAMILIES)}")
        return [evaluator.family(kernels.FAMILIES[n]) for n in names]

    def check(problem: Any) -> str | None:
        if problem in recorded:
            return None
        return (f"the recording ({args.replay}) has no {problem.shape}; it holds "
                f"{', '.join(p.shape for p in recorded)}")

    return resolve, check
