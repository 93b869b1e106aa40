"""How many compiles the static prior needs: its start-up with ``max_compiles`` = 8 … 48 against
the one with 48 (the shipped bound), per family and shape, with real NVRTC compiles (CPU only).

    python bench/prior_compiles.py [--shape 2048x2048x2048 ...] [--out FILE]

A fresh CUBIN cache spends most of its CPU on the prior's compiles (issue 19: up to 48 per study
beside ~45 measured candidates). A smaller bound is search-neutral exactly where it picks the same
start-up; this counts where it does (same configs in the same order) and how many of the 48-bound
start-up's configs the smaller one keeps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import kernels

from tuner.problem import Problem, parse_shape
from tuner.search import prior
from tuner.search.study import _enumerate, _seed_for, _startup_count

BOUNDS = (8, 16, 24, 32, 48)
H100 = prior.Target(sm_count=132, arch="sm_90")
BATCH = 17  # the H100 host's window: 14 compile workers + queue depth 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", default=[])
    parser.add_argument("--family", action="append", default=[])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "prior_compiles.json")
    args = parser.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shape] or [Problem(2048, 2048, 2048),
                                                         Problem(4096, 4096, 4096)]
    families = [kernels.get_family(f) for f in args.family] or [
        f for f in kernels.LADDER if f.offered_on("sm_90")]
    rows = []
    for problem in shapes:
        for family in families:
            startup = _enumerate(family, "sm_90", problem, "prior")
            if startup.groups is None:
                continue
            started = time.perf_counter()
            picked = {}
            for bound in BOUNDS:
                ranking = prior.Ranking()
                picked[bound] = prior.startup_configs(
                    family, startup.accepted, problem.m, problem.n, problem.k, H100,
                    _startup_count(BATCH), _seed_for(0, 0),
                    prior.compiled_usage(family, "sm_90"), bound, ranking, groups=startup.groups)
            full = picked[max(BOUNDS)]
            row = {"shape": problem.shape, "family": family.name, "groups": len(startup.groups),
                   "same_startup": {b: picked[b] == full for b in BOUNDS},
                   "kept_of_full": {b: sum(c in full for c in picked[b]) for b in BOUNDS},
                   "startup_size": len(full), "seconds": time.perf_counter() - started}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"bounds": BOUNDS, "rows": rows}, indent=1) + "\n")
    for bound in BOUNDS:
        same = sum(r["same_startup"][bound] for r in rows)
        print(f"max_compiles {bound:2d}: same start-up as 48 in {same} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
