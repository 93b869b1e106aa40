"""The optimization ladder on one GPU: a sample of configs per family against cuBLAS, same run.

    python bench/ladder.py --shape 4096x4096x4096 --per-family 8 --out bench/results/ladder.json

Prints one row per family (its best sampled config) and writes every measurement as JSON.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import FAMILIES, compile_config, get_family, occupancy  # noqa: E402
from tuner.measure.gpu import GpuBench  # noqa: E402


def _compile(job):
    name, config, arch = job
    try:
        return compile_config(get_family(name), config, arch)
    except Exception as e:  # reported in the table, not fatal
        return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", default=[], help="MxNxK (repeatable)")
    ap.add_argument("--per-family", type=int, default=8)
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--config", action="append", default=[], help="family:JSON config to add")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=1, help="rows printed per family (its fastest configs)")
    ap.add_argument("--out", default="bench/results/ladder.json")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in (args.shape or ["4096x4096x4096"])]
    bench = GpuBench(0)
    info, arch = bench.info(), bench.arch()
    rng = random.Random(args.seed)
    jobs = []
    for name in args.family or list(FAMILIES):
        for config in get_family(name).sample_accepted(args.per_family, seed=rng.randrange(1 << 30), arch=arch):
            jobs.append((name, config, arch))
    for spec in args.config:
        name, text = spec.split(":", 1)
        jobs.append((name, json.loads(text), arch))
    t0 = time.time()
    with ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as pool:
        compiled = list(pool.map(_compile, jobs))
    print(f"{info['name']}: compiled {len(jobs)} configs in {time.time() - t0:.1f}s", flush=True)
    rows = []
    for m, n, k in shapes:
        bench.set_problem(m, n, k)
        base = bench.baseline()
        print(f"\n{m}x{n}x{k}: cuBLAS {base['gflops'] / 1e3:.2f} TFLOP/s ({base['time_median_ms']:.3f} ms, "
              f"SM {base['sm_clock_mhz']} MHz)", flush=True)
        for (name, config, _), ck in zip(jobs, compiled):
            fam = get_family(name)
            row = {"m": m, "n": n, "k": k, "family": name, "config": config, "cublas_gflops": base["gflops"]}
            if isinstance(ck, Exception):
                row.update(state="compile_error", error=str(ck)[:500])
            else:
                launch = fam.main_launch(config, m, n, k)
                occ = occupancy(arch, launch.block[0], ck.main.registers, ck.main.shared_static_bytes + launch.shared_bytes)
                row.update(registers=ck.main.registers, spills=ck.main.spill_store_bytes, occupancy=occ.fraction)
                row.update(bench.evaluate(ck.cubin, fam.launches(config, m, n, k), fam.workspace_bytes(config, m, n, k),
                                          fam.flops(m, n, k)))
            rows.append(row)
        ranked: dict[str, list[dict]] = {}
        for r in sorted(rows, key=lambda r: -r.get("gflops", 0.0)):
            if (r["m"], r["n"], r["k"]) == (m, n, k) and r.get("state") == "ok":
                ranked.setdefault(r["family"], []).append(r)
        print(f"{'family':12s} {'TFLOP/s':>8s} {'x cuBLAS':>8s} {'regs':>5s} {'spill':>5s} {'occ':>5s}  config")
        for name in FAMILIES:
            for r in ranked.get(name, [])[:args.top]:
                print(f"{name:12s} {r['gflops'] / 1e3:8.2f} {r['gflops'] / base['gflops']:8.3f} {r['registers']:5d} "
                      f"{r['spills']:5d} {r['occupancy']:5.2f}  {json.dumps(r['config'])}")
        bad = [r for r in rows if (r["m"], r["n"], r["k"]) == (m, n, k) and r.get("state") != "ok"]
        for r in bad:
            print(f"  NOT OK {r['family']} {r['config']}: {r.get('state')} {r.get('error')}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": info, "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
