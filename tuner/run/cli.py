"""``python -m tuner``: tune kernel families for GEMM shapes on one GPU.

The edge of the command: the parser, its checks, and the option objects (tuner.run.options)
the rest of the command is handed; then the dispatch to the entry pieces (tuner.run.tune,
tuner.run.worker, tuner.run.dryrun). No module past this one sees the parsed namespace.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Callable, Sequence

from tuner.measure.live import ALL_DEVICES, BACKEND_ENV, DEFAULT_BACKEND
from tuner.problem import DEFAULT_SHAPES, Problem, ShapeError, parse_shape
from tuner.report import configure_logging
from tuner.run.options import (DEFAULT_DRY_RUN_CONFIGS, DEFAULT_HEARTBEAT_S, DEFAULT_PATIENCE,
                               DEFAULT_RETIME_ROUNDS,
                               DEFAULT_POLL_S, DEFAULT_STALE_AFTER_S, DEFAULT_TOTAL_SECONDS,
                               DEFAULT_TRIALS, EXIT_FAILED, EXIT_OK, BudgetOptions, DryRunOptions,
                               EvaluatorOptions, Options, SearchOptions, StoreOptions,
                               WorkerOptions)
from tuner.search.choices import SAMPLERS, missing_packages

log = logging.getLogger("tuner")

_SHAPES_HELP = ", ".join(p.shape for p in DEFAULT_SHAPES)


def _int_at_least(minimum: int, wanted: str, too_small: str) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum; the errors say what was given and ``wanted``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give {wanted}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} {too_small}; give {wanted}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer", "is not positive")
_non_negative_int = _int_at_least(0, "0 or more", "is negative")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds")
    return value


def _devices(text: str) -> tuple[int, ...] | str:
    if text == ALL_DEVICES:
        return text
    try:
        devices = tuple(int(part) for part in text.split(","))
    except ValueError:
        devices = ()
    if not devices or min(devices) < 0 or len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of distinct CUDA device indices (e.g. 0,1) or 'all'")
    return devices


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
    gpus = parser.add_mutually_exclusive_group()
    gpus.add_argument("--gpu", type=_non_negative_int, default=0, metavar="INDEX",
                      help="CUDA device index (default: 0)")
    gpus.add_argument("--gpus", type=_devices, default=None, metavar="LIST|all",
                      help="several GPUs of this host, of one model, as one search: comma-separated "
                           "device indices (e.g. 0,1) or 'all'; each measures the candidates the "
                           "search hands it, and the search keeps as many more in flight")
    import kernels

    parser.add_argument("--kernel", action="append", metavar="FAMILY", default=[],
                        help="kernel family to tune, one of "
                             f"{', '.join(kernels.FAMILIES)}; repeat for several "
                             "(default: all)")
    parser.add_argument("--shape", action="append", type=_shape, metavar="[Bx]MxNxK[:LAYOUT]", default=[],
                        help=f"problem: MxNxK, e.g. 1024x1024x1024; BxMxNxK for a batch of B; :LAYOUT for "
                             f"how A and B are stored (nn, nt, tn, tt: A's letter then B's, t for "
                             f"transposed; default nn), e.g. 4096x3072x1024:nt; repeat for several "
                             f"(default: {_SHAPES_HELP})")
    parser.add_argument("--workload", default=None, metavar="FILE",
                        help="tune the problems of a workload file (python -m gemmtune profile, "
                             "gemmtune.record_workload), largest share of its GEMM time first, after "
                             "any --shape, and with --budget each in proportion to its share; the "
                             "workload is stored for the dashboard")
    parser.add_argument("--trials", type=_positive_int, default=DEFAULT_TRIALS, metavar="N",
                        help="measured configs per study, counted over all runs of the study, "
                             "so running again resumes up to it (default: %(default)s)")
    time_limit = parser.add_mutually_exclusive_group()
    time_limit.add_argument("--timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                            help="wall time per study in this run (default: the studies share "
                                 "--budget, leftovers passing on)")
    time_limit.add_argument("--budget", type=_positive_seconds, default=DEFAULT_TOTAL_SECONDS,
                            metavar="SECONDS",
                            help="wall time all studies of this run share, a study that stops "
                                 "early passing its leftover to the next (default: %(default)g; "
                                 "start-up, cuBLAS baselines and references come on top)")
    parser.add_argument("--patience", type=_non_negative_int, default=DEFAULT_PATIENCE,
                        metavar="N",
                        help="stop a study after N measured configs without a new best "
                             "(>0.5%% better); 0 turns the rule off (default: %(default)s)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="default",
                        help="how each study proposes configs; 'default' is the tuner's "
                             "recommended set-up: 'model' (a cost model learned from the "
                             "results database's other problems and the study's own "
                             "measurements) where a family's accepted configs can be listed, "
                             "else 'prior' (a start-up ranked by a static prior, then "
                             "multivariate TPE over the accepted configs); "
                             "tuner/search/samplers.py. gp needs torch and scipy, cmaes needs "
                             "cmaes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="sampler seed; a resumed study offsets it by its trial count "
                             "(default: %(default)s)")
    parser.add_argument("--retime-rounds", type=_non_negative_int, default=DEFAULT_RETIME_ROUNDS,
                        metavar="N",
                        help="once a shape's studies are done, time its fastest configs (those "
                             "within 5%% of its best, 4 at most) N more times in shuffled "
                             "rounds and keep each one's median, so that the pick is not made "
                             "between timings at different clocks; 0: off (default: "
                             "%(default)s; a replay never re-times)")
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
                        help="compile processes (default: CPU cores - 2)")
    parser.add_argument("--claim-trials", action=argparse.BooleanOptionalAction, default=None,
                        help="several workers on one study: store each candidate as a running "
                             "trial before measuring it, with a heartbeat (--heartbeat), so the "
                             "others skip it and a dead worker's candidate is retried after "
                             "--stale-after (default: on for a PostgreSQL/MySQL --storage, off "
                             "for SQLite, where it costs a few commits per trial)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log a line per trial; twice for debug output")
    _add_worker_arguments(parser)
    return parser


def _add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "worker", "python -m tuner --worker: take tuning jobs (POST /api/jobs, /api/best?tune=true) "
                  "for this GPU's model from the results database; --trials, --patience, "
                  "--sampler, --seed apply where a job does not say")
    group.add_argument("--worker", action="store_true",
                       help="run queued tuning jobs for this GPU's model until stopped")
    group.add_argument("--poll", type=_positive_seconds, default=DEFAULT_POLL_S, metavar="SECONDS",
                       help="wait between looks at an empty queue (default: %(default)s)")
    group.add_argument("--once", action="store_true",
                       help="run the jobs queued now, then exit instead of waiting for more")
    group.add_argument("--max-jobs", type=_positive_int, default=None, metavar="N",
                       help="exit after N jobs (default: no limit)")
    group.add_argument("--heartbeat", type=_positive_seconds, default=DEFAULT_HEARTBEAT_S,
                       metavar="SECONDS",
                       help="how often a running job's heartbeat is refreshed (default: %(default)s)")
    group.add_argument("--stale-after", type=_positive_seconds, default=DEFAULT_STALE_AFTER_S,
                       metavar="SECONDS",
                       help="claim a running job whose heartbeat is older than this: its worker "
                            "died (default: %(default)s; keep it well above --heartbeat on "
                            "every worker)")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Parses and validates; bad input exits with status 2 before anything is stored."""
    parser = build_parser()
    args = parser.parse_args(argv)
    import kernels

    families = []
    for name in args.kernel:
        if name not in kernels.FAMILIES:
            parser.error(f"argument --kernel: unknown kernel family {name!r}; "
                         f"allowed: {', '.join(kernels.FAMILIES)}")
        if kernels.FAMILIES[name] not in families:
            families.append(kernels.FAMILIES[name])
    if args.arch not in kernels.ARCH_LIMITS:
        parser.error(f"argument --arch: unknown architecture {args.arch!r}; "
                     f"allowed: {', '.join(kernels.ARCH_LIMITS)}")
    if not args.heartbeat < args.stale_after:
        parser.error(f"argument --stale-after: {args.stale_after:g} s is not longer than "
                     f"--heartbeat {args.heartbeat:g} s; a live worker would be taken for dead")
    if args.sampler == "model" and not args.replay:  # a recording's grids are enumerable
        from tuner.search.study import ENUMERABLE_SPACE, enumerable

        too_large = [f.name for f in families or kernels.FAMILIES.values() if not enumerable(f)]
        if too_large:
            listed = [f.name for f in kernels.FAMILIES.values() if enumerable(f)]
            parser.error(f"argument --sampler: 'model' ranks every accepted config, and "
                         f"{', '.join(too_large)} {'has' if len(too_large) == 1 else 'have'} "
                         f"more than {ENUMERABLE_SPACE:,} configs: name the families with "
                         f"--kernel ({', '.join(listed)} are small enough) or use --sampler "
                         f"default (which runs 'prior' for those)")
    missing = missing_packages(args.sampler)
    if missing and not args.dry_run:
        parser.error(f"argument --sampler: {args.sampler!r} needs the Python package(s) "
                     f"{', '.join(missing)}, which are not installed "
                     f"(pip install {' '.join(missing)}); or choose another of "
                     f"{', '.join(s for s in SAMPLERS if not missing_packages(s))}")
    workload = None
    if args.workload is not None:
        import db

        try:
            workload = (Path(args.workload).name, db.read_workload(args.workload))
        except db.WorkloadError as exc:
            parser.error(f"argument --workload: {exc}")
        if args.worker:
            parser.error("argument --workload: a --worker takes its problems from the job queue, not a workload")
    return _options(args, families or list(kernels.FAMILIES.values()),
                    sys.argv[1:] if argv is None else list(argv), workload)


def _options(args: argparse.Namespace, families: list, words: list[str],
             workload: tuple[str, dict] | None = None) -> Options:
    """The parsed namespace, split into the parts each piece of the command uses."""
    named = list(args.shape)
    weights: dict[Problem, float] = {}
    if workload is not None:
        import db

        shares = {Problem(p.m, p.n, p.k, layout=p.layout, batch=p.batch): p.share
                  for p in db.workloads.check_workload(workload[1], workload[0])}
        named += list(shares)
        # a --shape beside the workload counts as one of its problems of average share
        weights = {problem: 1.0 / len(shares) for problem in args.shape} | shares
    return Options(
        families=families,
        problems=list(dict.fromkeys(named)) or list(DEFAULT_SHAPES),
        kernels_named=bool(args.kernel), shapes_named=bool(named), workload=workload, weights=weights,
        mode="dry-run" if args.dry_run else "worker" if args.worker else "tune",
        replay=args.replay,
        command=shlex.join(["python", "-m", "tuner", *words]),
        verbose=args.verbose,
        budget=BudgetOptions(trials=args.trials, timeout_s=args.timeout, patience=args.patience,
                             total_s=args.budget),
        search=SearchOptions(sampler=args.sampler, seed=args.seed, retime_rounds=args.retime_rounds),
        stores=StoreOptions(db_url=args.db,
                            storage_url=args.storage or os.environ.get("GEMMTUNE_STORAGE") or None,
                            claim_trials=args.claim_trials, heartbeat_s=args.heartbeat,
                            stale_after_s=args.stale_after),
        evaluator=EvaluatorOptions(gpu=args.gpu, gpus=args.gpus, cache_dir=_cache_dir(args.cache),
                                   workers=args.workers, trial_timeout_s=args.trial_timeout,
                                   backend=os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND),
        worker=WorkerOptions(poll_s=args.poll, once=args.once, max_jobs=args.max_jobs),
        dry_run=DryRunOptions(configs=args.dry_run_configs, arch=args.arch),
    )


def _cache_dir(flag: str | None) -> Path | None:
    chosen = flag or os.environ.get("GEMMTUNE_CACHE")
    return Path(chosen).expanduser() if chosen else None  # None: kernels' default folder


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    if options.mode == "tune" and not options.replay:
        from tuner.run.tune import live_main

        return live_main(options)  # it sets up logging once its GPU process is starting
    configure_logging(options.verbose)
    if options.mode == "dry-run":
        from tuner.measure.live import default_workers
        from tuner.run.dryrun import dry_run

        ok = dry_run(options.families, options.problems[0], arch=options.dry_run.arch,
                     cache_dir=options.evaluator.cache_dir, count=options.dry_run.configs,
                     seed=options.search.seed,
                     workers=options.evaluator.workers or default_workers(), out=sys.stdout)
        return EXIT_OK if ok else EXIT_FAILED
    if options.mode == "worker":
        from tuner.run.worker import worker_main

        return worker_main(options)
    from tuner.run.tune import replay_main

    return replay_main(options)

