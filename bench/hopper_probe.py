"""Development probe for the `wgmma` family on a Hopper GPU: correctness on awkward shapes and
misaligned operands, then a sweep of configs against cuBLAS FP32 at large shapes, in one call.

    python bench/hopper_probe.py [--shape MxNxK ...] [--sweep all|start] [--splitk] [--out FILE]

Prints a correctness table and a speed table (GFLOP/s, ratio to cuBLAS FP32 in the same
process, SM clock) and writes JSON. Timing is tuner.gpu.GpuBench's (events, warm-up, median,
inputs rotated over 3x L2), as the tuner measures.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from kernels.reference import relative_error, tolerance  # noqa: E402

ODD = [(1, 1, 1), (7, 13, 5), (1, 97, 1), (33, 65, 1), (127, 131, 257), (2048, 3, 100), (3, 1000, 515),
       (1023, 1025, 999), (256, 256, 256), (67, 61, 8191)]
FAMILY = kernels.get_family("wgmma")


def _compile(config):
    ck = kernels.compile_config(FAMILY, config, "sm_90")
    return ck.cubin, ck.main


def misaligned_check(configs, rng) -> list[str]:
    """Operands at 4-byte (not 16-byte) aligned addresses, leading dimensions not multiples of 4."""
    import cupy as cp

    failures = []
    for m, n, k in [(129, 67, 33), (64, 128, 96), (200, 301, 77)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 1.5 * c0
        for config in configs:
            big_a, big_b, big_c = (cp.zeros((x.shape[0], x.shape[1] + 3), cp.float32) for x in (a, b, c0))
            da, db_, dc = big_a[:, 1:k + 1], big_b[:, 1:n + 1], big_c[:, 1:n + 1]
            da[...] = cp.asarray(a)
            db_[...] = cp.asarray(b)
            dc[...] = cp.asarray(c0)
            kernels.gemm(FAMILY, config, da, db_, dc, m, n, k, alpha=0.5, beta=-1.5)
            cp.cuda.runtime.deviceSynchronize()
            err = relative_error(cp.asnumpy(dc), ref)
            if not err <= tolerance(k):
                failures.append(f"misaligned {m}x{n}x{k} {config}: rel err {err:.3g}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--sweep", default="start", help="'start' (starting points) or 'all' (SPLITK=1, RASTER=8 grid)")
    parser.add_argument("--splitk", action="store_true", help="sweep SPLITK values too")
    parser.add_argument("--max", type=int, default=400)
    parser.add_argument("--rasters", default="1,8", help="RASTER values swept (default 1,8)")
    parser.add_argument("--grid", action="append", default=[], metavar="PARAM=v1,v2",
                        help="keep only these values of a parameter in the sweep")
    parser.add_argument("--no-checks", action="store_true", help="skip the correctness checks")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from tuner.measure.gpu import GpuBench

    rng = random.Random(0)
    rasters = {int(x) for x in args.rasters.split(",")}
    accepted = FAMILY.accepted_configs("sm_90")
    if args.sweep == "all":
        configs = [c for c in accepted if (args.splitk or c["SPLITK"] == 1) and c["RASTER"] in rasters]
    else:
        configs = [dict(c) for c in FAMILY.starting_points]
    for item in args.grid:
        param, values = item.split("=")
        keep = {int(v) for v in values.split(",")}
        configs = [c for c in configs if c[param] in keep]
    configs = configs[:args.max]
    points = [dict(c) for c in FAMILY.starting_points]
    check_configs = points + [dict(c, ASPLIT=1 - c["ASPLIT"]) for c in points] + rng.sample(accepted, 4)
    everything = {json.dumps(c, sort_keys=True): c for c in configs + check_configs}
    start = time.time()
    with ProcessPoolExecutor(16, mp_context=multiprocessing.get_context("spawn")) as pool:
        built = dict(zip(everything, pool.map(_compile, everything.values())))
    print(f"compiled {len(built)} configs in {time.time() - start:.1f} s", flush=True)

    report = {"correctness": [], "speed": [], "misaligned": []}
    bench = GpuBench(0)
    failures = []
    for m, n, k in ([] if args.no_checks else ODD):
        bench.set_problem(m, n, k, seed=rng.randrange(1 << 30))
        for config in check_configs:
            cubin, _ = built[json.dumps(config, sort_keys=True)]
            r = bench.evaluate(cubin, FAMILY.launches(config, m, n, k), FAMILY.workspace_bytes(config, m, n, k),
                               FAMILY.flops(m, n, k))
            report["correctness"].append({"shape": [m, n, k], "config": config, "state": r["state"],
                                          "rel_error": r["rel_error"], "error": r["error"]})
            if r["state"] != "ok":
                failures.append(f"{m}x{n}x{k} {config}: {r['state']} {r['error']}")
    print(f"odd shapes: {len(report['correctness']) - len(failures)} ok, {len(failures)} failed", flush=True)
    for line in failures[:20]:
        print("  FAIL", line)
    try:
        if args.no_checks:
            raise ImportError
        mis = misaligned_check(check_configs[:3] + check_configs[len(points):len(points) + 3],
                               np.random.default_rng(1))
        print(f"misaligned operands: {'all ok' if not mis else str(len(mis)) + ' failed'}", flush=True)
        for line in mis[:10]:
            print("  FAIL", line)
        report["misaligned"] = mis
    except ImportError:
        print("misaligned operands: skipped (no cupy)")

    shapes = args.shape or ["4096x4096x4096"]
    for text in shapes:
        m, n, k = map(int, text.lower().split("x"))
        bench.set_problem(m, n, k, seed=1)
        base = bench.baseline()
        rows = []
        for config in configs:
            cubin, main = built[json.dumps(config, sort_keys=True)]
            r = bench.evaluate(cubin, FAMILY.launches(config, m, n, k), FAMILY.workspace_bytes(config, m, n, k),
                               FAMILY.flops(m, n, k))
            row = {"shape": [m, n, k], "config": config, "state": r["state"], "gflops": r.get("gflops"),
                   "ratio": (r["gflops"] / base["gflops"]) if r.get("gflops") else None,
                   "rel_error": r["rel_error"], "sm_clock_mhz": r.get("sm_clock_mhz"), "registers": main.registers}
            rows.append(row)
        base2 = bench.baseline()
        rows.sort(key=lambda r: -(r["gflops"] or 0))
        print(f"\n{text}: cuBLAS FP32 {base['gflops']:.0f} / {base2['gflops']:.0f} GFLOP/s "
              f"(clock {base['sm_clock_mhz']} MHz); {sum(r['state'] == 'ok' for r in rows)}/{len(rows)} ok")
        for r in rows[:12]:
            c = r["config"]
            print(f"  {r['gflops'] or 0:8.0f} {r['ratio'] or 0:5.2f}x  err {r['rel_error'] or 0:.2e}  "
                  f"clk {r['sm_clock_mhz']}  BM{c['BM']} BK{c['BK']} WGS{c['WGS']} MW{c['MW']} "
                  f"ST{c['STAGES']} FL{c['FLUSH']} SK{c['SPLITK']} R{c['RASTER']} AS{c['ASPLIT']}  {r['state']}")
        report["speed"].append({"shape": [m, n, k], "cublas": [base, base2], "rows": rows})

    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        cubin, _ = built[json.dumps(dict(FAMILY.starting_points[0]), sort_keys=True)]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([cuobjdump, "--dump-sass", f.name], capture_output=True, text=True).stdout
        ops = {op: sass.count(op) for op in ("HGMMA", "HMMA", "UTMALDG", "LDL", "STL", "USETMAXREG")}
        print("SASS of the first starting point:", ops)
        report["sass"] = ops
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
