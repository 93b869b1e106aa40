"""``python -m tuner.record``: measure a sweep of configs on the GPU and write a recording.

    python -m tuner.record --family blocktile2d --family vectorized \\
        --grid vectorized:RASTER=1,8 --shape 2048x2048x2048 --shape 1024x1024x4096 \\
        --max-configs 500 --seed 0 \\
        --out tuner/recordings/h100-blocktile2d+vectorized-2048x2048x2048+1024x1024x4096.json.gz

Per family the configs are the accepted configs of its grid (all declared values, or those
``--grid FAMILY:PARAM=v1,v2`` keeps): every one of them when there are at most
``--max-configs``, else a uniform sample of that many (the file says which). All configs are
compiled once in a pool of CPU processes; each shape then gets one ``set_problem``, one cuBLAS
baseline and one measurement per config, in-process with ``tuner.measure.gpu.GpuBench``, exactly as
the tuner's GPU child measures. A sticky CUDA error is recorded as ``crashed`` and the bench is
re-created. A recording of the full accepted space is what the search-efficiency benchmark
needs: then its recorded optimum is the optimum of the space the search sees.

Plan the size: about 0.1-0.3 s per config and shape on an H100 (verification included), so
2 families x 3 shapes x 400 configs take about 5-8 minutes; ``--time-limit`` stops measuring
early and writes what was measured (the note in the file says so), and ``--resume FILE`` with
the same command measures only what that file lacks (the note says which parts came later).

``--retime-fastest K`` then times each shape's K fastest configs ``--retime-rounds`` more times,
in shuffled rounds, and keeps each one's median timing: where single timings are noisy (tf32x3
on an H100 throttles, ~4 % per timing), the fastest single timing is partly luck, and it is the
target the search benchmark counts against.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence, TypeVar

import kernels

from tuner.measure.evaluator import COMPILE_ERROR, CRASHED, Evaluator
from tuner.problem import Problem, ShapeError, parse_shape
from tuner.measure.recording import (
    FamilyHeader,
    ProblemRecording,
    RecordedResult,
    Recording,
    RecordingError,
    Selection,
)
from tuner.measure.recording import load as load_recording


# ------------------------------------------------------------------ choosing the configs


def parse_grid(texts: Iterable[str], families: Sequence[Any]) -> dict[str, dict[str, tuple[int, ...]]]:
    """``["warptile:BK=8,16", …]`` → {family: {param: values}}; raises ValueError naming what
    is wrong and what is allowed."""
    by_name = {f.name: f for f in families}
    narrowed: dict[str, dict[str, tuple[int, ...]]] = {}
    for text in texts:
        head, sep, values_text = text.partition("=")
        family_name, colon, param_name = head.partition(":")
        if not sep or not colon:
            raise ValueError(f"--grid {text!r}: expected FAMILY:PARAM=v1,v2,...")
        family = by_name.get(family_name)
        if family is None:
            raise ValueError(f"--grid {text!r}: family {family_name!r} is not swept; swept: "
                             f"{', '.join(by_name)}")
        params = {p.name: p for p in family.params}
        if param_name not in params:
            raise ValueError(f"--grid {text!r}: {family_name} has no parameter {param_name!r}; "
                             f"its parameters: {', '.join(params)}")
        try:
            values = tuple(int(v) for v in values_text.split(","))
        except ValueError:
            raise ValueError(f"--grid {text!r}: values must be integers separated by commas") from None
        bad = [v for v in values if v not in params[param_name].values]
        if bad or not values:
            raise ValueError(f"--grid {text!r}: {bad or 'no values'} not allowed for "
                             f"{param_name}; allowed: {list(params[param_name].values)}")
        narrowed.setdefault(family_name, {})[param_name] = tuple(sorted(set(values)))
    return narrowed


def choose_configs(family: Any, grid: dict[str, tuple[int, ...]], max_configs: int,
                   seed: int, arch: str) -> tuple[FamilyHeader, list[dict[str, int]]]:
    """The header (grid + how the configs were chosen) and the configs, in enumeration order."""
    full_grid = {p.name: tuple(grid.get(p.name, p.values)) for p in family.params}
    accepted = [c for c in family.accepted_configs(arch)
                if all(c[name] in values for name, values in full_grid.items())]
    if len(accepted) <= max_configs:
        chosen, selection = accepted, Selection("full", len(accepted), len(accepted), None)
    else:
        picked = set(random.Random(seed).sample(range(len(accepted)), max_configs))
        chosen = [c for i, c in enumerate(accepted) if i in picked]
        selection = Selection("sample", len(accepted), max_configs, seed)
    header = FamilyHeader(family.name, family.source_hash, tuple(p.name for p in family.params),
                          full_grid, selection)
    return header, chosen


# ------------------------------------------------------------------ resuming


class ResumeError(ValueError):
    """A --resume file that another command or another GPU model made."""


def start_recording(resume: Recording | None, info: dict[str, Any], arch: str,
                    headers: Sequence[FamilyHeader]) -> Recording:
    """A new recording, or ``resume`` when it was made by the same command on the same GPU
    model (same families, grids, selections and kernel sources); ResumeError names what differs."""
    if resume is None:
        return Recording(gpu=info, arch=arch, nvrtc_version=info.get("nvrtc_version"),
                         families={h.name: h for h in headers}, problems=[],
                         created_at=datetime.now(timezone.utc))
    problems = []
    if resume.arch != arch or resume.gpu.get("name") != info.get("name"):
        problems.append(f"it was recorded on {resume.gpu.get('name')} ({resume.arch}), this is "
                        f"{info.get('name')} ({arch})")
    ours = {h.name: h for h in headers}
    if set(resume.families) != set(ours):
        problems.append(f"it holds families {sorted(resume.families)}, this command sweeps "
                        f"{sorted(ours)}")
    for name in set(resume.families) & set(ours):
        if resume.families[name] != ours[name]:
            problems.append(f"{name}'s grid, selection or kernel source differ from this "
                            "command's")
    if problems:
        raise ResumeError("cannot resume that recording: " + "; ".join(problems))
    return resume


def left_to_measure(recording: Recording, family: str, problem: Problem,
                    configs: Sequence[dict[str, int]]) -> list[dict[str, int]]:
    """The configs with no result yet for (family, problem), in the given order."""
    return [c for c in configs if recording.result(family, problem, c) is None]


# ------------------------------------------------------------------ re-timing the fastest

# A recording times each config once. Where a family's timings are noisy (tf32x3 on an H100
# throttles: one timing spreads by ~4 %, docs/measurement.md, "Recording noise
# (bench/recording_noise.py)"), the fastest single timing of a shape is partly luck, and it sets
# the search benchmark's target. ``--retime-fastest K`` times each shape's K fastest configs
# ``--retime-rounds`` more times and keeps the median.
RETIME_ROUNDS = 4
Item = TypeVar("Item")  # what is measured: a config, or a config with its family
Result = TypeVar("Result")  # what one measurement gives: a RecordedResult, a Measurement


def time_in_rounds(configs: Sequence[Item], rounds: int, measure: Callable[[Item], Result],
                   rng: random.Random) -> list[list[Result]]:
    """Each config measured ``rounds`` times, every round in a fresh random order, so that the
    clock's drift and the GPU's heat fall on all configs alike; per round, one result per
    config, in the given order."""
    timed = []
    for _ in range(rounds):
        results: list[Result | None] = [None] * len(configs)
        for i in rng.sample(range(len(configs)), len(configs)):
            results[i] = measure(configs[i])
        timed.append(results)
    return timed  # type: ignore[return-value]


def median_by(items: Sequence[Item], key: Callable[[Item], float]) -> Item:
    """The item with the median ``key`` (of an even count, the lower of the middle two): a whole
    measurement, so that its times, clock and GFLOP/s stay one run's."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def median_result(results: Sequence[RecordedResult]) -> RecordedResult:
    """The result with the median GFLOP/s, a failed one counting 0 (``median_by``)."""
    return median_by(results, lambda r: float(r.gflops) if r.usable else 0.0)


def retime_fastest(recording: Recording, family: str, problem: Problem, count: int,
                   rounds: int, measure: Callable[[dict[str, int]], RecordedResult],
                   rng: random.Random) -> int:
    """Re-time the ``count`` fastest verified configs of (family, problem) ``rounds`` times
    each (``time_in_rounds``; ``measure``: one measurement at ``problem``) and store for each
    the median of its recorded and new results. Returns how many configs were re-timed."""
    chosen = recording.fastest(family, problem, count)
    timed = time_in_rounds([config for config, _ in chosen], rounds, measure, rng)
    for i, (config, recorded) in enumerate(chosen):
        recording.add(family, problem, config,
                      median_result([recorded, *(round_[i] for round_ in timed)]))
    return len(chosen)


def retime_note(count: int, rounds: int) -> str:
    return (f"; then the {count} fastest configs of each (family, shape) were timed {rounds} "
            "more times in shuffled rounds, each keeping its median timing")


# ------------------------------------------------------------------ any evaluator (tests)


def record_with_evaluator(evaluator: Evaluator, families: Sequence[Any],
                          problems: Sequence[Problem], *, max_configs: int, seed: int = 0,
                          grid: dict[str, dict[str, tuple[int, ...]]] | None = None,
                          note: str = "", resume: Recording | None = None,
                          retime: int = 0, rounds: int = RETIME_ROUNDS) -> Recording:
    """A recording made through the Evaluator interface (e.g. the CPU stand-in in tests). The
    GPU sweep below measures in-process instead, as the task of a recording host is speed.
    ``retime``: re-time each shape's that many fastest configs (``retime_fastest``)."""
    arch = evaluator.arch()
    chosen = {f.name: choose_configs(f, (grid or {}).get(f.name, {}), max_configs, seed, arch)
              for f in families}
    recording = start_recording(resume, evaluator.info(), arch, [h for h, _ in chosen.values()])
    recording.note = note or recording.note
    rng = random.Random(seed)
    for problem in problems:
        todo = {f.name: left_to_measure(recording, f.name, problem, chosen[f.name][1])
                for f in families}
        if not any(todo.values()) and not retime:
            continue
        evaluator.set_problem(problem)
        if recording.problem(problem) is None:  # a resumed problem keeps its first baseline
            try:
                b = evaluator.baseline()
                baseline = {"library": b.library, "time_median_ms": b.time_median_ms,
                            "gflops": b.gflops, "sm_clock_mhz": b.sm_clock_mhz}
            except RuntimeError:
                baseline = None
            recording.problems.append(ProblemRecording(problem, baseline))
        for family in families:
            for config in todo[family.name]:
                m = evaluator.evaluate(family, config, problem)
                recording.add(family.name, problem, config,
                              RecordedResult.from_mapping(m.fields()))
        for family in families if retime else ():
            retime_fastest(recording, family.name, problem, retime, rounds,
                           lambda config, family=family: RecordedResult.from_mapping(
                               evaluator.evaluate(family, config, problem).fields()), rng)
    if retime:
        recording.note += retime_note(retime, rounds)
    return recording


# ------------------------------------------------------------------ the GPU sweep


def measure_config(bench: Any, family: Any, config: dict[str, int], problem: Problem,
                   compiled: Any, arch: str) -> RecordedResult:
    """One config's measurement as a recording keeps it (``bench``: a ``GpuBench`` set to
    ``problem``; ``compiled``: the config's compile from a ``CompilePool``)."""
    from tuner.measure.resources import summarize

    if compiled.cubin is None:
        return RecordedResult(state=COMPILE_ERROR, error=compiled.error,
                              compile_seconds=compiled.seconds)
    used = summarize(family, config, problem, compiled.resources, arch)
    common = {"compile_seconds": compiled.seconds, "registers": used.registers,
              "shared_bytes": used.shared_bytes, "spill_bytes": used.spill_bytes,
              "occupancy": used.occupancy}
    m, n, k = problem.m, problem.n, problem.k
    result = bench.evaluate(compiled.cubin, family.launches(config, m, n, k),
                            family.workspace_bytes(config, m, n, k), family.flops(m, n, k))
    return RecordedResult.from_mapping({**result, **common})


class GpuMeasurer:
    """Configs measured on one GPU as a recording keeps them (``measure_config``); a config
    that kills the GPU context is recorded ``crashed`` (counted in ``crashes``) and the bench
    re-created, set to the same problem."""

    def __init__(self, device: int) -> None:
        from tuner.measure.gpu import GpuBench

        self.device = device
        self.bench = GpuBench(device)
        self.arch: str = self.bench.arch()
        self.problem: Problem | None = None
        self.crashes = 0

    def set_problem(self, problem: Problem) -> None:
        self.bench.set_problem(problem.m, problem.n, problem.k, layout=problem.layout, batch=problem.batch)
        self.problem = problem

    def measure(self, family: Any, config: dict[str, int], compiled: Any) -> RecordedResult:
        """``compiled``: the config's compile (a ``CompilePool`` future)."""
        from tuner.measure.gpu import GpuBench, GpuFault

        assert self.problem is not None, "set_problem comes first"
        try:
            return measure_config(self.bench, family, config, self.problem, compiled.result(),
                                  self.arch)
        except GpuFault as fault:  # this context is dead: record, start afresh
            self.crashes += 1
            self.bench = GpuBench(self.device)
            self.set_problem(self.problem)
            return RecordedResult(state=CRASHED, error=f"{fault}; the bench was re-created")


def sweep_gpu(families: Sequence[Any], problems: Sequence[Problem], *, max_configs: int,
              seed: int, grid: dict[str, dict[str, tuple[int, ...]]], device: int = 0,
              workers: int | None = None, cache_dir: str | None = None,
              time_limit_s: float | None = None, progress: bool = True,
              command: str = "", resume: Recording | None = None, retime: int = 0,
              rounds: int = RETIME_ROUNDS) -> Recording:
    from tqdm import tqdm

    from tuner.measure.live import CompilePool, default_workers

    started = time.monotonic()
    gpu = GpuMeasurer(device)
    arch, info = gpu.arch, gpu.bench.info()
    chosen = {f.name: choose_configs(f, grid.get(f.name, {}), max_configs, seed, arch)
              for f in families}
    recording = start_recording(resume, info, arch, [h for h, _ in chosen.values()])
    earlier = recording.note
    # (family, config) left per problem; configs a resumed file has on every problem are not
    # even compiled
    todo = {p: [(f, c) for f in families
                for c in left_to_measure(recording, f.name, p, chosen[f.name][1])]
            for p in problems}
    pool = CompilePool(arch, cache_dir, workers or default_workers())
    try:
        futures: dict[tuple[str, tuple[tuple[str, int], ...]], Any] = {}
        for family in families:
            print(f"{family.name}: {chosen[family.name][0].selection.text}", file=sys.stderr)
        for pairs in todo.values():
            for family, config in pairs:
                key = (family.name, tuple(config.items()))
                if key not in futures:
                    futures[key] = pool.submit(family, config)

        def measure(family: Any, config: dict[str, int]) -> RecordedResult:
            # the sweep's configs were queued above; a resumed file's re-timed ones are queued
            # on their first round and kept for the others
            key = (family.name, tuple(config.items()))
            if key not in futures:
                futures[key] = pool.submit(family, config)
            return gpu.measure(family, config, futures[key])

        total, done, stopped = sum(map(len, todo.values())), 0, None
        retimed = 0
        rng = random.Random(seed)
        bar = tqdm(total=total, unit="config", disable=not progress, dynamic_ncols=True)
        for problem in problems:
            if not todo[problem] and not retime:
                continue
            gpu.set_problem(problem)
            entry = recording.problem(problem)
            if entry is None:  # a resumed problem keeps its first baseline
                entry = ProblemRecording(problem, gpu.bench.baseline())
                recording.problems.append(entry)
            gflops = (entry.baseline or {}).get("gflops") or 0
            bar.set_description(f"{problem.shape} (cuBLAS {gflops:,.0f} GFLOP/s)")
            for family, config in todo[problem]:
                if time_limit_s is not None and time.monotonic() - started > time_limit_s:
                    stopped = f"stopped at the time limit ({time_limit_s:g} s)"
                    break
                recording.add(family.name, problem, config, measure(family, config))
                done += 1
                bar.update(1)
            if stopped:
                break
            for family in families if retime else ():
                retimed += retime_fastest(
                    recording, family.name, problem, retime, rounds,
                    lambda config, family=family: measure(family, config), rng)
        bar.close()
    finally:
        pool.close()
    elapsed = time.monotonic() - started
    recording.note = (
        f"python -m tuner.record on {info['name']}: {done} of {total} (family, shape, config) "
        f"measurements in {elapsed:.0f} s, {gpu.crashes} crash(es)"
        + (f"; {stopped}, so later configs are absent" if stopped else "")
        + (retime_note(retime, rounds) + f" ({retimed} configs)" if retimed else "")
        + (f"; command: {command}" if command else "")
        + (f" || resumed a recording made earlier (baselines from then): {earlier}"
           if resume is not None else "")
    )
    return recording


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.record", description=__doc__.split("\n\n")[0],
        epilog="Example: python -m tuner.record --family blocktile2d --shape 2048x2048x2048 "
               "--max-configs 500 --out rec.json.gz",
    )
    parser.add_argument("--family", action="append", required=True, metavar="F",
                        help="kernel family to sweep; repeat for several")
    parser.add_argument("--shape", action="append", required=True, metavar="MxNxK",
                        help="problem shape; repeat for several")
    parser.add_argument("--grid", action="append", default=[], metavar="F:PARAM=v1,v2",
                        help="narrow a family's parameter to these values; repeatable")
    parser.add_argument("--max-configs", type=_positive_int, default=500, metavar="N",
                        help="configs per family: all accepted ones of the grid if at most N, "
                             "else a uniform sample of N (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default: 0)")
    parser.add_argument("--out", metavar="FILE",
                        help="recording to write (.json.gz: gzip-compressed)")
    parser.add_argument("--gpu", type=int, default=0, metavar="INDEX")
    parser.add_argument("--workers", type=_positive_int, default=None,
                        help="compile processes (default: CPU cores - 1, at most 8)")
    parser.add_argument("--cache", default=None, metavar="DIR", help="CUBIN cache folder")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop measuring after this long and write what was measured")
    parser.add_argument("--resume", metavar="FILE",
                        help="a recording this same command left unfinished (e.g. at "
                             "--time-limit): measure only what it lacks and write the whole to "
                             "--out (may be the same file)")
    parser.add_argument("--retime-fastest", type=_non_negative_int, default=0, metavar="K",
                        help="after each shape's sweep, time its K fastest configs per family "
                             "--retime-rounds more times and keep each one's median timing "
                             "(default: 0, off; with --resume of a finished file, re-times it)")
    parser.add_argument("--retime-rounds", type=_positive_int, default=RETIME_ROUNDS,
                        metavar="R", help="extra timings per re-timed config (default: "
                                          "%(default)s)")
    parser.add_argument("--plan", action="store_true",
                        help="print how many configs each family would get, then stop "
                             "(no GPU needed)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    families = []
    for name in args.family:
        if name not in kernels.FAMILIES:
            parser.error(f"--family: unknown family {name!r}; allowed: {', '.join(kernels.FAMILIES)}")
        families.append(kernels.FAMILIES[name])
    try:
        problems = list(dict.fromkeys(parse_shape(s) for s in args.shape))
        grid = parse_grid(args.grid, families)
    except (ShapeError, ValueError) as error:
        parser.error(str(error))
    if args.plan:
        for family in families:
            header, configs = choose_configs(family, grid.get(family.name, {}),
                                             args.max_configs, args.seed, "sm_90")
            print(f"{family.name}: {header.selection.text}; x {len(problems)} shape(s) = "
                  f"{len(configs) * len(problems)} measurements")
        return 0
    if not args.out:
        parser.error("--out FILE is required (except with --plan)")
    resume = None
    if args.resume:
        try:
            resume = load_recording(args.resume)
        except (OSError, RecordingError) as error:
            parser.error(f"--resume {args.resume}: {error}")
    command = " ".join(["python -m tuner.record", *(argv if argv is not None else sys.argv[1:])])
    try:
        recording = sweep_gpu(families, problems, max_configs=args.max_configs, seed=args.seed,
                              grid=grid, device=args.gpu, workers=args.workers,
                              cache_dir=args.cache, time_limit_s=args.time_limit,
                              command=command, resume=resume, retime=args.retime_fastest,
                              rounds=args.retime_rounds)
    except ResumeError as error:
        parser.error(f"--resume {args.resume}: {error}")
    path = recording.save(args.out)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB): {recording.note}")
    for name, problem in recording.pairs():
        best = recording.optimum(name, problem)
        if best:
            print(f"  {name} {problem.shape}: best {best[1]:,.0f} GFLOP/s "
                  f"{' '.join(f'{k}={v}' for k, v in best[0].items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
