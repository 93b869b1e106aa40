"""Two claim workers against one search with their batches together, replayed (CPU, no GPU).

    python bench/claim_pair.py [--recording FILE] [--trials 50] [--seeds 20] [--first-seed 0]
        [--delay 0.05] [--storage URL] [--out FILE]

Issue 58 asks that workers on several hosts, sharing one study through PostgreSQL, search as
one search with their batches together. Per seed, on the replay of one recording with the
default sampler and the same budget (patience off):

- **single**: one ``python -m tuner --replay`` keeping two candidates in flight (SQLite);
- **pair**: two ``--claim-trials`` workers on one PostgreSQL storage, one candidate in flight
  each, every measurement delayed by ``--delay`` seconds so that the two overlap throughout.

Counted, as ``bench/search_efficiency.py`` counts: measurements (every worker's, in the order
stored; rejected configs cost nothing) until one within 3 % of the recording's best among the
configs the family accepts now; a run that never gets there counts as twice the budget. Also
checked for every pair: the budget measured exactly once over both workers, no config twice.
Reported: both samples, their medians and 90th percentiles, the median of the per-seed ratios
pair / single, and a two-sided Mann-Whitney U test (does the pair need more or fewer?).

The PostgreSQL server is ``--storage URL`` (a role that may CREATE DATABASE), else
$GEMMTUNE_TEST_PG_URL, else a private ``pgserver`` (as ``bench/shared_study.py``). JSON to
``bench/results/claim_pair.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RECORDING = REPO / "tuner" / "recordings" / "h100-pipelined-2048x2048x2048.json.gz"
DEFAULT_OUT = REPO / "bench" / "results" / "claim_pair.json"
LEVEL = 0.97  # "found": within 3 % of the best, bench/search_efficiency.py's middle level
HEARTBEAT_S, STALE_AFTER_S = 0.5, 5.0
EXIT_OK = 0


def worker(argv: list[str]) -> int:
    """``--as-worker DELAY BATCH [LOG] -- TUNER ARGS``: the tuner on a replay whose every
    measurement takes DELAY seconds (and is logged to LOG), BATCH candidates in flight."""
    delay, batch, *rest = argv
    log = rest[0] if rest and rest[0] != "--" else None
    tuner_args = argv[argv.index("--") + 1:]
    import tuner.measure.replay as replay
    recorded = replay.ReplayEvaluator.evaluate

    def evaluate(self: Any, family: Any, config: dict[str, int], problem: Any) -> Any:
        if log is not None:
            with open(log, "a") as out:
                out.write(json.dumps(config) + "\n")
        time.sleep(float(delay))
        return recorded(self, family, config, problem)

    replay.ReplayEvaluator.evaluate = evaluate  # type: ignore[method-assign]
    replay.ReplayEvaluator.batch = int(batch)  # type: ignore[attr-defined]
    from tuner.run.cli import main
    return main(tuner_args)


def target_gflops(recording_path: Path) -> tuple[str, float]:
    """The pair searched ("family MxNxK") and the best recorded rate among configs the family
    accepts now (a recording may predate a constraint)."""
    import kernels
    from tuner.measure.replay import ReplayEvaluator
    evaluator = ReplayEvaluator.open(recording_path)
    [(family_name, problem)] = evaluator.recording.pairs()
    family = evaluator.family(kernels.get_family(family_name))
    rates = [float(r.gflops) for c, r in evaluator.recording.results(family_name, problem)
             if r.usable and family.accepts(c, evaluator.arch())]
    return f"{family_name} {problem.m}x{problem.n}x{problem.k}", max(rates)


def to_level(url: str, best: float) -> tuple[int | None, list[str]]:
    """Measurements (every run's, in the order stored) until one within 3 % of ``best``, and
    every measured config."""
    import db
    with db.open_database(url) as database:
        trials = sorted((t for run in database.list_runs() for t in database.run_history(run.id)
                         if t.state != "rejected"), key=lambda t: t.number)
    found = next((i + 1 for i, t in enumerate(trials) if (t.gflops or 0) >= LEVEL * best), None)
    return found, [json.dumps(t.params, sort_keys=True) for t in trials]


def run_workers(tuner_args: list[str], delay: float, batch: int, logs: list[Path | None]
                ) -> list[str]:
    """The workers started together; their outputs. Raises where one fails."""
    processes = [subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--as-worker", str(delay), str(batch),
         *([str(log)] if log is not None else []), "--", *tuner_args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [
            str(REPO), os.environ.get("PYTHONPATH")]))}) for log in logs]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    for process, output in zip(processes, outputs):
        if process.returncode != EXIT_OK:
            raise RuntimeError(f"a worker ended with {process.returncode}:\n{output[-3000:]}")
    return outputs


def one_seed(recording: Path, trials: int, seed: int, delay: float, admin: str,
             folder: Path, best: float) -> dict[str, Any]:
    from db.testing import scratch_url
    never = 2 * trials
    base = ["--replay", str(recording), "--trials", str(trials), "--patience", "0",
            "--seed", str(seed)]
    single_url = f"sqlite:///{folder / f'single{seed}.sqlite'}"
    run_workers([*base, "--db", single_url], 0.0, 2, [None])
    single, _ = to_level(single_url, best)
    with scratch_url("postgresql", folder, admin) as url:
        logs = [folder / f"pair{seed}-{i}.log" for i in range(2)]
        run_workers([*base, "--db", url, "--claim-trials", "--heartbeat", str(HEARTBEAT_S),
                     "--stale-after", str(STALE_AFTER_S)], delay, 1, list(logs))
        pair, configs = to_level(url, best)
    measured_each = [len(log.read_text().splitlines()) if log.exists() else 0 for log in logs]
    return {"seed": seed, "single": single or never, "pair": pair or never,
            "pair_measured": len(configs), "pair_distinct": len(set(configs)),
            "measured_by_worker": measured_each}


def summarize(rows: list[dict[str, Any]], trials: int) -> dict[str, Any]:
    single = [r["single"] for r in rows]
    pair = [r["pair"] for r in rows]

    def p90(values: list[int]) -> float:
        return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 \
            else float(values[0])

    summary: dict[str, Any] = {
        "single_median": statistics.median(single), "single_p90": p90(single),
        "pair_median": statistics.median(pair), "pair_p90": p90(pair),
        "ratio_median": statistics.median(p / s for p, s in zip(pair, single)),
        "pair_fewer_or_equal": sum(p <= s for p, s in zip(pair, single)),
        "budget_once_no_config_twice": all(r["pair_measured"] == r["pair_distinct"] == trials
                                           for r in rows),
        "both_measured": all(min(r["measured_by_worker"]) > 0 for r in rows)}
    if len(rows) >= 3:
        from scipy.stats import mannwhitneyu
        summary["mann_whitney_p"] = float(mannwhitneyu(single, pair).pvalue)
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-worker"]:
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recording", type=Path, default=DEFAULT_RECORDING)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.05,
                        help="seconds each of the pair's measurements takes (default 0.05)")
    parser.add_argument("--storage", default=os.environ.get("GEMMTUNE_TEST_PG_URL"),
                        metavar="URL", help="PostgreSQL admin URL (a role that may CREATE "
                        "DATABASE); default $GEMMTUNE_TEST_PG_URL, else a private pgserver")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.trials < 2 or args.seeds < 1:
        parser.error(f"--trials must be at least 2 and --seeds at least 1 "
                     f"(got {args.trials}, {args.seeds})")
    if not args.recording.exists():
        parser.error(f"--recording {args.recording}: no such file")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from shared_study import postgres_admin  # bench/shared_study.py, beside this script

    searched, best = target_gflops(args.recording)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch, \
            postgres_admin(args.storage, Path(scratch)) as admin:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            rows.append(one_seed(args.recording, args.trials, seed, args.delay, admin,
                                 Path(scratch), best))
            row = rows[-1]
            print(f"seed {seed}: one search {row['single']}, two workers {row['pair']} "
                  f"(measured {row['measured_by_worker']})", flush=True)
    summary = summarize(rows, args.trials)
    result = {"what": "measurements to within 3 % of the recording's best (accepted configs): "
                      "one search with two in flight against two claim workers with one each",
              "recording": args.recording.name, "searched": searched, "best_gflops": best,
              "trials": args.trials, "delay_s": args.delay, "seconds": time.monotonic() - started,
              "rows": rows, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{searched}, {len(rows)} seeds: one search median {summary['single_median']} "
          f"(p90 {summary['single_p90']:.0f}), two workers median {summary['pair_median']} "
          f"(p90 {summary['pair_p90']:.0f}); pair/single per seed, median "
          f"{summary['ratio_median']:.2f}"
          + (f"; Mann-Whitney p = {summary['mann_whitney_p']:.2f}"
             if "mann_whitney_p" in summary else ""))
    print(f"budget measured once, no config twice: {summary['budget_once_no_config_twice']}; "
          f"both workers measured: {summary['both_measured']}; JSON: {args.out}")
    return EXIT_OK if summary["budget_once_no_config_twice"] and summary["both_measured"] else 1


if __name__ == "__main__":
    sys.exit(main())
