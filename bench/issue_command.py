"""Issue 19's command, run as a user runs it, on one or more source trees of this project.

    python bench/issue_command.py [--tree LABEL=PATH ...] [--order L1,L2,...] [--out FILE]
        [-- TUNER ARGS]

Each run is ``python -m tuner TUNER ARGS`` (default: ``--gpu 0 --shape 2048x2048x2048
--timeout 15``, the command issue 19 measured) started in the tree's folder, with a fresh SQLite
database and a fresh CUBIN cache, so every compile is a real one. The wall time is the whole
command's (its start, cuBLAS baselines and references included), as the issue timed it; the
results are read back from the run's database with plain SQL (the schema of ``gt_trials`` is
the same in every tree since the issue was filed), so an old tree needs nothing of this one.

``--order`` interleaves the trees (e.g. ``new,old,new``) so that a drift of the host (clock,
temperature) shows as a difference between two runs of the same tree rather than between trees.
Per run: configs measured (trials verified and timed), configs a minute, the median SM clock
of its trials, the best verified GFLOP/s and measured configs per family. JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

DEFAULT_TUNER_ARGS = ["--gpu", "0", "--shape", "2048x2048x2048", "--timeout", "15"]


def parse_trees(specs: list[str]) -> dict[str, Path]:
    trees: dict[str, Path] = {}
    for spec in specs or ["this=."]:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--tree {spec!r}: expected LABEL=PATH, e.g. old=.old")
        folder = Path(path).resolve()
        if not (folder / "tuner" / "__main__.py").is_file():
            raise SystemExit(f"--tree {spec!r}: {folder} holds no tuner/__main__.py")
        trees[label] = folder
    return trees


def read_results(db_file: Path) -> dict[str, Any]:
    """Per family: verified configs and the best GFLOP/s; over all: the SM clocks."""
    with closing(sqlite3.connect(db_file)) as db:
        rows = db.execute(
            "SELECT f.name, COUNT(*), MAX(t.gflops) FROM gt_trials t "
            "JOIN gt_runs r ON t.run_id = r.id JOIN gt_families f ON r.family_id = f.id "
            "WHERE t.state = 'ok' GROUP BY f.name").fetchall()
        clocks = [c for (c,) in db.execute(
            "SELECT sm_clock_mhz FROM gt_trials WHERE state = 'ok' AND sm_clock_mhz IS NOT NULL")]
    return {
        "ok_configs": {name: count for name, count, _ in rows},
        "best_gflops": {name: best for name, _, best in rows},
        "median_sm_clock_mhz": statistics.median(clocks) if clocks else None,
    }


def run_once(label: str, tree: Path, tuner_args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"issue-command-{label}-") as scratch:
        db_file = Path(scratch) / "gemmtune.sqlite"
        command = [sys.executable, "-m", "tuner", *tuner_args,
                   "--db", f"sqlite:///{db_file}", "--cache", str(Path(scratch) / "cubins")]
        start = time.perf_counter()
        # ``-m`` puts the working folder first on sys.path: the tree's own packages are imported
        done = subprocess.run(command, cwd=tree, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        wall_s = time.perf_counter() - start
        if done.returncode != 0:
            print(done.stdout[-4000:], file=sys.stderr)
            raise SystemExit(f"run {label!r} in {tree} exited {done.returncode}")
        results = read_results(db_file)
    measured = sum(results["ok_configs"].values())
    return {"label": label, "tree": str(tree), "command": command[1:], "wall_s": round(wall_s, 1),
            "measured": measured, "configs_per_min": round(60 * measured / wall_s, 1),
            **results}


def print_table(runs: list[dict[str, Any]]) -> None:
    families = sorted({f for run in runs for f in run["best_gflops"]})
    print(f"{'run':<12} {'wall s':>7} {'configs':>8} {'/min':>6} {'MHz':>6}  "
          + " ".join(f"{f[:10]:>10}" for f in families))
    for i, run in enumerate(runs):
        best = run["best_gflops"]
        print(f"{str(i + 1) + ' ' + run['label']:<12} {run['wall_s']:>7.1f} {run['measured']:>8} "
              f"{run['configs_per_min']:>6.0f} {run['median_sm_clock_mhz'] or 0:>6.0f}  "
              + " ".join(f"{best[f] / 1000:>10.2f}" if f in best else f"{'-':>10}"
                         for f in families))
    print("(best per family in TFLOP/s)")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, tuner_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, DEFAULT_TUNER_ARGS)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a source tree of this project to run the command in (repeat; "
                             "default: this=.)")
    parser.add_argument("--order", default=None,
                        help="comma-separated labels, the runs in order (default: each once)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file")
    args = parser.parse_args(ours)
    trees = parse_trees(args.tree)
    order = args.order.split(",") if args.order else list(trees)
    unknown = [label for label in order if label not in trees]
    if unknown:
        raise SystemExit(f"--order names {unknown}; the trees are {sorted(trees)}")
    runs: list[dict[str, Any]] = []
    for label in order:
        runs.append(run_once(label, trees[label], tuner_args))
        print(f"run {len(runs)} ({label}): {runs[-1]['measured']} configs in "
              f"{runs[-1]['wall_s']} s", flush=True)
        if args.out:
            args.out.write_text(json.dumps({"tuner_args": tuner_args, "runs": runs}, indent=1))
    print_table(runs)


if __name__ == "__main__":
    main()
