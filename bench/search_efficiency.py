"""Search efficiency: how many measurements each sampler needs to come near the true optimum.

    python bench/search_efficiency.py                       # every recording, 20 seeds
    python bench/search_efficiency.py --seeds 2 --samplers default random
    # in parts (Optuna's own samplers capped, GP on the less constrained family only), then one table:
    python bench/search_efficiency.py --samplers default random --out dr.json
    python bench/search_efficiency.py --samplers tpe cmaes --reference-max-evals 40 --out tc.json
    python bench/search_efficiency.py --samplers gp --family vectorized --reference-max-evals 40 --out gp.json
    python bench/search_efficiency.py --merge dr.json tc.json gp.json

For every (family, shape) of every recording in tests/data/recordings/ that holds the full
accepted space of its grid (so the recorded optimum is the optimum of the space searched), each
sampler the tuner offers runs the tuner's own search loop (``tuner.search.study.run_study`` with
``tuner.search.samplers.make_sampler``) against the replay evaluator, once per seed, from a cold start
(no warm-start configs: a new GPU or shape). A run stops when it has measured a config within
1% of the optimum, or at ``--max-evals``.

What counts as an evaluation: a measured candidate, i.e. one that would cost GPU time (ok,
compile_error, launch_error, wrong_result, timeout, crashed). Configs the family's constraints
reject cost nothing (never compiled nor run) and proposals of an already measured config are
answered from the study: neither is counted. ``missing`` cannot happen on a full recording.

The ``model`` sampler (tuner.search.learned) learns from measurements of other problems: here
every measured config of every recorded problem except the one searched — all of its families
on that GPU model are held out (leave-one-out, ``training_for``). Each row says whether its
sampler was fitted on the recording it is measured on (``fit_kind``): ``in-sample`` for the
default's rows on the recordings its constants were chosen on (``DESIGN_RECORDINGS``),
``leave-one-out`` for the model's, ``-`` where nothing was fitted (random, Optuna's own).

Reported per sampler: the median and 90th percentile of the evaluations needed to reach within
1%, 3% and 5% of the optimum (``>N``: not reached within N in at least that share of runs),
printed as a table and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.measure.recording import Recording, load  # noqa: E402
from tuner.problem import Problem  # noqa: E402
from tuner.report import format_table  # noqa: E402
from tuner.search.samplers import SAMPLERS, missing_packages  # noqa: E402

THRESHOLDS = (0.01, 0.03, 0.05)
COSTLESS = ("rejected", "missing")
# The tuner's default as a real service runs it: warm-started from what the database knows.
# Here that is the recorded optimum of the same family on every OTHER recorded problem (real
# measurements, leave-one-out: never the problem being searched), in a fresh database per run.
WARM = "default+warm"
UNCAPPED = ("default", "model", "random", WARM)  # the target check compares these
CHECKED = ("default", "model", WARM)  # rows the target check holds against random
# The recordings the default sampler's constants (tuner.search.prior, GROUP_TRIES, …) were
# chosen on: its rows there are in-sample (bench/NOTES.md, "Search set-up").
DESIGN_RECORDINGS = ("h100-warptile-vectorized.json.gz",
                     "h100-warptile-vectorized-1023x1025x999.json.gz")
DEFAULT_OUT = ROOT / "bench" / "results" / "search_efficiency.json"
RECORDINGS = ROOT / "tests" / "data" / "recordings"


@dataclass(frozen=True)
class Job:
    recording: str  # path
    family: str
    problem: Problem
    sampler: str
    seed: int
    max_evals: int
    others: tuple[str, ...] = ()  # recordings whose other problems warm-start a WARM run


class _StopNearOptimum:
    """The replay evaluator, plus: ask the search loop to stop once a result is within the
    tightest threshold (the loop stops after recording that trial)."""

    def __init__(self, inner: Any, target_gflops: float, stop: Any) -> None:
        self.inner, self.target, self.stop = inner, target_gflops, stop

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Any:
        measurement = self.inner.evaluate(family, config, problem)
        if measurement.usable and measurement.gflops >= self.target:
            self.stop.request()
        return measurement

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_WORKER: dict[str, Any] = {}


def _worker_state(recording_path: str) -> tuple[Any, Recording]:
    import db

    if "database" not in _WORKER:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None  # no fsync cost
        _WORKER["dir"] = tempfile.TemporaryDirectory(prefix="gemmtune-bench-", dir=folder)
        _WORKER["database"] = db.open_database(f"sqlite:///{_WORKER['dir'].name}/bench.sqlite")
        _WORKER["recordings"] = {}
    if recording_path not in _WORKER["recordings"]:
        _WORKER["recordings"][recording_path] = load(recording_path)
    return _WORKER["database"], _WORKER["recordings"][recording_path]


def run_one(job: Job) -> dict[str, Any]:
    """One study; returns the best-so-far curve over measured candidates."""
    import db
    import optuna

    from tuner.lifetime import StopRequest
    from tuner.measure.replay import ReplayEvaluator
    from tuner.search.study import Budget, Session, run_study

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("tuner").setLevel(logging.ERROR)
    database, recording = _worker_state(job.recording)
    replay = ReplayEvaluator(recording)
    import kernels

    family = replay.family(kernels.get_family(job.family))
    _, optimum = recording.optimum(job.family, job.problem)  # type: ignore[misc]
    stop = StopRequest()
    evaluator = _StopNearOptimum(replay, optimum * (1 - min(THRESHOLDS)), stop)
    info = replay.info()
    warm = job.sampler == WARM
    scratch = None
    if warm:  # a database of its own: only the other problems' optima, nothing of this one
        scratch = tempfile.TemporaryDirectory(prefix="gemmtune-warm-", dir=_WORKER["dir"].name)
        database = db.open_database(f"sqlite:///{scratch.name}/warm.sqlite")
        _seed_other_optima(database, job, info)
    training = training_for(job, str(info["name"])) if job.sampler == "model" else None
    session = Session(
        database=database, evaluator=evaluator, storage=optuna.storages.InMemoryStorage(),
        training=training,
        gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
        sampler="default" if warm else job.sampler, seed=job.seed, batch=1, warm_start=warm,
        progress=False, command="bench/search_efficiency.py", stop=stop,
    )
    started = time.perf_counter()
    outcome = run_study(session, family, job.problem,
                        Budget(trials=job.max_evals, timeout_s=None, patience=None))
    seconds = time.perf_counter() - started
    trials = database.run_history(outcome.run_id)
    if scratch is not None:
        database.close()
        scratch.cleanup()
    best, curve = 0.0, []
    for trial in trials:
        if trial.state in COSTLESS:
            continue
        if trial.state == "ok" and trial.gflops:
            best = max(best, trial.gflops)
        curve.append(best / optimum)
    # What costs GPU time is what reached the evaluator: it must be exactly what is counted.
    if len(curve) != replay.evaluations:
        raise AssertionError(f"{job}: counted {len(curve)} evaluations but the evaluator "
                             f"measured {replay.evaluations} configs")
    return {"recording": Path(job.recording).name, "family": job.family,
            "shape": job.problem.shape, "sampler": job.sampler, "seed": job.seed,
            "evaluations": len(curve), "max_evals": job.max_evals, "asked": len(trials), "seconds": seconds,
            "reached": {f"{t:.0%}": _first_reach(curve, t) for t in THRESHOLDS}}


def training_for(job: Job, gpu: str) -> list[Any]:
    """What the model sampler learns from in ``job``: every measured config of every recorded
    problem except the one searched (all its families, on that GPU model: leave-one-out)."""
    from tuner.search.learned import examples_from_recordings, problem_held_out

    return examples_from_recordings([_worker_state(path)[1] for path in job.others],
                                    problem_held_out(gpu, job.problem.shape))


def fit_kind(sampler: str, recording: str) -> str:
    """Whether a row's sampler was fitted on the recording it is measured on."""
    if sampler == "model":
        return "leave-one-out"
    if sampler in ("default", WARM):
        return "in-sample" if recording in DESIGN_RECORDINGS else "not fitted on it"
    return "-"


def _seed_other_optima(database: Any, job: Job, info: dict[str, Any]) -> None:
    """Store, as finished runs, the recorded optimum of job.family on every other recorded
    problem (same GPU model): what a service that had tuned those shapes would know."""
    import db

    gpu_id = database.ensure_gpu(db.GpuInfo(**info))
    for path in job.others:
        recording = _worker_state(path)[1]
        header = recording.families.get(job.family)
        if header is None:
            continue
        for family, problem in recording.pairs():
            if family != job.family or problem == job.problem:
                continue
            config, _ = recording.optimum(family, problem)  # type: ignore[misc]
            result = recording.result(family, problem, config)
            run_id = database.start_run(
                gpu_id=gpu_id, problem_id=database.ensure_problem(problem.m, problem.n, problem.k),
                family_id=database.ensure_family(family, header.source_hash), sampler="recorded",
                seed=None, budget={}, host="bench", command=f"recorded optimum ({Path(path).name})",
                study_name=None)
            database.add_trial(run_id, db.TrialRecord(
                number=0, params=config, state="ok", time_median_ms=result.time_median_ms,
                gflops=result.gflops))
            database.finish_run(run_id, "finished")


def _first_reach(curve: list[float], threshold: float) -> int | None:
    for index, fraction in enumerate(curve, start=1):
        if fraction >= 1 - threshold - 1e-12:
            return index
    return None


def _percentile(values: list[int | None], q: float) -> float:
    """Nearest-rank percentile with runs that never reached as +inf."""
    ranked = sorted(math.inf if v is None else v for v in values)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def _median(values: list[int | None]) -> float:
    finite = [math.inf if v is None else v for v in values]
    return statistics.median(finite) if finite else math.inf


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["recording"], r["family"], r["shape"], r["sampler"]), []).append(r)
    rows = []
    # one block per pair (in the order first seen), samplers in the CLI's order within it
    pairs = list(dict.fromkeys(key[:3] for key in groups))
    order = sorted(groups, key=lambda k: (pairs.index(k[:3]), SAMPLERS.index(k[3])
                                          if k[3] in SAMPLERS else len(SAMPLERS)))
    for recording, family, shape, sampler in order:
        runs = groups[(recording, family, shape, sampler)]
        row: dict[str, Any] = {"recording": recording, "family": family, "shape": shape,
                               "sampler": sampler, "fit": fit_kind(sampler, recording),
                               "runs": len(runs),
                               "max_evals": max(r["max_evals"] for r in runs),
                               "seconds_per_run": statistics.mean(r["seconds"] for r in runs)}
        for t in THRESHOLDS:
            key = f"{t:.0%}"
            reached = [r["reached"][key] for r in runs]
            row[key] = {"median": _median(reached), "p90": _percentile(reached, 0.9),
                        "not_reached": sum(v is None for v in reached)}
        rows.append(row)
    return rows


def _cell(value: float, cap: int) -> str:
    return f">{cap}" if math.isinf(value) else f"{value:g}"


def target_check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Default (cold, and warm-started where run) vs random at 3%: the default's median must be
    at most a third of random's."""
    checks = []
    by_key = {(r["recording"], r["family"], r["shape"], r["sampler"]): r for r in rows}
    for (recording, family, shape, sampler), row in by_key.items():
        if sampler not in CHECKED or (recording, family, shape, "random") not in by_key:
            continue
        random_row = by_key[(recording, family, shape, "random")]
        d, r = row["3%"]["median"], random_row["3%"]["median"]
        p90 = row["3%"]["p90"]
        checks.append({"recording": recording, "family": family, "shape": shape, "sampler": sampler,
                       "fit": row["fit"], "default_median": d, "random_median": r,
                       "ratio": (d / r) if math.isfinite(d) and math.isfinite(r) else None,
                       "p90": p90, "p90_met": math.isfinite(p90) and p90 <= r,
                       "met": math.isfinite(d) and d * 3 <= r})
    return checks


def _finite(value: Any) -> Any:
    """JSON has no infinity: a threshold never reached is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def report(results: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    """Print the table and the target check, and write them with every run as JSON."""
    rows = summarize(results)
    checks = target_check(rows)
    table = [[r["family"], r["shape"], r["sampler"], r.get("fit", "-"),
              *(f"{_cell(r[f'{t:.0%}']['median'], r['max_evals'])} / "
                f"{_cell(r[f'{t:.0%}']['p90'], r['max_evals'])}" for t in THRESHOLDS),
              f"{r['seconds_per_run']:.1f}"] for r in rows]
    seeds = sorted({r["runs"] for r in rows})
    print(f"Measured configs (each one costs GPU time; rejected and repeated proposals cost "
          f"nothing and are not counted) until within 1/3/5% of the recorded optimum, "
          f"{'/'.join(map(str, seeds))} seeds per row. '>N': not reached within N measured "
          f"configs in at least that share of the runs; N is the whole accepted space for "
          f"default and random, and the --reference-max-evals cap for Optuna's own samplers:")
    print(format_table(["family", "shape", "sampler", "fitted on it",
                        *(f"within {t:.0%} (median / p90)" for t in THRESHOLDS), "s/run"], table))
    for check in checks:
        p90 = (f"; p90 {check['p90']:g} <= random's median: "
               f"{'met' if check['p90_met'] else 'NOT met'}" if "p90" in check else "")
        print(f"target ({check.get('sampler', 'default')} <= random/3 at 3%, "
              f"{check.get('fit', '-')}): {check['family']} {check['shape']}: "
              f"{check['default_median']:g} vs {check['random_median']:g} -> "
              f"{'met' if check['met'] else 'NOT met'}{p90}")
    for name, why in meta.get("skipped_samplers", {}).items():
        print(f"sampler {name} skipped: {why}")
    for text in meta.get("skipped_pairs", []):
        print(f"skipped {text}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_finite({
        "what": "evaluations (measured candidates; rejected and repeated proposals cost "
                "nothing and are not counted) needed to reach within 1/3/5% of the recorded "
                "optimum; one tuner search loop per run, cold (no warm start) except the "
                "default+warm rows (warm-started from the family's recorded optima on the other "
                "recorded problems); null: not reached within "
                "the row's max_evals (the whole space for default and random, the "
                "--reference-max-evals cap for tpe, gp and cmaes)",
        **meta, "summary": rows, "target": checks, "runs": results,
    }), indent=1, allow_nan=False))
    print(f"wrote {out}", file=sys.stderr)


def merge(paths: list[str], out: Path) -> None:
    """One table from several earlier outputs (e.g. default+random uncapped, then Optuna's
    own samplers capped, run separately to fit a time budget)."""
    documents = [json.loads(Path(p).read_text()) for p in paths]
    results = [run for d in documents for run in d["runs"]]
    samplers = list(dict.fromkeys(s for d in documents for s in d["samplers"]))
    meta = {"seeds": max(d["seeds"] for d in documents), "samplers": samplers,
            "skipped_samplers": {k: v for d in documents
                                 for k, v in d.get("skipped_samplers", {}).items()
                                 if k not in samplers},
            "skipped_pairs": sorted({t for d in documents for t in d.get("skipped_pairs", [])}),
            "recordings": sorted({r for d in documents for r in d["recordings"]}),
            "seconds": sum(d["seconds"] for d in documents),
            "merged_from": [Path(p).name for p in paths]}
    report(results, meta, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recording", action="append", default=[], metavar="FILE",
                        help=f"recording(s) to use (default: every *.json.gz in {RECORDINGS})")
    parser.add_argument("--samplers", nargs="*", default=list(SAMPLERS), choices=SAMPLERS,
                        help="samplers to run (none: only the --warm-start rows)")
    parser.add_argument("--family", action="append", default=[], metavar="NAME",
                        help="only these kernel families of the recordings (default: all)")
    parser.add_argument("--seeds", type=int, default=20, help="runs per sampler (default: 20)")
    parser.add_argument("--max-evals", type=int, default=None, metavar="N",
                        help="measured candidates per run at most (default: the whole space)")
    parser.add_argument("--reference-max-evals", type=int, default=None, metavar="N",
                        help="cap for Optuna's own samplers (tpe, gp, cmaes) only: they are "
                             "reference points and slow per ask; default and random stay "
                             "uncapped so the target check always has both medians")
    parser.add_argument("--warm-start", action="store_true",
                        help=f"add a '{WARM}' row per pair: the default sampler warm-started "
                             "from the family's recorded optima on the other recorded problems "
                             "(leave-one-out), as the tuner starts in a service that has tuned "
                             "other shapes")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(DEFAULT_OUT), metavar="FILE")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="run nothing: one table (printed and written to --out) from the "
                             "runs of earlier outputs of this script")
    args = parser.parse_args(argv)
    if args.merge:
        merge(args.merge, Path(args.out))
        return 0

    paths = args.recording or [str(p) for p in sorted(RECORDINGS.glob("*.json.gz"))]
    if not paths:
        parser.error(f"no recordings given and none in {RECORDINGS}")
    samplers, skipped = [], {}
    for name in args.samplers:
        missing = missing_packages(name)
        if missing:
            skipped[name] = f"needs {', '.join(missing)} (not installed)"
        else:
            samplers.append(name)

    jobs: list[Job] = []
    caps: dict[tuple[str, str, str], int] = {}
    unusable: list[str] = []
    for path in paths:
        recording = load(path)
        for family, problem in recording.pairs():
            if args.family and family not in args.family:
                continue
            header = recording.families[family]
            if header.selection.mode != "full":
                unusable.append(f"{Path(path).name} {family} {problem.shape}: "
                                f"{header.selection.text}; its optimum is not the space's")
                continue
            space = sum(1 for _ in recording.results(family, problem))
            cap = min(space, args.max_evals or space)
            caps[(Path(path).name, family, problem.shape)] = cap
            runs = samplers + ([WARM] if args.warm_start else [])
            jobs += [Job(path, family, problem, s, seed,
                         cap if s in UNCAPPED else min(cap, args.reference_max_evals or cap),
                         tuple(paths))
                     for s in runs for seed in range(args.seeds)]
    rows_per_pair = len(samplers) + args.warm_start
    print(f"{len(jobs)} runs ({len(caps)} family/shape pairs x {rows_per_pair} samplers x "
          f"{args.seeds} seeds) on {args.workers} processes", file=sys.stderr)
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for index, result in enumerate(pool.map(run_one, jobs, chunksize=1), start=1):
            results.append(result)
            if index % max(1, len(jobs) // 20) == 0:
                print(f"  {index}/{len(jobs)} runs, {time.monotonic() - started:.0f} s",
                      file=sys.stderr)
    report(results, {"seeds": args.seeds, "samplers": samplers, "skipped_samplers": skipped,
                      "skipped_pairs": unusable, "recordings": [Path(p).name for p in paths],
                      "seconds": time.monotonic() - started}, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
