"""The speed suite: our best tuned kernel against cuBLAS FP32 (no TF32), same process, same run.

    python bench/speed.py [--gpu 0] [--db URL] [--tune | --no-tune] [--trials N] [--timeout S]
                          [--shape MxNxK ...] [--family F ...] [--out FILE]

For each problem, the top stored configs (verified, this GPU model, the families' current source)
come from the results database; a problem with none (every problem with --tune) is tuned first
by `python -m tuner` in a subprocess. Then one GpuBench re-measures, per problem, in two
interleaved passes (cuBLAS, every candidate, cuBLAS, every candidate; each verified again
before timing), and each side counts its faster pass.
Prints the table, the geometric mean of the ratios and the issue's targets; writes JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
import kernels  # noqa: E402
from tuner.measure import gpu as gpu_bench  # noqa: E402  (its timing constants, for the record)
from tuner.measure.live import BACKEND_ENV, DEFAULT_BACKEND, backend_module  # noqa: E402
from tuner.problem import Problem, ShapeError, parse_shape  # noqa: E402
from tuner.report import config_text, format_table  # noqa: E402
from tuner.run.options import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE  # noqa: E402

from bench.throughput import gpu_slug  # noqa: E402

SUITE: tuple[Problem, ...] = tuple(parse_shape(s) for s in (
    "1024x1024x1024", "2048x2048x2048", "4096x4096x4096", "8192x8192x8192", "4096x4096x1024",
    "256x256x16384", "16x4096x4096", "128x4096x4096", "4096x11008x4096", "1023x1025x999"))
SQUARE_4096, SKINNY = parse_shape("4096x4096x4096"), parse_shape("16x4096x4096")
# Issue 60's bar on the H100 (the FP16 rung; it subsumes issue 14's 2x / 1.8x / 1.2x): the large
# squares at 3x, the suite's geometric mean at 2.5x with none under 1.5x; and the skinny rung's
# 2x at 16x4096x4096 (issue 14's).
LARGE = tuple(parse_shape(s) for s in ("4096x4096x4096", "8192x8192x8192"))
SQUARE_TARGET, GEOMEAN_TARGET, FLOOR_TARGET, SKINNY_TARGET = 3.0, 2.5, 1.5, 2.0
DEFAULT_CANDIDATES = 3
# Timing runs C = A·B (alpha 1, beta 0) for cuBLAS and ours alike, so C is written, never read.
TIMED_BETA = 0.0
METHOD = ("tuner.gpu.GpuBench in one process: CUDA events around each launch, warm-up launches "
          f"first, median of >={gpu_bench.MIN_REPS} launches "
          f"(about {gpu_bench.TIMING_TARGET_S * 1e3:g} ms), input sets rotated over "
          f">={gpu_bench.L2_FLUSH_FACTOR}x L2; each candidate verified against a float64 cuBLAS "
          "DGEMM reference first; cuBLAS = cublasGemmEx FP32 with CUBLAS_COMPUTE_32F (no TF32), "
          "and each candidate measured in two interleaved passes (cuBLAS, candidates, cuBLAS, "
          "candidates), each side's faster median used; both timed with alpha=1, beta=0.")


# ---------------------------------------------------------------- arguments


def _shape(text: str) -> Problem:
    try:
        return parse_shape(text)
    except ShapeError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a positive one")
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{text} is not positive; give a positive number")
        return value
    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/speed.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0, metavar="INDEX", help="CUDA device (default 0)")
    parser.add_argument("--db", metavar="URL", default=None,
                        help="results database (default: $GEMMTUNE_DB, else the default file)")
    parser.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                        help="--tune: tune every problem first; --no-tune: never tune "
                             "(default: tune the problems some family asked for has no stored result for)")
    parser.add_argument("--trials", type=_positive(int), default=None, metavar="N",
                        help="passed to the tuner (default: the tuner's)")
    parser.add_argument("--timeout", type=_positive(float), default=None, metavar="S",
                        help="seconds per study, passed to the tuner (default: the tuner's)")
    parser.add_argument("--shape", type=_shape, action="append", default=[], metavar="MxNxK",
                        help="problem, repeatable (default: the ten of the suite)")
    parser.add_argument("--family", action="append", default=[], metavar="F",
                        help=f"kernel family, repeatable (default: all: {', '.join(kernels.FAMILIES)})")
    parser.add_argument("--candidates", type=_positive(int), default=DEFAULT_CANDIDATES, metavar="N",
                        help="stored configs re-measured per problem, different families first "
                             "(default: %(default)s)")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="JSON results (default: bench/results/speed-<gpu>.json)")
    args = parser.parse_args(argv)
    unknown = [f for f in args.family if f not in kernels.FAMILIES]
    if unknown:
        parser.error(f"argument --family: unknown kernel family {unknown[0]!r}; "
                     f"allowed: {', '.join(kernels.FAMILIES)}")
    if args.gpu < 0:
        parser.error(f"argument --gpu: {args.gpu} is negative; give a device index, 0 or more")
    args.problems = list(dict.fromkeys(args.shape)) or list(SUITE)
    args.families = list(dict.fromkeys(args.family)) or list(kernels.FAMILIES)
    return args


# ---------------------------------------------------------------- memory traffic


def min_dram_bytes(m: int, n: int, k: int, beta: float = TIMED_BETA) -> int:
    """The least DRAM traffic of one GEMM: read A and B once, read C if beta != 0, write C."""
    return 4 * (m * k + k * n + m * n * (2 if beta != 0.0 else 1))


def peak_dram_bytes_per_s(memory_clock_khz: int, bus_width_bits: int) -> float:
    """Double data rate: two transfers per memory clock over the whole bus."""
    return memory_clock_khz * 1e3 * bus_width_bits / 8 * 2


def dram_peak(device: int) -> dict[str, Any]:
    """The device's peak DRAM bandwidth from its attributes, or why it is unknown."""
    try:
        from cuda.bindings import driver

        def value(result: tuple) -> Any:
            if result[0] != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(getattr(result[0], "name", str(result[0])))
            return result[1]

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuInit: {getattr(err, 'name', err)}")
        dev = value(driver.cuDeviceGet(device))
        attr = driver.CUdevice_attribute
        clock = int(value(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev)))
        bus = int(value(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev)))
    except Exception as error:  # no driver here (the CPU stand-in), or an old binding
        return {"peak_bytes_per_s": None, "error": f"unknown: {error}"}
    if clock <= 0 or bus <= 0:
        return {"peak_bytes_per_s": None, "memory_clock_khz": clock, "bus_width_bits": bus,
                "error": "the device reports no memory clock or bus width"}
    return {"peak_bytes_per_s": peak_dram_bytes_per_s(clock, bus), "memory_clock_khz": clock,
            "bus_width_bits": bus}


# ---------------------------------------------------------------- candidates from the database


@dataclass
class Candidate:
    family: str
    config: dict[str, int]
    stored_gflops: float
    run_id: int
    trial_id: int


def untuned_families(database: db.Database, gpu: str, p: Problem, families: Sequence[str]
                     ) -> list[str]:
    """The families with no stored result of their current source for exactly this problem:
    the suite tunes a problem while any family asked for lacks one (a problem tuned once with
    other families would otherwise never meet the ones named now)."""
    try:
        return [name for name in families
                if not any(r.source_hash == kernels.FAMILIES[name].source_hash
                           for r in database.top_k(gpu, p.m, p.n, p.k, family=name, limit=20))]
    except db.UnknownGpuError:
        return list(families)


def stored_candidates(database: db.Database, gpu: str, p: Problem, families: Sequence[str],
                      count: int) -> list[Candidate]:
    """The `count` fastest stored configs for exactly this problem: each family's best first,
    then runners-up. Only results of the family's current source count."""
    per_family: list[list[Candidate]] = []
    for name in families:
        try:
            found = database.top_k(gpu, p.m, p.n, p.k, family=name, limit=20)
        except db.UnknownGpuError:
            return []
        seen: set[tuple] = set()
        ranked = []
        for r in found:
            key = tuple(sorted(r.params.items()))
            if r.source_hash == kernels.FAMILIES[name].source_hash and key not in seen:
                seen.add(key)
                ranked.append(Candidate(name, dict(r.params), r.gflops, r.run_id, r.trial_id))
        if ranked:
            per_family.append(ranked)
    by_speed = lambda c: -c.stored_gflops  # noqa: E731
    chosen = sorted((ranked[0] for ranked in per_family), key=by_speed)[:count]
    runners_up = sorted((c for ranked in per_family for c in ranked[1:]), key=by_speed)
    chosen += runners_up[:count - len(chosen)]
    return sorted(chosen, key=by_speed)


def run_tuner(args: argparse.Namespace, url: str, problems: Sequence[Problem]) -> int:
    """`python -m tuner` for these problems, its output going straight to the terminal."""
    command = [sys.executable, "-m", "tuner", "--gpu", str(args.gpu), "--db", url]
    for p in problems:
        command += ["--shape", p.shape]
    for name in args.family:
        command += ["--kernel", name]
    if args.trials is not None:
        command += ["--trials", str(args.trials)]
    if args.timeout is not None:
        command += ["--timeout", f"{args.timeout:g}"]
    print(f"tuning {len(problems)} problem(s): {shlex.join(['python', *command[1:]])}", flush=True)
    process = subprocess.Popen(command, cwd=ROOT)
    # Ctrl-C reaches the tuner too, which finishes its trial and marks its runs interrupted
    # (exit 130); this process must only wait for that, not kill it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return process.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- measuring


def compile_all(candidates: Sequence[Candidate], arch: str) -> list[bytes | Exception]:
    """CUBINs (through the shared cache) in parallel CPU processes; a failure is kept as such."""
    jobs = list(dict.fromkeys((c.family, tuple(sorted(c.config.items()))) for c in candidates))
    workers = max(1, min(8, (os.cpu_count() or 2) - 1, len(jobs)))
    done: dict[tuple, bytes | Exception] = {}
    if jobs:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures: dict[tuple, Future] = {
                job: pool.submit(kernels.compile_config, kernels.FAMILIES[job[0]], dict(job[1]), arch)
                for job in jobs}
            for job, future in futures.items():
                try:
                    done[job] = future.result().cubin
                except Exception as error:  # reported with the candidate
                    done[job] = error
    return [done[(c.family, tuple(sorted(c.config.items())))] for c in candidates]


def _error_state(error: Exception) -> str:
    # A config the family's current constraints refuse is "rejected"; any other failure to
    # produce a CUBIN (NVRTC's log, a missing library, a dead worker) is a compile error.
    return "rejected" if isinstance(error, kernels.ConfigError) else "compile_error"


def empty_row(p: Problem, note: str | None) -> dict[str, Any]:
    """A result row before anything is measured: every field present, figures None."""
    return {"m": p.m, "n": p.n, "k": p.k, "cublas_gflops": None, "cublas_time_median_ms": None,
            "cublas_sm_clock_mhz": None, "cublas_runs": [], "gflops": None, "ratio": None,
            "family": None, "config": None, "time_median_ms": None, "sm_clock_mhz": None,
            "min_dram_bytes": min_dram_bytes(p.m, p.n, p.k), "gbps": None, "dram_fraction": None,
            "cublas_gbps": None, "candidates": [], "note": note}


# Interleaved measurement passes per problem (cuBLAS, candidates, cuBLAS, candidates, ...).
PASSES = 2


def measure_problem(bench: Any, p: Problem, candidates: Sequence[Candidate],
                    compiled: Sequence[bytes | Exception], peak: float | None) -> dict[str, Any]:
    """Two interleaved passes on the same inputs, re-measured now: cuBLAS, every candidate,
    cuBLAS, every candidate again. Each side counts its faster pass, so both get the same
    treatment (clock and thermal drift within the run affect both alike)."""
    bench.set_problem(p.m, p.n, p.k)
    measured = [{"family": c.family, "config": c.config, "stored_gflops": c.stored_gflops,
                 "stored_run_id": c.run_id, "stored_trial_id": c.trial_id} for c in candidates]
    cublas_runs = []
    for _ in range(PASSES):
        cublas_runs.append(bench.baseline())
        for c, cubin, entry in zip(candidates, compiled, measured):
            if isinstance(cubin, Exception):
                entry.update(state=_error_state(cubin), error=str(cubin)[:2000])
                continue
            if entry.get("state", "ok") != "ok":
                continue  # failed in an earlier pass: reported as such
            family = kernels.FAMILIES[c.family]
            result = bench.evaluate(cubin, family.launches(c.config, p.m, p.n, p.k),
                                    family.workspace_bytes(c.config, p.m, p.n, p.k),
                                    family.flops(p.m, p.n, p.k))
            if result.get("rel_error") is not None and not math.isfinite(result["rel_error"]):
                result["rel_error"] = None  # NaN/Inf output: strict JSON has no inf; the error says it
            entry.setdefault("passes", []).append(result)
            if result.get("state") != "ok" or result["gflops"] > entry.get("gflops", 0.0):
                entry.update(result)
    cublas = max(cublas_runs, key=lambda b: b["gflops"])
    ok = [e for e in measured if e.get("state") == "ok"]
    for e in ok:
        e["ratio"] = e["gflops"] / cublas["gflops"]
    best = max(ok, key=lambda e: e["gflops"]) if ok else None
    traffic = min_dram_bytes(p.m, p.n, p.k)
    row = empty_row(p, None if best else "not tuned: no stored config" if not candidates
                    else f"all {len(candidates)} candidates failed now")
    row.update(cublas_gflops=cublas["gflops"], cublas_time_median_ms=cublas["time_median_ms"],
               cublas_sm_clock_mhz=cublas["sm_clock_mhz"], cublas_runs=cublas_runs,
               cublas_gbps=traffic / (cublas["time_median_ms"] * 1e-3) / 1e9, candidates=measured)
    if best:
        gbps = traffic / (best["time_median_ms"] * 1e-3) / 1e9
        row.update(gflops=best["gflops"], ratio=best["gflops"] / cublas["gflops"],
                   family=best["family"], config=best["config"],
                   time_median_ms=best["time_median_ms"], sm_clock_mhz=best["sm_clock_mhz"],
                   gbps=gbps, dram_fraction=gbps * 1e9 / peak if peak else None)
    return row


def measure_all(bench: Any, fault: type[Exception], problems: Sequence[Problem],
                found: dict[Problem, list[Candidate]], compiled: Any, peak: float | None
                ) -> tuple[list[dict[str, Any]], str | None]:
    """Every problem in turn; an error in one becomes its row's note. Stops early on Ctrl-C or
    a sticky GPU fault (the context is dead), returning what was measured and why it stopped."""
    rows: list[dict[str, Any]] = []
    for p in problems:
        cubins = [next(compiled) for _ in found[p]]
        try:
            row = measure_problem(bench, p, found[p], cubins, peak)
        except KeyboardInterrupt:
            return rows, "interrupted"
        except fault as error:
            print(f"bench/speed.py: GPU fault at {p.shape}: {error}; stopping", file=sys.stderr)
            return rows, f"GPU fault at {p.shape}: {error}"
        except Exception as error:  # e.g. out of memory for this problem's buffers
            print(f"bench/speed.py: {p.shape} failed: {error}", file=sys.stderr)
            row = empty_row(p, f"error: {str(error).strip()[:300]}")
        rows.append(row)
        ours = (f"{row['family']} {row['gflops'] / 1e3:.2f} TFLOP/s ({row['ratio']:.3f}x)"
                if row["ratio"] is not None else row["note"])
        cublas = "-" if row["cublas_gflops"] is None else f"{row['cublas_gflops'] / 1e3:.2f}"
        print(f"  {p.shape}: cuBLAS {cublas} TFLOP/s, ours {ours}", flush=True)
    return rows, None


# ---------------------------------------------------------------- summary


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _row(rows: Sequence[dict], p: Problem) -> dict | None:
    return next((r for r in rows if (r["m"], r["n"], r["k"]) == (p.m, p.n, p.k)), None)


def targets(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """The targets (the large squares at 3x, the suite, the skinny problem), each met / not met /
    not measured, with the figures."""
    def single(name: str, p: Problem, goal: float) -> dict[str, Any]:
        row = _row(rows, p)
        if row is None:
            return {"target": name, "status": "not measured", "detail": "not in this run"}
        if row["ratio"] is None:
            return {"target": name, "status": "not met", "detail": "no working kernel"}
        detail = f"{row['ratio']:.3f}x"
        if row["dram_fraction"] is not None:
            detail += f", {100 * row['dram_fraction']:.0f}% of DRAM peak"
        return {"target": name, "status": "met" if row["ratio"] >= goal else "not met",
                "detail": detail}

    suite_name = f"geomean >= {GEOMEAN_TARGET:.2f}x and none < {FLOOR_TARGET:.2f}x"
    measured = [r for r in rows if r["ratio"] is not None]
    missing = len(rows) - len(measured)
    mean = geomean([r["ratio"] for r in measured])
    lowest = min(measured, key=lambda r: r["ratio"], default=None)
    parts = [f"geomean {mean:.3f}x"] if mean else []
    if lowest:
        parts.append(f"lowest {lowest['ratio']:.3f}x at {lowest['m']}x{lowest['n']}x{lowest['k']}")
    if missing:
        parts.append(f"{missing} problem(s) without a working kernel")
    in_suite = sum(Problem(r["m"], r["n"], r["k"]) in SUITE for r in rows)
    parts.append(f"over {in_suite} of the {len(SUITE)} suite problems")
    met = bool(measured) and not missing and mean >= GEOMEAN_TARGET and lowest["ratio"] >= FLOOR_TARGET
    suite = {"target": suite_name, "status": "met" if met else "not met" if rows else "not measured",
             "detail": ", ".join(parts)}
    return [*(single(f"{p.shape} >= {SQUARE_TARGET:g}x cuBLAS", p, SQUARE_TARGET) for p in LARGE),
            suite, single(f"16x4096x4096 >= {SKINNY_TARGET:g}x cuBLAS", SKINNY, SKINNY_TARGET)]


def table(rows: Sequence[dict]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    def clock(r: dict) -> str:
        ours, theirs = r["sm_clock_mhz"], r["cublas_sm_clock_mhz"]
        return num(ours or theirs, "d") if ours in (None, theirs) else f"{ours} (cuBLAS {theirs})"

    return format_table(
        ["M", "N", "K", "cuBLAS TFLOP/s", "ours TFLOP/s", "ratio", "family", "config", "SM MHz",
         "GB/s", "% DRAM peak"],
        [[r["m"], r["n"], r["k"], num(r["cublas_gflops"] and r["cublas_gflops"] / 1e3, ".2f"),
          num(r["gflops"] and r["gflops"] / 1e3, ".2f"), num(r["ratio"], ".3f"), r["family"] or "-",
          config_text(r["config"]) if r["config"] else f"({r['note']})", clock(r),
          num(r["gbps"], ",.0f"), num(r["dram_fraction"] and 100 * r["dram_fraction"], ".1f")]
         for r in rows])


def report_text(rows: Sequence[dict], checks: Sequence[dict]) -> str:
    lines = [table(rows), ""]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    mean = geomean(ratios)
    lines.append(f"geomean of the ratios: {mean:.3f}x over {len(ratios)} of {len(rows)} problem(s)"
                 if mean else "geomean of the ratios: - (no problem measured)")
    lines += [f"target {c['target']}: {c['status'].upper()} ({c['detail']})" for c in checks]
    for r in rows:
        for c in r["candidates"]:
            if c.get("state") != "ok":
                first = (c.get("error") or "").strip().splitlines()[:1] or ["-"]
                lines.append(f"  FAILED NOW {r['m']}x{r['n']}x{r['k']} {c['family']} "
                             f"{config_text(c['config'])}: {c.get('state')}: {first[0]}")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """JSON for the odd NumPy scalar a measurement may carry."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


# ---------------------------------------------------------------- the command


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "bench/speed.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        url = db.resolve_url(args.db)
        db.open_database(url).close()  # a bad URL or file is refused here, before any tuning
    except (db.StorageError, db.InvalidInputError) as error:
        print(f"bench/speed.py: cannot use the results database: {error}", file=sys.stderr)
        return EXIT_USAGE
    backend_name = os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
    backend = backend_module(backend_name)
    reason = backend.probe()
    if reason is not None:
        print(f"bench/speed.py: no usable GPU {args.gpu}: {reason}", file=sys.stderr)
        return EXIT_FAILED
    try:
        bench = backend.GpuBench(args.gpu)
        info, arch = bench.info(), bench.arch()
    except Exception as error:  # e.g. no such device, or cuBLAS missing for the baseline
        print(f"bench/speed.py: cannot start measuring on GPU {args.gpu}: {error}", file=sys.stderr)
        return EXIT_FAILED

    def read_candidates() -> dict[Problem, list[Candidate]]:
        with db.open_database(url) as database:
            return {p: stored_candidates(database, info["name"], p, args.families, args.candidates)
                    for p in args.problems}

    with db.open_database(url) as database:
        untuned = {p: untuned_families(database, info["name"], p, args.families)
                   for p in args.problems}
    to_tune = [p for p in args.problems if args.tune or (args.tune is None and untuned[p])]
    tuner_exit = None
    if to_tune:
        tuner_exit = run_tuner(args, url, to_tune)
        if tuner_exit in (EXIT_USAGE, EXIT_INTERRUPTED):
            print(f"bench/speed.py: the tuner exited with {tuner_exit}; nothing measured", file=sys.stderr)
            return tuner_exit
        if tuner_exit != EXIT_OK:
            print(f"bench/speed.py: the tuner exited with {tuner_exit}; measuring what is stored",
                  file=sys.stderr)
    found = read_candidates()

    peak = dram_peak(args.gpu)
    flat = [c for p in args.problems for c in found[p]]
    started = time.time()
    compiled = iter(compile_all(flat, arch))
    print(f"{info['name']}: {len(flat)} candidate(s) compiled in {time.time() - started:.1f} s; "
          f"measuring {len(args.problems)} problem(s)", flush=True)
    rows, stopped = measure_all(bench, getattr(backend, "GpuFault", RuntimeError), args.problems,
                                found, compiled, peak["peak_bytes_per_s"])
    checks = targets(rows)
    print()
    print(report_text(rows, checks))
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"speed-{gpu_slug(info['name'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    out.write_text(json.dumps({
        "device": {key: info.get(key) for key in ("name", "uuid", "driver_version", "sm_count",
                                                    "compute_capability", "memory_bytes",
                                                    "max_sm_clock_mhz", "cuda_version", "nvrtc_version")}
                  | {"arch": arch, "dram": peak, "backend": backend_name},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command, "method": METHOD, "database": _safe_url(url),
        "families": args.families, "tuned": [p.shape for p in to_tune], "tuner_exit": tuner_exit,
        "complete": stopped is None and len(rows) == len(args.problems), "stopped": stopped,
        "rows": rows, "geomean_ratio": geomean(ratios), "targets": checks,
    }, indent=1, default=_plain))
    print(f"\nwrote {out}")
    if stopped == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_OK if stopped is None and all(r["ratio"] is not None for r in rows) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
