"""Each launch of one config's launch sequence timed on its own (GPU host): where a family with
passes before or after its GEMM (f16x3's scale and pack, split-K's reduction) spends its time.

    python bench/launches.py --family f16x3 [--config JSON] [--shape MxNxK[:LAYOUT] ...]
                             [--beta 0] [--repeats 30] [--gpu 0] [--out FILE]

Per shape: random normal operands (CuPy), the whole sequence run once (so that every launch finds
what the ones before it wrote) and checked against float64 (a result past the tolerance is
marked WRONG and the exit status is 1), then each launch alone and the whole
sequence, every timing after an L2 flush, with CUDA events: the median of --repeats, and the SM
clock (NVML) read after each. Where launches overlap the one before them (Launch.follows), the
sequence is also timed with each launch waiting for the previous one to end ("serial"). With
--beta other than 0, C starts random and is read by the epilogue (C = A·B + beta·C). Bytes
per launch are not known generically, so the table gives µs and each launch's share of the
sequence. Writes JSON (default bench/results/launches-<gpu>-<family>.json).
To compare two trees, run each tree's copy of this script in turn (it imports the tree it sits in).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from kernels import runtime  # noqa: E402
from kernels.layout import stored_shapes  # noqa: E402
from kernels.reference import tolerance  # noqa: E402
from tuner.measure.gpu import SmClock  # noqa: E402
from tuner.problem import parse_shape  # noqa: E402

from bench.throughput import gpu_slug  # noqa: E402

SHAPES = ("4096x4096x4096", "2048x2048x2048", "8192x8192x8192")
FLUSH_BYTES = 256 << 20  # more than any Hopper L2


def time_shape(cp: Any, fam: kernels.Family, config: dict, shape: tuple[int, int, int], layout: str,
               repeats: int, clock: SmClock, beta: float = 0.0) -> dict[str, Any]:
    m, n, k = shape
    (ra, ca), (rb, cb) = stored_shapes(layout, m, n, k)
    rng = cp.random.default_rng(m + n + k)
    a = rng.standard_normal((ra, ca), dtype=cp.float32)
    b = rng.standard_normal((rb, cb), dtype=cp.float32)
    # poisoned where beta = 0, which must not read it
    c = cp.full((m, n), cp.nan, cp.float32) if beta == 0 else rng.standard_normal((m, n), dtype=cp.float32)
    c0 = c.astype(cp.float64) if beta != 0 else None  # the reference's beta*C, read before the run
    stream = cp.cuda.get_current_stream()
    made = runtime.plan(fam, config, m, n, k, layout=layout)
    ws = runtime.workspace(0, stream.ptr, made.workspace_bytes) if made.workspace_bytes else 0
    args = (a.data.ptr, ca, b.data.ptr, cb, c.data.ptr, n, 1.0, beta)
    made.run(*args, workspace=ws, stream=stream.ptr)
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    ref = (a64.T if layout[0] == "t" else a64) @ (b64.T if layout[1] == "t" else b64)
    if beta != 0:
        ref += beta * c0
    error = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    del a64, b64, ref, c0
    flush = cp.empty(FLUSH_BYTES, cp.uint8)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def timed(plan: runtime.Plan) -> dict[str, Any]:
        times, clocks = [], []
        for i in range(repeats + 3):  # three warm-ups
            flush.fill(i & 0xFF)
            start.record(stream)
            plan.run(*args, workspace=ws, stream=stream.ptr)
            end.record(stream)
            end.synchronize()
            if i >= 3:
                times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
                clocks.append(clock.mhz())
        known = [x for x in clocks if x]
        return {"us_median": statistics.median(times), "us_min": min(times),
                "sm_clock_mhz": int(statistics.median(known)) if known else None}

    rows = []
    in_place = runtime.maps_read_in_place(runtime.operand_views(made.launches),
                                          {"a": (a.data.ptr, ca, 0), "b": (b.data.ptr, cb, 0)})
    for launch in made.launches:
        row = {"kernel": launch.kernel, "grid": list(launch.grid), "block": list(launch.block),
               "follows": launch.follows}
        if launch.only_for_fallbacks and in_place:  # not launched for these operands
            rows.append({**row, "skipped": True, "us_median": 0.0, "us_min": 0.0, "sm_clock_mhz": None})
            continue
        alone = runtime.Plan(made.kernel, [launch], made.workspace_bytes, made.dims)
        rows.append({**row, **timed(alone)})
    whole = timed(made)
    # the same sequence with each launch waiting for the one before it to end: what overlapping
    # them (Launch.follows) buys, in the same process
    serial = runtime.Plan(made.kernel, [dataclasses.replace(launch, follows=False) for launch in made.launches],
                          made.workspace_bytes, made.dims)
    flops = fam.flops(m, n, k)
    return {"shape": [m, n, k], "layout": layout, "beta": beta, "relative_error": error, "correct": error <= tolerance(k),
            "launches": rows, "whole": whole, "whole_serial": timed(serial),
            "tflops": flops / (whole["us_median"] * 1e-6) / 1e12}


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'shape':>16} {'launch':>12} {'grid':>16} {'µs':>9} {'share':>6} {'SM MHz':>7}"]
    for r in results:
        name = "x".join(map(str, r["shape"])) + ("" if r["layout"] == "nn" else f":{r['layout']}")
        total = r["whole"]["us_median"]
        for row in r["launches"]:
            if row.get("skipped"):
                lines.append(f"{name:>16} {row['kernel']:>12} {'x'.join(map(str, row['grid'])):>16} "
                             f"{'skipped':>9}  (A and B read in place: nothing to copy)")
                continue
            lines.append(f"{name:>16} {row['kernel']:>12} {'x'.join(map(str, row['grid'])):>16} "
                         f"{row['us_median']:9.1f} {row['us_median'] / total:6.1%} {row['sm_clock_mhz'] or '?':>7}")
        lines.append(f"{name:>16} {'(sequence)':>12} {'':>16} {total:9.1f} {'':>6} {r['whole']['sm_clock_mhz'] or '?':>7}"
                     f"  {r['tflops']:.1f} TFLOP/s, error {r['relative_error']:.2e}"
                     + ("" if r["correct"] else " WRONG: above the float64 check's tolerance"))
        if any(row.get("follows") for row in r["launches"]):
            serial = r["whole_serial"]
            lines.append(f"{name:>16} {'(serial)':>12} {'':>16} {serial['us_median']:9.1f} {'':>6} "
                         f"{serial['sm_clock_mhz'] or '?':>7}  each launch starting after the one before it ends")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--config", help="JSON object (default: the family's first starting point)")
    ap.add_argument("--shape", action="append",
                    help=f"MxNxK, optionally :LAYOUT (nn, nt, tn, tt) (default: {', '.join(SHAPES)})")
    ap.add_argument("--beta", type=float, default=0.0, help="C = A·B + beta·C (default 0: C is not read)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    # everything that can be wrong with the arguments is said before a GPU is touched
    try:
        fam = kernels.get_family(args.family)
        shapes = [parse_shape(s) for s in (args.shape or SHAPES)]
    except ValueError as e:  # an unknown family, a bad shape
        ap.error(str(e))
    try:
        config = json.loads(args.config) if args.config else dict(fam.starting_points[0])
    except ValueError as e:
        config = e
    if not isinstance(config, dict):
        ap.error(f"--config is not a JSON object ({config}); e.g. '{json.dumps(dict(fam.starting_points[0]))}'")
    if any(p.batch != 1 for p in shapes):
        ap.error("--shape: one problem at a time here (MxNxK[:LAYOUT]), not a batch")
    try:
        import cupy as cp
    except ImportError:
        ap.error("needs CuPy and an NVIDIA GPU (the GPU host has both)")
    cp.cuda.Device(args.gpu).use()
    problems = fam.reject_reasons(config, runtime.device_arch(args.gpu))
    if problems:
        ap.error(f"--config is not an accepted {fam.name} config here: {'; '.join(problems)}")
    clock = SmClock(args.gpu)
    gpu = cp.cuda.runtime.getDeviceProperties(args.gpu)["name"].decode()
    results = [time_shape(cp, fam, config, (p.m, p.n, p.k), p.layout, args.repeats, clock, args.beta) for p in shapes]
    print(f"{fam.name} {json.dumps(config)} on {gpu}, source {fam.source_hash[:12]}")
    print("\n".join(table(results)))
    out = args.out or ROOT / "bench" / "results" / f"launches-{gpu_slug(gpu)}-{fam.name}.json"
    out.write_text(json.dumps({"gpu": gpu, "date": datetime.now(timezone.utc).isoformat(), "family": fam.name,
                               "config": config, "source_hash": fam.source_hash, "repeats": args.repeats,
                               "command": "python bench/launches.py " + " ".join(argv or sys.argv[1:]),
                               "results": results}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
