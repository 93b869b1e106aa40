"""Live check on the GPU host (issue 15): how close the default command gets to a long run's best.

    python bench/live_check.py                      # the defaults below: at most ~9.5 minutes
    python bench/live_check.py --shape 1792x2304x1536 --family tf32x3 --seeds 1,2,3
        [--checkpoints 10,20,40] [--short-trials 40] [--short-timeout 20]
        [--long-trials 150] [--long-timeout 25] [--sampler default] [--gpu 0]
        [--deadline-s 540] [--db URL] [--cache DIR] [--out FILE]

For each shape (default: two that no recording in tuner/recordings/ holds, so nothing the
default sampler was designed on) and family (default: the speed suite's winners on an H100),
through the tuner's own code path (``python -m tuner``'s options and ``tuner.run.tune.tune``,
one GPU child and compile pool for the whole check):

1. **the long run** (the reference): ``--long-trials`` measured configs, patience off, seed 0, at
   most ``--long-timeout`` s, in a database of its own (a fresh one, or ``--db``: then the
   reference is the best verified trial of the family's current source for (GPU, shape) over
   every run in that database, which a second check resumes rather than repeats);
2. **short runs** with the default command's settings (``--sampler``, its patience, its cold
   start), ``--short-trials`` measured configs, one per seed in ``--seeds``, each in a fresh
   database, so that nothing of the long run (nor of another shape) warm-starts it.

Every trial is then read back from the results database in measurement order (trial number;
what the tuner measured, i.e. every state but ``rejected``/``missing``, which cost no GPU time:
the tuner's ``--trials`` counts the same), and for each checkpoint c the best verified (ok)
GFLOP/s among the first c measured configs is divided by the long run's best. A run that stopped
earlier (patience, time) counts with what it had: the command would have returned that. Also
reported: the measured configs needed to come within 3 % of the long run's best. A short run may
beat the long run (fraction > 1): the long run's best is the best *known*, not the optimum.
The long run's own first c (seed 0) is shown too, marked ``long``: it is the same search, with
patience off, but its best is the reference itself.

Device time is bounded by ``--deadline-s``: a study starts only when its timeout still fits
(long run and first short run together for a (shape, family)). The work goes in rounds: every
(shape, family)'s long run and first seed, then the second seed of each, then the third, so a
short deadline costs seeds, not shapes. The JSON is rewritten after every study.

Without a GPU, ``GEMMTUNE_GPU_BACKEND=tuner.testing`` runs it all on the CPU stand-in (no GPU
timings). JSON goes to ``bench/results/live_check-<gpu>.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
import kernels  # noqa: E402
import optuna  # noqa: E402
from db.validate import MAX_LIMIT  # noqa: E402

from bench.throughput import gpu_slug  # noqa: E402
from tuner.measure.live import BACKEND_ENV, DEFAULT_BACKEND, GpuUnavailable  # noqa: E402
from tuner.measure.recording import BUNDLED_RECORDINGS, load  # noqa: E402
from tuner.problem import Problem, ShapeError, parse_shape  # noqa: E402
from tuner.report import format_table  # noqa: E402
from tuner.run.cli import parse_args  # noqa: E402
from tuner.run.options import DEFAULT_PATIENCE, EXIT_INTERRUPTED  # noqa: E402
from tuner.run.tune import start_live, tune  # noqa: E402
from tuner.search.learned import COSTLESS  # noqa: E402
from tuner.search.choices import SAMPLERS  # noqa: E402
from tuner.search import study  # noqa: E402

RECORDINGS = BUNDLED_RECORDINGS
# Two shapes no recording holds: one mid-size and uneven in all three, one wide and short.
DEFAULT_SHAPES = ("1792x2304x1536", "640x5120x2048")
# The speed suite's winners on an H100 (results/speed-h100.json: wgmma, skinny; before wgmma,
# tf32x3, pipelined and splitk; docs/search.md, "The live check"). wgmma runs only on sm_90:
# skipped elsewhere.
DEFAULT_FAMILIES = ("tf32x3", "pipelined", "splitk", "skinny", "wgmma")
WITHIN = 0.03  # "measurements to within 3 % of the long run's best"
# Beside a study's own timeout: opening its database, the cuBLAS baseline, its start-up (the
# prior's compiles, seconds for wgmma and tf32x3 on a cold cache), the candidates in flight.
STUDY_SLACK_S = 10.0


@dataclass
class RunResult:
    """One tuner invocation (one study) and its measured configs in measurement order."""

    kind: str  # "long" | "short"
    seed: int
    command: str
    status: int
    wall_s: float
    run_ids: list[int] = field(default_factory=list)
    gflops: list[float | None] = field(default_factory=list)  # None: not ok (see states)
    states: list[str] = field(default_factory=list)
    fractions: dict[str, float | None] = field(default_factory=dict)  # checkpoint → fraction
    to_within: int | None = None  # measured configs to within WITHIN of the reference

    @property
    def measured(self) -> int:
        return len(self.gflops)

    def best(self) -> float | None:
        return max((g for g in self.gflops if g is not None), default=None)


def best_so_far(gflops: list[float | None]) -> list[float]:
    """The running best of the verified results (0 before the first)."""
    curve, best = [], 0.0
    for value in gflops:
        best = max(best, value or 0.0)
        curve.append(best)
    return curve


def score(run: RunResult, reference: float, checkpoints: list[int]) -> None:
    """Fill in the run's fraction of ``reference`` per checkpoint and its steps to within 3 %."""
    curve = best_so_far(run.gflops)
    # a run that stopped before c has returned its best by then: that is what it delivers
    run.fractions = {str(c): (curve[min(c, len(curve)) - 1] / reference if curve else None)
                     for c in checkpoints}
    run.to_within = next((i + 1 for i, best in enumerate(curve)
                          if best >= (1 - WITHIN) * reference), None)


def recorded_shapes() -> dict[str, list[str]]:
    """shape → the committed recordings that hold it."""
    shapes: dict[str, list[str]] = {}
    for path in sorted(RECORDINGS.glob("*.json.gz")):
        for problem in load(path).problems:
            shapes.setdefault(problem.problem.shape, []).append(path.name)
    return shapes


def read_runs(url: str, gpu: str, family: Any, problem: Problem) -> list[db.Run]:
    """The runs of (GPU, family's current source, shape) in the database, oldest first."""
    with db.open_database(url) as database:
        try:
            runs = database.list_runs(gpu=gpu, family=family.name, limit=MAX_LIMIT)
        except db.UnknownGpuError:  # a fresh database, before the tuner registered the GPU
            return []
    shape = (problem.m, problem.n, problem.k)
    return sorted((r for r in runs if r.source_hash == family.source_hash
                   and (r.problem.m, r.problem.n, r.problem.k) == shape), key=lambda r: r.id)


def measured_trials(url: str, run_id: int) -> tuple[list[float | None], list[str]]:
    """The run's measured configs in measurement order: GFLOP/s (None unless ok) and state."""
    with db.open_database(url) as database:
        trials = [t for t in database.run_history(run_id) if t.state not in COSTLESS]
    return [t.gflops if t.state == "ok" else None for t in trials], [t.state for t in trials]


@dataclass
class Check:
    """The whole check: what it was told, the shared evaluator, and what came back so far."""

    args: argparse.Namespace
    scratch: Path
    evaluator: Any = None
    gpu: str = "?"
    device: dict[str, Any] = field(default_factory=dict)  # the evaluator's info(): UUID, driver…
    started: float = field(default_factory=time.monotonic)
    pairs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.args.deadline_s

    def argv(self, family: Any, problem: Problem, *, trials: int, timeout: float, patience: int,
             seed: int, url: str) -> list[str]:
        argv = ["--gpu", str(self.args.gpu), "--kernel", family.name, "--shape", problem.shape,
                "--trials", str(trials), "--timeout", f"{timeout:g}", "--patience", str(patience),
                "--seed", str(seed), "--sampler", self.args.sampler, "--db", url]
        return argv + (["--cache", str(self.args.cache)] if self.args.cache else [])

    def run(self, kind: str, family: Any, problem: Problem, *, trials: int, timeout: float,
            patience: int, seed: int, url: str) -> RunResult:
        """One ``python -m tuner`` invocation on the shared evaluator; its trials read back."""
        options = parse_args(self.argv(family, problem, trials=trials, timeout=timeout,
                                       patience=patience, seed=seed, url=url))
        known = {r.id for r in read_runs(url, self.gpu, family, problem)}  # --db's earlier runs
        print(f"[{self.elapsed():5.0f} s] {problem.shape} {family.name}: {kind} run, seed {seed}, "
              f"{trials} configs, at most {timeout:g} s", flush=True)
        started = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):  # the tuner's end table; ours follows
            status = tune(options, self.evaluator, progress=sys.stderr.isatty())
        result = RunResult(kind=kind, seed=seed, command=options.command, status=status,
                           wall_s=time.monotonic() - started)
        for r in read_runs(url, self.gpu, family, problem):
            if r.id in known:
                continue  # a reused database's earlier runs: in the reference, not in this run
            gflops, states = measured_trials(url, r.id)
            result.run_ids.append(r.id)
            result.gflops += gflops
            result.states += states
        best = result.best()
        print(f"          {result.measured} measured in {result.wall_s:.0f} s, best "
              + (f"{best:,.0f} GFLOP/s" if best else "-"), flush=True)
        self.interrupted = status == EXIT_INTERRUPTED
        return result

    def long_run(self, family: Any, problem: Problem) -> dict[str, Any] | None:
        """The reference of (shape, family): its long run and best, or None (no time, none ok)."""
        args = self.args
        url = args.db or f"sqlite:///{self.scratch / f'long-{family.name}-{problem.shape}.sqlite'}"
        long_run = None
        if args.long_trials:
            if not self.fits(args.long_timeout + args.short_timeout + 2 * STUDY_SLACK_S):
                self.skipped.append(f"{problem.shape} {family.name}: no time for the long run")
                return None
            long_run = self.run("long", family, problem, trials=args.long_trials,
                                timeout=args.long_timeout, patience=0, seed=0, url=url)
        runs = read_runs(url, self.gpu, family, problem)
        best = max((r.best_gflops for r in runs if r.best_gflops), default=None)
        if best is None:
            self.skipped.append(f"{problem.shape} {family.name}: no verified config in the "
                                "long run")
            return None
        how = (f"the best verified trial of {family.name}@{family.source_hash[:12]} for "
               f"({self.gpu}, {problem.shape}) over {len(runs)} run(s) in "
               + ("--db " + args.db if args.db else "the long run's fresh database"))
        if long_run is not None:
            score(long_run, best, args.checkpoints)
        return {"shape": problem.shape, "family": family.name, "source_hash": family.source_hash,
                "reference": {"gflops": best, "how": how, "run_ids": [r.id for r in runs],
                              "measured": sum(len(measured_trials(url, r.id)[0]) for r in runs)},
                "long": None if long_run is None else asdict(long_run), "short": []}

    def short_run(self, pair: dict[str, Any], family: Any, problem: Problem, seed: int) -> None:
        args = self.args
        if not self.fits(args.short_timeout + STUDY_SLACK_S):
            self.skipped.append(f"{problem.shape} {family.name}: no time for seed {seed}")
            return
        url = f"sqlite:///{self.scratch / f'short-{family.name}-{problem.shape}-{seed}.sqlite'}"
        result = self.run("short", family, problem, trials=args.short_trials,
                          timeout=args.short_timeout, patience=args.short_patience, seed=seed,
                          url=url)
        score(result, pair["reference"]["gflops"], args.checkpoints)
        pair["short"].append(asdict(result))

    def execute(self, families: list[Any], problems: list[Problem]) -> None:
        """Round one: every pair's long run and first seed; then one more seed per round."""
        order = [(problem, family) for problem in problems for family in families]
        for round_, seed in enumerate(self.args.seeds):
            for problem, family in order:
                if self.interrupted:
                    return
                key = (problem.shape, family.name)
                if round_ == 0:
                    pair = self.long_run(family, problem)
                    if pair is None:
                        continue
                    self.pairs[key] = pair
                elif key not in self.pairs:
                    continue
                if not self.interrupted:
                    self.short_run(self.pairs[key], family, problem, seed)
                self.write()

    def result(self) -> dict[str, Any]:
        args = self.args
        return {
            "issue": 15, "gpu": self.gpu, "device": self.device,
            "backend": os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": shlex.join(["python", "bench/live_check.py",
                                   *(sys.argv[1:] if args.argv is None else args.argv)]),
            "settings": {"shapes": args.shape, "families": args.family, "seeds": args.seeds,
                         "checkpoints": args.checkpoints, "sampler": args.sampler,
                         "short_trials": args.short_trials, "short_timeout_s": args.short_timeout,
                         "short_patience": args.short_patience, "long_trials": args.long_trials,
                         "long_timeout_s": args.long_timeout, "deadline_s": args.deadline_s,
                         "within": WITHIN, "db": args.db},
            "elapsed_s": self.elapsed(), "interrupted": self.interrupted,
            "skipped": self.skipped, "pairs": list(self.pairs.values()),
        }

    def write(self) -> Path:
        out = self.args.out or ROOT / "bench" / "results" / f"live_check-{gpu_slug(self.gpu)}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.result(), indent=1) + "\n")
        return out


def table(result: dict[str, Any]) -> str:
    checkpoints = result["settings"]["checkpoints"]
    rows = []
    for pair in result["pairs"]:
        reference = pair["reference"]["gflops"]
        # a long run resumed in --db may measure nothing new: no row of its own then
        runs = ([pair["long"]] if pair["long"] and pair["long"]["gflops"] else []) + pair["short"]
        for run in runs:
            rows.append([pair["shape"], pair["family"], result["settings"]["sampler"],
                         run["seed"] if run["kind"] == "short" else f"{run['seed']} long",
                         *(_fraction(run["fractions"][str(c)]) for c in checkpoints),
                         run["to_within"] or f">{len(run['gflops'])}", len(run["gflops"]),
                         f"{reference:,.0f}"])
    headers = ["shape", "family", "sampler", "seed", *(f"at {c}" for c in checkpoints),
               f"to {WITHIN:.0%}", "measured", "long-run best GFLOP/s"]
    lines = [format_table(headers, rows)]
    shorts = [run for pair in result["pairs"] for run in pair["short"]]
    if shorts:  # over every short run: the number to quote
        medians = [statistics.median(run["fractions"][str(c)] or 0.0 for run in shorts)
                   for c in checkpoints]
        reached = [run["to_within"] for run in shorts if run["to_within"]]
        lines.append(f"\nmedian over {len(shorts)} short runs: "
                     + ", ".join(f"{m:.3f} at {c}" for m, c in zip(medians, checkpoints))
                     + f"; within {WITHIN:.0%} in {len(reached)} of them"
                     + (f" (median {statistics.median(reached):g} measured configs)"
                        if reached else ""))
    return "\n".join(lines)


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers separated by commas")
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give non-negative integers")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=[],
                        help=f"MxNxK (repeat; default: {' '.join(DEFAULT_SHAPES)})")
    parser.add_argument("--family", action="append", default=[],
                        help=f"kernel family (repeat; default: {' '.join(DEFAULT_FAMILIES)}, "
                             "those the GPU runs)")
    parser.add_argument("--checkpoints", type=_int_list, default=[10, 20, 40],
                        help="measured configs to report the fraction at (default: 10,20,40)")
    parser.add_argument("--short-trials", type=int, default=40,
                        help="measured configs per short run (default: %(default)s)")
    parser.add_argument("--short-timeout", type=float, default=20.0,
                        help="seconds per short run, a bound only (default: %(default)s)")
    parser.add_argument("--short-patience", type=int, default=DEFAULT_PATIENCE,
                        help="as python -m tuner (default: the tuner's, %(default)s)")
    parser.add_argument("--long-trials", type=int, default=150,
                        help="measured configs of the long run; 0: no long run, the reference "
                             "is --db's best (default: %(default)s)")
    parser.add_argument("--long-timeout", type=float, default=25.0,
                        help="seconds per long run (default: %(default)s)")
    parser.add_argument("--seeds", type=_int_list, default=[1, 2, 3],
                        help="short runs' seeds, one round each, as time permits (default: 1,2,3)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="default")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=540.0,
                        help="start no study that could end after this (default: %(default)s)")
    parser.add_argument("--db", default=None,
                        help="results database URL for the long runs (kept, resumed; the "
                             "reference is its best over all runs); default: a fresh one")
    parser.add_argument("--cache", type=Path, default=None,
                        help="CUBIN cache folder (default: the tuner's)")
    parser.add_argument("--allow-recorded", action="store_true",
                        help="accept a shape a committed recording holds")
    parser.add_argument("--out", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    args.shape = args.shape or list(DEFAULT_SHAPES)
    args.family = args.family or list(DEFAULT_FAMILIES)
    try:
        problems = [parse_shape(s) for s in dict.fromkeys(args.shape)]
    except ShapeError as error:
        parser.error(str(error))
    unknown = [f for f in args.family if f not in kernels.FAMILIES]
    if unknown:
        parser.error(f"unknown family {', '.join(unknown)}; allowed: {', '.join(kernels.FAMILIES)}")
    too_large = [f for f in args.family if not study.enumerable(kernels.FAMILIES[f])]
    if args.sampler == "model" and too_large:  # python -m tuner refuses them: before any run
        parser.error(f"--sampler model ranks every accepted config, and {', '.join(too_large)} "
                     f"has more than {study.ENUMERABLE_SPACE:,}: leave it out of --family")
    if args.long_trials == 0 and not args.db:
        parser.error("--long-trials 0 takes the reference from --db: give --db")
    if min(args.checkpoints) < 1 or not args.seeds:
        parser.error("checkpoints must be positive and --seeds not empty")
    recorded = recorded_shapes()
    seen = {p.shape: recorded[p.shape] for p in problems if p.shape in recorded}
    for shape, files in seen.items():
        print(f"live_check: {shape} is in {', '.join(files)}: the default sampler may have been "
              "designed on it", file=sys.stderr)
    if seen and not args.allow_recorded:
        parser.error("a shape held by a recording is no live check (--allow-recorded to run "
                     "it anyway)")

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # as python -m tuner: no line per trial
    with tempfile.TemporaryDirectory(prefix="gemmtune-livecheck-") as scratch:
        check = Check(args, Path(scratch))
        try:
            check.evaluator = start_live(parse_args(["--gpu", str(args.gpu)]
                                                    + (["--cache", str(args.cache)]
                                                       if args.cache else [])).evaluator)
        except (GpuUnavailable, RuntimeError) as error:
            print(f"live_check: cannot measure on GPU {args.gpu}: {error}", file=sys.stderr)
            return 1
        with check.evaluator:
            check.device = check.evaluator.info()
            check.gpu = str(check.device.get("name"))
            arch = check.evaluator.arch()
            families = [kernels.FAMILIES[name] for name in dict.fromkeys(args.family)]
            for family in [f for f in families if not f.offered_on(arch)]:
                check.skipped.append(f"{family.name}: not offered on {arch}")
            families = [f for f in families if f.offered_on(arch)]
            print(f"live check on {check.gpu} ({arch}): {len(problems)} shape(s) x "
                  f"{len(families)} famil{'y' if len(families) == 1 else 'ies'}, seeds "
                  f"{args.seeds}, deadline {args.deadline_s:g} s", flush=True)
            check.execute(families, problems)
    out = check.write()
    result = check.result()
    print()
    print(table(result))
    for line in check.skipped:
        print(f"skipped: {line}")
    print(f"\nwrote {out} ({check.elapsed():.0f} s)")
    if result["backend"] == "tuner.testing":
        print(f"({BACKEND_ENV}=tuner.testing: a CPU stand-in; these are no GPU measurements)")
    return EXIT_INTERRUPTED if check.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
