"""``python -m tuner``: tune kernel families for GEMM shapes on one GPU."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from tuner.problem import DEFAULT_SHAPES, Problem, ShapeError, parse_shape
from tuner.search.samplers import SAMPLERS, missing_packages

log = logging.getLogger("tuner")

# With 40 trials and patience 15, the default command took 352 s on an H100 (most studies
# stopped on patience, those at 4096^3 on time); these leave the time budget below to bind.
DEFAULT_TRIALS = 80
DEFAULT_PATIENCE = 25
# With no --timeout the studies share this much wall time (what is left over from a study that
# stops early passes to the next), so the default command ends in about 15 minutes including
# start-up, cuBLAS baselines and references.
DEFAULT_TOTAL_SECONDS = 780.0
DEFAULT_DRY_RUN_CONFIGS = 5

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# For tests only: the module the GPU child measures with. "tuner.testing" is the CPU stand-in,
# so the whole command (compile pool, child process, signals, database) runs without a GPU.
BACKEND_ENV = "GEMMTUNE_GPU_BACKEND"

_SHAPES_HELP = ", ".join(p.shape for p in DEFAULT_SHAPES)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give a positive integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; give a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give 0 or more")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds")
    return value


def _shape(text: str) -> Problem:
    try:
        return parse_shape(text)
    except ShapeError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner",
        description=(
            "Tune the SGEMM kernel families for GEMM shapes on one GPU: one Optuna study per "
            "(GPU model, family + source hash, shape), resumed when run again. Every trial, "
            "the cuBLAS baseline and each run go to the results database; the end is a table "
            "of the best kernel per shape and its fraction of cuBLAS."
        ),
        epilog=(
            f"Default shapes: {_SHAPES_HELP} (square small and large, K-heavy with small M and "
            "N, tall-skinny, and sizes that are multiples of nothing). Exit codes: 0 done, "
            "1 failure (e.g. no usable GPU), 2 bad input (nothing stored), 130 interrupted."
        ),
    )
    parser.add_argument("--gpu", type=_non_negative_int, default=0, metavar="INDEX",
                        help="CUDA device index (default: 0)")
    import kernels

    parser.add_argument("--kernel", action="append", metavar="FAMILY", default=[],
                        help="kernel family to tune, one of "
                             f"{', '.join(kernels.FAMILIES)}; repeat for several "
                             "(default: all)")
    parser.add_argument("--shape", action="append", type=_shape, metavar="MxNxK", default=[],
                        help=f"problem shape, e.g. 1024x1024x1024; repeat for several "
                             f"(default: {_SHAPES_HELP})")
    parser.add_argument("--trials", type=_positive_int, default=DEFAULT_TRIALS, metavar="N",
                        help="measured configs per study, counted over all runs of the study, "
                             "so running again resumes up to it (default: %(default)s)")
    parser.add_argument("--timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                        help="wall time per study in this run (default: the studies share "
                             f"{DEFAULT_TOTAL_SECONDS:g} s, leftovers passing on)")
    parser.add_argument("--patience", type=_non_negative_int, default=DEFAULT_PATIENCE,
                        metavar="N",
                        help="stop a study after N measured configs without a new best "
                             "(>0.5%% better); 0 turns the rule off (default: %(default)s)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="default",
                        help="Optuna sampler; 'default' is the tuner's recommended set-up "
                             "(a start-up ranked by a static prior, then multivariate TPE over the "
                             "accepted configs; tuner/samplers.py); gp needs torch and scipy, "
                             "cmaes needs cmaes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="sampler seed; a resumed study offsets it by its trial count "
                             "(default: %(default)s)")
    parser.add_argument("--db", metavar="URL", default=None,
                        help="results database URL or SQLite file path (default: $GEMMTUNE_DB, "
                             "else sqlite:///$XDG_DATA_HOME/gemmtune/gemmtune.sqlite)")
    parser.add_argument("--storage", metavar="URL", default=None,
                        help="Optuna storage URL (default: $GEMMTUNE_STORAGE, else the results "
                             "database)")
    parser.add_argument("--cache", metavar="DIR", default=None,
                        help="CUBIN cache folder (default: $GEMMTUNE_CACHE, else "
                             "$XDG_CACHE_HOME/gemmtune/cubins)")
    parser.add_argument("--replay", metavar="FILE", default=None,
                        help="no GPU: answer every candidate from a recording (tuner.recording); "
                             "families and shapes default to the recorded ones")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU and no database: compile a seeded sample of accepted "
                             "configs per family and print registers, shared memory, spills "
                             "and occupancy")
    parser.add_argument("--dry-run-configs", type=_positive_int, default=DEFAULT_DRY_RUN_CONFIGS,
                        metavar="N", help="configs per family in --dry-run (default: %(default)s)")
    parser.add_argument("--arch", default="sm_90",
                        help="compile target for --dry-run (a live run asks the GPU) "
                             "(default: %(default)s)")
    parser.add_argument("--trial-timeout", type=_positive_seconds, default=30.0,
                        metavar="SECONDS",
                        help="a candidate that takes longer on the GPU is recorded as timeout "
                             "and its GPU process replaced (default: %(default)s)")
    parser.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                        help="compile processes (default: CPU cores - 1, at most 8)")
    parser.add_argument("--claim-trials", action=argparse.BooleanOptionalAction, default=None,
                        help="several workers on one study: store each candidate as a running "
                             "trial before measuring it, with a heartbeat (--heartbeat), so the "
                             "others skip it and a dead worker's candidate is retried after "
                             "--stale-after (default: on for a PostgreSQL/MySQL --storage, off "
                             "for SQLite, where it costs a few commits per trial)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log a line per trial; twice for debug output")
    from tuner.run.worker import add_worker_arguments

    add_worker_arguments(parser, _positive_int, _positive_seconds)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses and validates; bad input exits with status 2 before anything is stored."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    import kernels

    families = []
    for name in args.kernel:
        if name not in kernels.FAMILIES:
            parser.error(f"argument --kernel: unknown kernel family {name!r}; "
                         f"allowed: {', '.join(kernels.FAMILIES)}")
        if kernels.FAMILIES[name] not in families:
            families.append(kernels.FAMILIES[name])
    args.families = families or list(kernels.FAMILIES.values())
    args.problems = list(dict.fromkeys(args.shape)) or list(DEFAULT_SHAPES)
    if args.arch not in kernels.ARCH_LIMITS:
        parser.error(f"argument --arch: unknown architecture {args.arch!r}; "
                     f"allowed: {', '.join(kernels.ARCH_LIMITS)}")
    if not args.heartbeat < args.stale_after:
        parser.error(f"argument --stale-after: {args.stale_after:g} s is not longer than "
                     f"--heartbeat {args.heartbeat:g} s; a live worker would be taken for dead")
    missing = missing_packages(args.sampler)
    if missing and not args.dry_run:
        parser.error(f"argument --sampler: {args.sampler!r} needs the Python package(s) "
                     f"{', '.join(missing)}, which are not installed "
                     f"(pip install {' '.join(missing)}); or choose another of "
                     f"{', '.join(s for s in SAMPLERS if not missing_packages(s))}")
    return args


def _configure_logging(verbose: int) -> None:
    import optuna

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    optuna.logging.set_verbosity(logging.DEBUG if verbose >= 2 else logging.WARNING)


def cache_dir(args: argparse.Namespace) -> Path | None:
    chosen = args.cache or os.environ.get("GEMMTUNE_CACHE")
    return Path(chosen).expanduser() if chosen else None  # None: kernels' default folder


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _configure_logging(args.verbose)
    if args.dry_run:
        from tuner.measure.live import default_workers
        from tuner.run.dryrun import dry_run

        ok = dry_run(args.families, args.problems[0], arch=args.arch, cache_dir=cache_dir(args),
                     count=args.dry_run_configs, seed=args.seed,
                     workers=args.workers or default_workers(), out=sys.stdout)
        return EXIT_OK if ok else EXIT_FAILED

    if args.worker:
        from tuner.run.worker import worker_main

        return worker_main(args)
    if args.replay:
        from tuner.measure.replay import replay_main

        return replay_main(args)
    from tuner.measure.live import GpuUnavailable, LiveEvaluator

    try:
        evaluator = LiveEvaluator(args.gpu, cache_dir=cache_dir(args), workers=args.workers,
                                  trial_timeout_s=args.trial_timeout,
                                  backend=os.environ.get(BACKEND_ENV) or "tuner.gpu")
    except GpuUnavailable as reason:
        print(f"python -m tuner: no usable GPU {args.gpu}: {reason}\n"
              "Tuning needs an NVIDIA GPU and driver; --dry-run compiles and reports without one.",
              file=sys.stderr)
        return EXIT_FAILED
    except RuntimeError as error:  # e.g. --gpu names a device that does not exist
        last = str(error).strip().splitlines()[-1:] or ["unknown error"]
        print(f"python -m tuner: cannot start measuring on GPU {args.gpu}: {last[0]}",
              file=sys.stderr)
        return EXIT_FAILED
    with evaluator:
        try:
            return tune(args, evaluator)
        except KeyboardInterrupt:  # a second Ctrl-C: the runs are already marked interrupted
            print("python -m tuner: aborted", file=sys.stderr)
            return EXIT_INTERRUPTED


def tune(args: argparse.Namespace, evaluator: Any, *, progress: bool = True) -> int:
    """Everything after the evaluator exists: open the stores, run the studies, print the table."""
    import db
    import optuna
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tuner.lifetime import StopRequest
    from tuner.run.session import tune_all
    from tuner.run.storage import is_server, open_storage
    from tuner.search.study import Budget, Session

    try:
        database = db.open_database(args.db)
    except (db.StorageError, db.InvalidInputError) as error:
        print(f"python -m tuner: cannot use the results database: {error}", file=sys.stderr)
        return EXIT_USAGE
    storage_url = args.storage or os.environ.get("GEMMTUNE_STORAGE") or database.url
    try:
        storage = open_storage(storage_url, heartbeat_s=args.heartbeat,
                               stale_after_s=args.stale_after)
    except Exception as error:  # Optuna raises several kinds for a bad URL or unusable store
        print(f"python -m tuner: cannot use the Optuna storage {storage_url!r}: {error}",
              file=sys.stderr)
        database.close()
        return EXIT_USAGE
    claims = is_server(storage_url) if args.claim_trials is None else args.claim_trials

    with database, StopRequest() as stop, logging_redirect_tqdm():
        known = {f.name for f in dataclasses.fields(db.GpuInfo)}
        gpu_info = db.GpuInfo(**{k: v for k, v in evaluator.info().items() if k in known})
        session = Session(
            database=database, evaluator=evaluator, storage=storage,
            gpu_id=database.ensure_gpu(gpu_info), gpu_name=gpu_info.name,
            sampler=args.sampler, seed=args.seed, batch=getattr(evaluator, "batch", 1),
            progress=progress, host=socket.gethostname(),
            command=shlex.join(["python", "-m", "tuner", *(args.argv or sys.argv[1:])]),
            stop=stop, claim_trials=claims, heartbeat_s=args.heartbeat,
            stale_after_s=args.stale_after, compile_cache=cache_dir(args),
        )
        budget = Budget(trials=args.trials, timeout_s=args.timeout,
                        patience=args.patience or None)
        total = None if args.timeout is not None else DEFAULT_TOTAL_SECONDS
        summary = tune_all(session, args.families, args.problems, budget, total_seconds=total)
    print()
    print(summary.table())
    return EXIT_INTERRUPTED if summary.interrupted else EXIT_OK
