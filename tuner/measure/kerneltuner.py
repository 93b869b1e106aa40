"""Results in Kernel Tuner's formats, to compare with it and move results between the tools.

    python -m tuner.kerneltuner export --run ID [--db URL] --out results.json
    python -m tuner.kerneltuner import CACHEFILE --family F --shape MxNxK --out rec.json.gz
    python -m tuner.kerneltuner cache RECORDING --family F --shape MxNxK --out cache.json

* export: one run's trials as a T4 results file (the community autotuning results schema that
  Kernel Tuner writes: ``{"schema_version": "1.0.0", "results": [{"timestamp",
  "configuration", "objectives", "times", "invalidity", "correctness", "measurements"}]}``).
  Trials the replay answered ``missing`` were never measured and are left out.
* import: a Kernel Tuner cache file (the JSON written with ``cache=``: ``tune_params_keys``,
  ``tune_params`` and ``cache``, whose keys are the comma-joined parameter values) becomes a
  recording of one family and shape, replayable with ``python -m tuner --replay``.
* cache: the reverse, a recording's (family, shape) as a Kernel Tuner cache file, which Kernel
  Tuner can use as a simulation (``simulation_mode=True``) backend.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timezone
from pathlib import Path
from typing import Any, Sequence

import kernels

from tuner.measure.evaluator import COMPILE_ERROR, CRASHED, LAUNCH_ERROR, OK, TIMEOUT, WRONG_RESULT
from tuner.problem import Problem, ShapeError, parse_shape
from tuner.measure.recording import (
    FamilyHeader,
    ProblemRecording,
    RecordedResult,
    Recording,
    RecordingError,
    Selection,
    load,
)

T4_VERSION = "1.0.0"
CACHE_VERSION = "1.0.0"

# Our trial states → T4 "invalidity".
INVALIDITY = {
    OK: "correct", "rejected": "constraints", COMPILE_ERROR: "compile",
    LAUNCH_ERROR: "runtime", CRASHED: "runtime", TIMEOUT: "timeout",
    WRONG_RESULT: "correctness",
}
# Kernel Tuner's error markers in a cache's "time" field → our states.
CACHE_ERRORS = {
    "CompilationFailedConfig": COMPILE_ERROR,
    "RuntimeFailedConfig": LAUNCH_ERROR,
}
CACHE_SKIPPED = {"InvalidConfig"}  # failed Kernel Tuner's restrictions: never measured
CACHE_ERROR_TIME = 1e20  # older Kernel Tuner versions wrote this time for a failed config


class KernelTunerFormatError(ValueError):
    """A Kernel Tuner file this module cannot use; the message says which and why."""


# ------------------------------------------------------------------ export: T4 results


def t4_results(database: Any, run_id: int) -> dict[str, Any]:
    """A run's trials, in trial order, as a T4 results document."""
    run = database.get_run(run_id)
    results = []
    for trial in database.run_history(run_id):
        if trial.state not in INVALIDITY:  # "missing": nothing was measured
            continue
        stamp = trial.started_at or trial.recorded_at
        measurements = [
            {"name": name, "value": value, "unit": unit}
            for name, value, unit in (
                ("time", trial.time_median_ms, "ms"), ("time_min", trial.time_min_ms, "ms"),
                ("time_max", trial.time_max_ms, "ms"), ("GFLOP/s", trial.gflops, "GFLOP/s"),
                ("registers", trial.registers, ""), ("shared_bytes", trial.shared_bytes, "B"),
                ("spill_bytes", trial.spill_bytes, "B"), ("occupancy", trial.occupancy, ""),
                ("sm_clock", trial.sm_clock_mhz, "MHz"), ("launches", trial.launches, ""),
            )
            if value is not None
        ]
        if trial.error:
            measurements.append({"name": "error", "value": trial.error, "unit": ""})
        results.append({
            "timestamp": stamp.astimezone(timezone.utc).isoformat(),
            "configuration": dict(trial.params),
            "objectives": ["time"],
            # T4's per-config timings, in seconds; individual runtimes are not kept (only the
            # min/median/max, under measurements), so the list stays empty.
            "times": {"compilation": trial.compile_seconds or 0.0, "runtimes": []},
            "invalidity": INVALIDITY[trial.state],
            "correctness": 0 if trial.state == WRONG_RESULT else 1,
            "measurements": measurements,
        })
    return {
        "schema_version": T4_VERSION,
        "results": results,
        # not part of T4 (which allows extra keys): where the results came from
        "gemmtune": {"run_id": run.id, "gpu": run.gpu_name, "gpu_uuid": run.gpu_uuid,
                     "family": run.family, "source_hash": run.source_hash,
                     "problem": [run.problem.m, run.problem.n, run.problem.k],
                     "sampler": run.sampler, "seed": run.seed},
    }


# ------------------------------------------------------------------ cache → recording


def _cache_result(entry: Any, flops: int, where: str) -> RecordedResult | None:
    if not isinstance(entry, dict) or "time" not in entry:
        raise KernelTunerFormatError(f"{where}: an entry needs a 'time' field")
    time = entry["time"]
    compile_s = entry.get("compile_time")
    compile_s = compile_s / 1000.0 if isinstance(compile_s, (int, float)) else None  # KT: ms
    if isinstance(time, str):
        if time in CACHE_SKIPPED:
            return None
        state = CACHE_ERRORS.get(time)
        if state is None:
            raise KernelTunerFormatError(
                f"{where}: time {time!r} is not a number nor a known error marker "
                f"({', '.join([*CACHE_ERRORS, *CACHE_SKIPPED])})")
        return RecordedResult(state=state, error=f"Kernel Tuner: {time}",
                              compile_seconds=compile_s)
    if not isinstance(time, (int, float)) or isinstance(time, bool):
        raise KernelTunerFormatError(f"{where}: time {time!r} is not a number")
    if time >= CACHE_ERROR_TIME:
        return RecordedResult(state=LAUNCH_ERROR, error="Kernel Tuner: failed config (time 1e20)",
                              compile_seconds=compile_s)
    if time <= 0:
        raise KernelTunerFormatError(f"{where}: time {time} ms is not positive")
    times = [t for t in entry.get("times") or [] if isinstance(t, (int, float))]
    gflops = entry.get("GFLOP/s")
    if not isinstance(gflops, (int, float)) or gflops <= 0:
        gflops = flops / (time * 1e-3) / 1e9  # time is the mean runtime in ms
    return RecordedResult(
        state=OK, time_median_ms=float(time), gflops=float(gflops),
        time_min_ms=min(times) if times else None, time_max_ms=max(times) if times else None,
        launches=len(times) or None, compile_seconds=compile_s,
    )


def recording_from_cache(cache: dict[str, Any], family: Any, problem: Problem, *,
                         gpu: dict[str, Any] | None = None, arch: str = "sm_90",
                         source: str = "cache") -> Recording:
    """Validates a Kernel Tuner cache against the family and turns it into a recording."""
    for field in ("tune_params_keys", "cache"):
        if field not in cache:
            raise KernelTunerFormatError(f"{source}: not a Kernel Tuner cache file (no "
                                         f"{field!r} field)")
    keys = list(cache["tune_params_keys"])
    names = [p.name for p in family.params]
    if sorted(keys) != sorted(names):
        raise KernelTunerFormatError(
            f"{source}: tune_params_keys {keys} do not match the parameters of family "
            f"{family.name!r}: {names}")
    allowed = {p.name: set(p.values) for p in family.params}
    tune_params = cache.get("tune_params") or {}
    grid = {name: tuple(sorted(int(v) for v in tune_params.get(name, allowed[name])
                               if int(v) in allowed[name]))
            for name in names}
    device = str(cache.get("device_name") or "unknown GPU")
    info = {"name": device, "uuid": f"kernel-tuner:{device}", "compute_capability": "unknown",
            "sm_count": 0, "memory_bytes": 0, "max_sm_clock_mhz": None, "driver_version": None,
            "cuda_version": None, "nvrtc_version": None} | (gpu or {})
    flops = family.flops(problem.m, problem.n, problem.k)
    rows: dict[tuple[int, ...], RecordedResult] = {}
    for text, entry in cache["cache"].items():
        where = f"{source}: cache entry {text!r}"
        try:
            values = [int(v) for v in str(text).split(",")]
        except ValueError:
            raise KernelTunerFormatError(f"{where}: the key is not comma-joined integers") from None
        if len(values) != len(keys):
            raise KernelTunerFormatError(f"{where}: {len(values)} values for {len(keys)} "
                                         f"parameters {keys}")
        config = dict(zip(keys, values))
        bad = [f"{n}={v}" for n, v in config.items() if v not in grid[n]]
        if bad:
            raise KernelTunerFormatError(f"{where}: {', '.join(bad)} not allowed by family "
                                         f"{family.name!r} (or tune_params)")
        result = _cache_result(entry, flops, where)
        if result is not None:
            rows[tuple(config[n] for n in names)] = result
    accepted = sum(1 for c in family.accepted_configs(arch)
                   if all(c[n] in grid[n] for n in names))
    header = FamilyHeader(family.name, family.source_hash, tuple(names), grid,
                          Selection("full" if len(rows) >= accepted else "imported", accepted,
                                    len(rows), None))
    recording = Recording(
        gpu=info, arch=arch, nvrtc_version=None, families={family.name: header},
        problems=[ProblemRecording(problem, None, {family.name: rows})],
        note=(f"imported from the Kernel Tuner cache {source} (kernel "
              f"{cache.get('kernel_name', '?')!r}, {len(rows)} configs"
              + ("" if len(rows) >= accepted else ", chosen by Kernel Tuner's strategy") + ")"),
    )
    return recording


def cache_from_recording(recording: Recording, family: str, problem: Problem) -> dict[str, Any]:
    """A recording's (family, problem) as a Kernel Tuner cache document."""
    header = recording.families[family]
    entries: dict[str, Any] = {}
    stamp = recording.created_at.astimezone(timezone.utc).isoformat()
    for config, result in recording.results(family, problem):
        key = ",".join(str(config[name]) for name in header.params)
        compile_ms = None if result.compile_seconds is None else result.compile_seconds * 1000
        entry: dict[str, Any] = {
            **config,
            "compile_time": compile_ms or 0.0, "verification_time": 0, "benchmark_time": 0,
            "strategy_time": 0, "framework_time": 0, "timestamp": stamp,
        }
        if result.usable:
            entry |= {"time": result.time_median_ms, "GFLOP/s": result.gflops,
                      "times": [t for t in (result.time_min_ms, result.time_median_ms,
                                            result.time_max_ms) if t is not None]}
        elif result.state == COMPILE_ERROR:
            entry["time"] = "CompilationFailedConfig"
        else:
            entry["time"] = "RuntimeFailedConfig"
        entries[key] = entry
    return {
        "schema_version": CACHE_VERSION, "device_name": recording.gpu.get("name", "unknown"),
        "kernel_name": family, "problem_size": [problem.m, problem.n, problem.k],
        "tune_params_keys": list(header.params),
        "tune_params": {name: list(values) for name, values in header.grid.items()},
        "objective": "time", "cache": entries,
    }


# ------------------------------------------------------------------ CLI


def _read_json(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise KernelTunerFormatError(f"cannot read {path!r}: {error.strerror}") from None
    # Kernel Tuner leaves a cache it is still writing without its closing braces
    for candidate in (text, text.rstrip().rstrip(",") + "}}"):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    raise KernelTunerFormatError(f"{path}: not JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tuner.kerneltuner",
                                     description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    export = verbs.add_parser("export", help="a run's trials as a T4 results JSON file")
    export.add_argument("--run", type=int, required=True, metavar="ID")
    export.add_argument("--db", default=None, metavar="URL",
                        help="results database (default: $GEMMTUNE_DB, else the default file)")
    export.add_argument("--out", required=True, metavar="FILE")
    imp = verbs.add_parser("import", help="a Kernel Tuner cache file as a recording")
    imp.add_argument("cachefile")
    imp.add_argument("--family", required=True)
    imp.add_argument("--shape", required=True, metavar="MxNxK")
    imp.add_argument("--arch", default="sm_90", help="constraints' target (default: sm_90)")
    imp.add_argument("--out", required=True, metavar="RECORDING")
    cache = verbs.add_parser("cache", help="a recording's family and shape as a Kernel Tuner cache")
    cache.add_argument("recording")
    cache.add_argument("--family", required=True)
    cache.add_argument("--shape", required=True, metavar="MxNxK")
    cache.add_argument("--out", required=True, metavar="FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.verb == "export":
            import db

            with db.open_database(args.db) as database:
                document = t4_results(database, args.run)
            Path(args.out).write_text(json.dumps(document, indent=1))
            print(f"wrote {args.out}: {len(document['results'])} results of run {args.run}")
            return 0
        problem = parse_shape(args.shape)
        if args.verb == "import":
            family = kernels.get_family(args.family)
            recording = recording_from_cache(_read_json(args.cachefile), family, problem,
                                             arch=args.arch, source=args.cachefile)
            recording.save(args.out)
            print(f"wrote {args.out}: {recording.note}")
            return 0
        recording = load(args.recording)
        if (args.family, problem) not in recording.pairs():
            raise RecordingError(
                f"{args.recording} has no results for {args.family} at {problem.shape}; it has "
                + ", ".join(f"{f} {p.shape}" for f, p in recording.pairs()))
        Path(args.out).write_text(json.dumps(cache_from_recording(recording, args.family, problem)))
        print(f"wrote {args.out}")
        return 0
    except (KernelTunerFormatError, RecordingError, ShapeError, kernels.ConfigError) as error:
        print(f"python -m tuner.kerneltuner {args.verb}: {error}", file=sys.stderr)
        return 2
    except LookupError as error:  # db.UnknownRunError
        print(f"python -m tuner.kerneltuner {args.verb}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
