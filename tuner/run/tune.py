"""A tuning command once parsed: open the stores, register the GPU, run the studies, report.

The entry pieces of ``python -m tuner`` (a live GPU, or ``--replay``) and ``--worker``
(tuner.run.worker) share these pieces; each takes the option objects it uses (tuner.run.options),
so none of them imports the parser back.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.lifetime import StopRequest
from tuner.measure.phases import START_IMPORTS, START_WAIT, Phases
from tuner.report import configure_logging
from tuner.run.options import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE,
                               EvaluatorOptions, Options, SearchOptions, StoreOptions)
from tuner.search.choices import LEARNING

# The database layer and the search (SQLAlchemy, Optuna) are imported where they are used: a
# live run imports them while its GPU process starts (``live_main``).
if TYPE_CHECKING:
    from tuner.search.study import Session


@dataclass
class Stores:
    """The results database and the Optuna storage of one command, open, and how the command's
    workers share them."""

    database: Any  # db.Database
    storage: Any  # optuna.storages.RDBStorage
    claim_trials: bool  # register candidates before measuring them (tuner.search.fleet)
    heartbeat_s: float
    stale_after_s: float


def open_stores(options: StoreOptions) -> Stores | None:
    """Both stores, or None after saying on stderr which one is unusable (the caller exits 2)."""
    import db
    from tuner.run.storage import is_server, open_storage

    try:
        database = db.open_database(options.db_url)
    except (db.StorageError, db.InvalidInputError) as error:
        print(f"python -m tuner: cannot use the results database: {error}", file=sys.stderr)
        return None
    storage_url = options.storage_url or database.url
    try:
        # safe when several workers open a fresh database together (tuner/run/storage.py)
        storage = open_storage(storage_url, heartbeat_s=options.heartbeat_s,
                               stale_after_s=options.stale_after_s)
    except Exception as error:  # Optuna raises several kinds for a bad URL or unusable store
        print(f"python -m tuner: cannot use the Optuna storage {storage_url!r}: {error}",
              file=sys.stderr)
        database.close()
        return None
    claims = is_server(storage_url) if options.claim_trials is None else options.claim_trials
    return Stores(database, storage, claims, options.heartbeat_s, options.stale_after_s)


def register_gpu(database: Any, evaluator: Any) -> tuple[int, str]:
    """Stores the evaluator's GPU (the db.GpuInfo fields of its ``info()``): (id, name)."""
    import db

    known = {f.name for f in dataclasses.fields(db.GpuInfo)}
    info = db.GpuInfo(**{k: v for k, v in evaluator.info().items() if k in known})
    return database.ensure_gpu(info), info.name


def new_session(stores: Stores, evaluator: Any, gpu: tuple[int, str], search: SearchOptions, *,
                compile_cache: Path | None, command: str, stop: Any,
                progress: bool = True, preparer: Any = None) -> Session:
    """What every study of one command (or one job) shares."""
    from tuner.search.study import Session

    gpu_id, gpu_name = gpu
    replay = getattr(evaluator, "recording", None) is not None
    return Session(
        database=stores.database, evaluator=evaluator, storage=stores.storage,
        gpu_id=gpu_id, gpu_name=gpu_name, sampler=search.sampler, seed=search.seed,
        batch=getattr(evaluator, "batch", 1), progress=progress, host=socket.gethostname(),
        command=command, stop=stop, claim_trials=stores.claim_trials,
        heartbeat_s=stores.heartbeat_s, stale_after_s=stores.stale_after_s,
        compile_cache=compile_cache,
        # one accumulator for the command: the evaluator's own, where it keeps one
        phases=getattr(evaluator, "phases", None) or Phases(),
        # a live evaluator (it has a compile pool): a GPU waits while a study starts up
        prefetch_startup=hasattr(evaluator, "pool"),
        prefetch_process=preparer,
        # a replay answers from a recording, perhaps a bundled one: it must not learn from it
        learn_from_recordings=not replay,
        # a replay answers a config's recorded timing again: nothing to re-time
        retime_rounds=0 if replay else search.retime_rounds,
    )


def tune(options: Options, evaluator: Any, *, progress: bool = True, preparer: Any = None) -> int:
    """Everything after the evaluator exists: open the stores, run the studies, print the table.
    ``preparer``: the start-ups' process, started already (``tuner.search.preparer``)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tuner.run.session import tune_all

    if options.search.sampler in LEARNING:
        # imported while the main thread waits for the GPU child's first answers (the cuBLAS
        # baseline), not at the model's first fit mid-study
        from tuner.search.costmodel import preload

        threading.Thread(target=preload, name="preload-costmodel", daemon=True).start()
    stores = open_stores(options.stores)
    if stores is None:
        return EXIT_USAGE
    with stores.database, StopRequest() as stop, logging_redirect_tqdm():
        if options.workload is not None:  # the dashboard shows it against what gets tuned
            stores.database.save_workload(*options.workload)
        session = new_session(stores, evaluator, register_gpu(stores.database, evaluator),
                              options.search, compile_cache=options.evaluator.cache_dir,
                              command=options.command, stop=stop, progress=progress,
                              preparer=preparer)
        summary = tune_all(session, options.families, options.problems,
                           options.budget.study_budget(),
                           total_seconds=options.budget.total_seconds(), weights=options.weights)
    print()
    print(summary.table())
    return EXIT_INTERRUPTED if summary.interrupted else EXIT_OK


def start_live(options: EvaluatorOptions, *, wait: bool = True, **evaluator_options: Any) -> Any:
    """The live evaluator (GPU child + compile pool); raises GpuUnavailable or RuntimeError.
    ``wait=False``: started, not yet ready (``LiveEvaluator.wait_started`` raises those).
    ``evaluator_options``: more of LiveEvaluator's (a benchmark's stand-in options)."""
    from tuner.measure.live import LiveEvaluator

    return LiveEvaluator(options.devices, cache_dir=options.cache_dir, workers=options.workers,
                         trial_timeout_s=options.trial_timeout_s, backend=options.backend,
                         wait=wait, **evaluator_options)


def opening(options: Options, preparing: Any = None) -> Any:
    """What the GPU measures while the command still starts (``tuner.measure.live.Opening``):
    the declared starting points of every study of the first problem, in the order the
    studies run, those each family accepts on the GPU (no more per family than a study's trial
    budget); then every accepted config of each family whose whole space is within that budget
    (naive's 48, smem's 3), which its study takes whether it asks for them or not
    (``StudyRun._take_posted``). Each study's warm start asks for the starting points first,
    whatever the search, so the GPU measures from its first second instead of after the first
    start-up, and through the imports, the stores' opening and the first study's set-up
    (docs/measurement.md, "The command's start and end", "Small spaces in the opening"). Once
    the GPU is ready, ``preparing`` (the start-ups' processes) begins the prior's compiles of
    the first problem's first study that starts from the prior after its first
    (``preparer.compile_prior``). None where there is no study."""
    import kernels
    from tuner.measure.live import Opening
    from tuner.search import preparer

    if not options.problems or not options.families:
        return None
    problem = options.problems[0]
    most = options.budget.trials

    def candidates(arch: str) -> list[tuple[Any, dict[str, int]]]:
        offered = [kernels.bind(family, problem.layout, problem.batch)
                   for family in options.families if family.offered_on(arch)]
        chosen: list[tuple[Any, dict[str, int]]] = []
        for family in offered:
            accepted = [dict(config) for config in family.starting_points
                        if not family.refusals(dict(config), arch)]
            chosen += [(family, config) for config in accepted[:most]]
        for family in offered:  # then the small spaces whole: their studies take every answer
            if family.space_size() <= most:
                listed = [config for f, config in chosen if f.name == family.name]
                chosen += [(family, dict(config)) for config in family.accepted_configs(arch)
                           if dict(config) not in listed]
        return chosen

    def ready(evaluator: Any) -> None:
        arch, info = evaluator.arch(), evaluator.info()
        later = [f.name for f in options.families if f.offered_on(arch)][1:]
        # with one preparing process (under 16 cores) the start-ups planned behind this job
        # waited for it: smem's 5.0 s on the 2-core machine, what blocktile1d's saved
        if (preparing is not None and preparer.processes() > 1 and later
                and int(info.get("sm_count") or 0) >= 1):
            cache = options.evaluator.cache_dir
            preparing.submit(preparer.compile_prior, later, info["name"], arch, problem,
                             int(info["sm_count"]), evaluator.batch, options.search.seed,
                             None if cache is None else str(cache), options.search.sampler)

    return Opening(problem, candidates, ready)


def start_command(options: Options, **evaluator_options: Any) -> tuple[Any, Any]:
    """A live command's one-time start: the GPU process, the compile processes and the
    start-ups' process (tuner.search.preparer) started first; while they start CUDA, cuBLAS,
    NVRTC and their imports (1-2 s on the H100 host), this one imports the search and the
    stores (Optuna, SQLAlchemy: 2.5-3.5 s there); then waits for them and loads the GPU
    model's bundled recordings the model's first fits learn from, their feature rows laid out
    meanwhile by the idle compile processes (docs/measurement.md, "The command's start and
    end"). The GPU process measures the ``opening`` from its start. Returns (evaluator, the
    start-ups' process); raises as ``start_live``, everything it started ended then."""
    from tuner.lifetime import kill_pool
    from tuner.search import preparer

    process = preparer.start()
    try:
        evaluator = start_live(options.evaluator, wait=False, opening=opening(options, process),
                               **evaluator_options)
    except BaseException:
        kill_pool(process)
        raise
    try:
        with evaluator.phases.timed(START_IMPORTS):
            import tuner.run.session  # noqa: F401

            configure_logging(options.verbose)  # after Optuna's import, which sets its level
            if options.search.sampler in LEARNING:
                import sklearn.ensemble  # noqa: F401  the first fit's import (0.7-2.5 s), not with the GPU idle
        with evaluator.phases.timed(START_WAIT):
            evaluator.wait_started()
        if options.search.sampler in LEARNING:
            from tuner.measure.recording import bundled, bundled_names
            from tuner.search.learned import lay_out_bundled

            gpu = evaluator.info()["name"]
            for name in bundled_names(gpu):  # the first start-up reads their rows from disk
                evaluator.pool.run(lay_out_bundled, gpu, name)
            with evaluator.phases.timed(START_IMPORTS):
                # only this GPU model's: all the model reads (tuner.search.learned); every
                # model's took 1.24 s more on the 2-core machine
                bundled(gpu)
    except BaseException:
        evaluator.close()  # (idempotent: wait_started closes it too where the GPU fails)
        kill_pool(process)
        raise
    return evaluator, process


def live_main(options: Options) -> int:
    """``python -m tuner``: tune on a GPU."""
    from tuner.lifetime import kill_pool
    from tuner.measure.live import GpuUnavailable

    gpu = options.evaluator.describe()
    try:
        evaluator, process = start_command(options)
    except GpuUnavailable as reason:
        print(f"python -m tuner: no usable {gpu}: {reason}\n"
              "Tuning needs an NVIDIA GPU and driver; --dry-run compiles and reports without one.",
              file=sys.stderr)
        return EXIT_FAILED
    except RuntimeError as error:  # e.g. --gpu names a device that does not exist
        last = str(error).strip().splitlines()[-1:] or ["unknown error"]
        print(f"python -m tuner: cannot start measuring on {gpu}: {last[0]}",
              file=sys.stderr)
        return EXIT_FAILED
    if len(evaluator.devices) > 1:
        print(f"python -m tuner: {len(evaluator.devices)} GPUs ({', '.join(map(str, evaluator.devices))}; "
              f"{evaluator.info()['name']}) measure for one search", file=sys.stderr)
    with evaluator:
        try:
            return tune(options, evaluator, preparer=process)
        except KeyboardInterrupt:  # a second Ctrl-C: the runs are already marked interrupted
            print("python -m tuner: aborted", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            kill_pool(process)  # (tune_all ends it; not where the stores were unusable)


def recorded_families(evaluator: Any, options: Options) -> list[Any]:
    """A replay's families: those named with --kernel, else every recorded one."""
    return ([evaluator.family(f) for f in options.families] if options.kernels_named
            else evaluator.families())


def replay_main(options: Options) -> int:
    """``python -m tuner --replay FILE``: families and shapes default to the recorded ones."""
    from tuner.measure.recording import RecordingError
    from tuner.measure.replay import ReplayEvaluator

    assert options.replay is not None
    try:
        evaluator = ReplayEvaluator.open(options.replay)
        families = recorded_families(evaluator, options)
    except RecordingError as error:
        print(f"python -m tuner: --replay: {error}", file=sys.stderr)
        return EXIT_USAGE
    recorded = evaluator.problems()
    problems = options.problems
    if options.shapes_named:
        absent = [p.shape for p in problems if p not in recorded]
        if absent:
            print(f"python -m tuner: --replay: shape(s) {', '.join(absent)} not in the "
                  f"recording; recorded: {', '.join(p.shape for p in recorded)}",
                  file=sys.stderr)
            return EXIT_USAGE
    else:
        problems = recorded
    if not families:
        print("python -m tuner: --replay: the recording holds no current kernel family",
              file=sys.stderr)
        return EXIT_USAGE
    with evaluator:
        return tune(dataclasses.replace(options, families=families, problems=problems), evaluator)
