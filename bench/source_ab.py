"""Two versions of the kernel sources, the same configs, one GPU, one run (GPU host).

    python bench/source_ab.py --before DIR [--pack FILE] [--family F ...] [--passes 2] [--gpu 0] [--out FILE]

DIR is a checkout of the older tree (e.g. `git archive <rev> | tar -x -C DIR`). Every distinct
(family, config, shape) of the pack (default: the committed examples/pack-h100-h200.json, the
tuned bests of two GPU models; or a speed-suite result, bench/speed.py's JSON, whose rows are
its winners), of the --family families where given, is compiled and measured by each tree's own `kernels` and
`tuner.measure.gpu` (verified against float64, then timed: warm-up, CUDA events, median, rotated
inputs, SM clock), in child processes run in the order before, after, before, after, …; each
side keeps its fastest pass. Prints after/before per config and their geometric mean, and where
the pack holds several configs of a family at a shape, the best of each side (a config one tree
rejects is marked so and measured by the other alone: a change that narrows a space compares
each tree's best); writes JSON. Made for issue 19's launch-time RASTER/SPLITK: a changed source
must run as fast.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "examples" / "pack-h100-h200.json"


def items(pack_path: Path, families: list[str] | None = None) -> list[dict[str, Any]]:
    """The distinct (family, config, shape) of a pack's entries or a speed suite's rows (of
    `families` only, where given), in shape order (one problem set-up each)."""
    data = json.loads(pack_path.read_text())
    listed = data.get("entries", data.get("rows"))
    if not isinstance(listed, list):
        raise ValueError(f"{pack_path}: neither a pack (entries) nor a speed-suite result (rows)")
    seen: dict[str, dict[str, Any]] = {}
    for e in listed:
        if families and e["family"] not in families:
            continue
        item = {"family": e["family"], "config": e["config"], "shape": [e["m"], e["n"], e["k"]]}
        seen.setdefault(json.dumps(item, sort_keys=True), item)
    return sorted(seen.values(), key=lambda i: (i["shape"], i["family"], sorted(i["config"].items())))


def measure(tree: Path, todo: list[dict[str, Any]], gpu: int) -> list[dict[str, Any]]:
    """In a child process whose imports come from ``tree``: each item measured once."""
    sys.path.insert(0, str(tree))
    import kernels
    from tuner.measure.gpu import GpuBench

    bench = GpuBench(gpu)
    arch, out, shape = bench.arch(), [], None
    for item in todo:
        if item["shape"] != shape:
            shape = item["shape"]
            bench.set_problem(*shape, seed=1)
            cublas = bench.baseline()
        m, n, k = shape
        fam = kernels.get_family(item["family"])
        rejected = fam.reject_reasons(item["config"], arch)
        if rejected:
            out.append({**item, "state": "rejected", "gflops": None, "sm_clock_mhz": None, "error": rejected[0],
                        "cublas_gflops": cublas["gflops"], "source_hash": fam.source_hash})
            continue
        cubin = kernels.compile_config(fam, item["config"], arch).cubin  # the user's cache: keys differ per source
        r = bench.evaluate(cubin, fam.launches(item["config"], m, n, k), fam.workspace_bytes(item["config"], m, n, k),
                           fam.flops(m, n, k))
        out.append({**item, "state": r["state"], "gflops": r.get("gflops"), "sm_clock_mhz": r.get("sm_clock_mhz"),
                    "cublas_gflops": cublas["gflops"], "source_hash": fam.source_hash})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, metavar="DIR", help="checkout of the older tree")
    ap.add_argument("--pack", type=Path, default=PACK, metavar="FILE", help=f"configs and shapes (default {PACK.name})")
    ap.add_argument("--family", action="append", default=[], metavar="F",
                    help="only these families' entries (repeat; default: all)")
    ap.add_argument("--passes", type=int, default=2, metavar="N", help="passes per tree, interleaved (default 2)")
    ap.add_argument("--gpu", type=int, default=0, metavar="INDEX")
    ap.add_argument("--out", type=Path, default=None, metavar="FILE")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)  # a tree to measure with
    args = ap.parse_args(argv)
    try:
        todo = items(args.pack, args.family)
    except (OSError, ValueError, KeyError) as error:
        ap.error(f"--pack {args.pack}: {error}")
    if not todo:
        ap.error(f"--pack {args.pack} has no entries" + (f" of {', '.join(args.family)}" if args.family else ""))
    if args.child is not None:
        print(json.dumps(measure(args.child, todo, args.gpu)))
        return 0
    if not (args.before / "kernels" / "space.py").is_file():
        ap.error(f"--before {args.before}: not a checkout of this project (no kernels/space.py)")
    trees = {"before": args.before.resolve(), "after": ROOT}
    runs: dict[str, list[list[dict[str, Any]]]] = {"before": [], "after": []}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each child imports its own tree
    for p in range(args.passes):
        for side, tree in trees.items():
            done = subprocess.run([sys.executable, __file__, "--child", str(tree), "--pack", str(args.pack),
                                   "--gpu", str(args.gpu), "--before", str(args.before)]
                                  + [f"--family={f}" for f in args.family],
                                  capture_output=True, text=True, env={**env, "PYTHONPATH": _site()})
            if done.returncode:
                sys.stderr.write(done.stderr)
                return done.returncode
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"pass {p + 1} {side}: {len(todo)} configs measured", flush=True)
    rows = []
    for i, item in enumerate(todo):
        best = {side: max((r[i] for r in runs[side]), key=lambda r: r["gflops"] or 0.0) for side in trees}
        ratio = (best["after"]["gflops"] / best["before"]["gflops"]
                 if best["after"]["gflops"] and best["before"]["gflops"] else None)
        rows.append({**item, "before": best["before"], "after": best["after"], "ratio": ratio})
        shape = "x".join(map(str, item["shape"]))
        print(f"{shape:>15} {item['family']:9} {best['before']['state']:>5}/{best['after']['state']:<5} "
              f"{best['before']['gflops'] or 0:9.0f} {best['after']['gflops'] or 0:9.0f} "
              f"{ratio if ratio else float('nan'):6.3f}  {best['before']['sm_clock_mhz']}/{best['after']['sm_clock_mhz']} MHz")
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    print(f"after/before, geometric mean over {len(ratios)} configs: {geo:.4f}; "
          f"range {min(ratios):.3f}-{max(ratios):.3f}" if ratios else "nothing measured")
    bests = best_per_shape(rows)
    for b in bests:
        print(f"best of {b['configs']} {b['family']} configs at {b['shape']}: before {b['before_gflops'] or 0:.0f}, "
              f"after {b['after_gflops'] or 0:.0f} GFLOP/s ({b['ratio'] or float('nan'):.3f}; "
              f"{b['rejected_after']} rejected after, {b['rejected_before']} before)")
    if args.out:
        args.out.write_text(json.dumps({
            "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "passes": args.passes,
            "before": str(args.before), "pack": str(args.pack), "families": args.family or None, "geomean_ratio": geo,
            "rows": rows, "best_per_shape": bests,
            "runs": runs}, indent=1) + "\n")
    return 0


def best_per_shape(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, shape) with several configs in the pack: each side's fastest verified one, their
    ratio (after/before) and how many configs each side rejected."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["family"], "x".join(map(str, row["shape"]))), []).append(row)
    out = []
    for (family, shape), group in groups.items():
        if len(group) < 2:
            continue
        best = {side: max((r[side]["gflops"] or 0.0 for r in group if r[side]["state"] == "ok"), default=0.0) or None
                for side in ("before", "after")}
        out.append({"family": family, "shape": shape, "configs": len(group),
                    "before_gflops": best["before"], "after_gflops": best["after"],
                    "ratio": best["after"] / best["before"] if best["after"] and best["before"] else None,
                    **{f"rejected_{side}": sum(r[side]["state"] == "rejected" for r in group)
                       for side in ("before", "after")}})
    return out


def _site() -> str:
    """The installed dependencies' path without this tree's (the GPU host's wheelhouse target)."""
    return os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != ROOT)


if __name__ == "__main__":
    sys.exit(main())
