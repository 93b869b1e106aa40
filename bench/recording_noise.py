"""Is a recording's optimum a real optimum or a lucky timing? Re-time its best configs (GPU).

    python bench/recording_noise.py --pair tuner/recordings/h100-tf32x3-1536x4096x2560+2304x2304x4608.json.gz:1536x4096x2560
        [--pair FILE:MxNxK ...] [--top 12] [--rounds 5] [--gpu 0] [--workers N] [--out FILE]

``bench/search_efficiency.py`` counts measurements until a search comes within 3 % of a pair's
recorded optimum. A recording times each config once; where one config stands 3 % above the
rest (a "needle"), that one timing decides the target. For each pair this re-times the
``--top`` configs the recording ranks best, ``--rounds`` times each, every round in a fresh
random order (so clock drift spreads over all configs alike), through the recording's own
measurement path (``tuner.measure.record``'s ``time_in_rounds`` and ``measure_config``:
verified, CUDA events, rotated inputs; ``python -m tuner.record --retime-fastest`` keeps the
medians in a recording). It reports each config's recorded and re-timed GFLOP/s as fractions of the best, the
rounds' spread, the SM clock, and whether the recorded optimum stays the optimum, how many
configs the re-timing puts within 3 % of its best, and which of them the recording had there.

Pairs whose recording is of another GPU model than ``--gpu`` are skipped (so one command line
serves an H100 and an H200 host). JSON goes to ``bench/results/recording_noise-<gpu>.json``
unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402

from bench.throughput import gpu_slug  # noqa: E402
from tuner.measure.recording import RecordedResult, load  # noqa: E402
from tuner.problem import Problem, ShapeError, parse_shape  # noqa: E402
from tuner.report import format_table  # noqa: E402

NEAR = 0.97  # within 3 %: search_efficiency's target


@dataclass(frozen=True)
class Pair:
    path: str
    family: str
    problem: Problem


@dataclass
class Summary:
    """What the re-timing says of one pair's top configs (fractions of the best median)."""

    recorded: list[float]  # each config's recorded GFLOP/s over the recorded best
    retimed: list[float]  # each config's median re-timed GFLOP/s over the best such median
    spread: list[float]  # each config's (max - min) / median over the rounds
    optimum_rank: int  # the recorded optimum's place (0: first) among the re-timed medians
    optimum_retimed: float  # its re-timed median over the best re-timed median
    near_recorded: int  # configs the recording puts within 3 % of its best
    near_retimed: int  # configs the re-timing puts within 3 % of its best
    near_both: int  # configs within 3 % in both


def summarise(recorded: Sequence[float], rounds: Sequence[Sequence[float]]) -> Summary:
    """``recorded``: each config's recorded GFLOP/s; ``rounds``: per round, each config's
    re-timed GFLOP/s (same order; 0 where a round failed it)."""
    if not recorded or not rounds or any(len(r) != len(recorded) for r in rounds):
        raise ValueError("every round needs one value per recorded config")
    medians = [statistics.median(r[i] for r in rounds) for i in range(len(recorded))]
    top_recorded, top_retimed = max(recorded), max(medians)
    if top_recorded <= 0 or top_retimed <= 0:
        raise ValueError("no config ran in the recording or in the re-timing")
    optimum = max(range(len(recorded)), key=lambda i: recorded[i])
    order = sorted(range(len(medians)), key=lambda i: -medians[i])
    near_recorded = {i for i, v in enumerate(recorded) if v >= NEAR * top_recorded}
    near_retimed = {i for i, v in enumerate(medians) if v >= NEAR * top_retimed}
    spread = [(max(r[i] for r in rounds) - min(r[i] for r in rounds)) / medians[i]
              if medians[i] > 0 else float("nan") for i in range(len(recorded))]
    return Summary([v / top_recorded for v in recorded], [v / top_retimed for v in medians],
                   spread, order.index(optimum), medians[optimum] / top_retimed,
                   len(near_recorded), len(near_retimed), len(near_recorded & near_retimed))


def parse_pair(text: str) -> Pair:
    path, sep, shape = text.rpartition(":")
    if not sep:
        raise ValueError(f"--pair {text!r}: expected RECORDING:MxNxK")
    try:
        problem = parse_shape(shape)
    except ShapeError as error:
        raise ValueError(f"--pair {text!r}: {error}") from None
    families = sorted({f for f, p in load(path).pairs() if p == problem})
    if len(families) != 1:
        raise ValueError(f"--pair {text!r}: the recording holds {shape} for "
                         f"{len(families)} families ({', '.join(families) or 'none'}); "
                         "expected exactly one")
    return Pair(path, families[0], problem)


def retime(pairs: Sequence[Pair], top: int, rounds: int, gpu: int, workers: int, seed: int
           ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from tuner.measure.live import CompilePool
    from tuner.measure.record import GpuMeasurer, time_in_rounds

    measurer = GpuMeasurer(gpu)
    info = measurer.bench.info()
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    pool = CompilePool(measurer.arch, None, workers)
    try:
        for pair in pairs:
            recording = load(pair.path)
            name = str(recording.gpu.get("name"))
            if name != info["name"]:
                print(f"skipped {pair.path}:{pair.problem.shape}: recorded on {name}, "
                      f"this is {info['name']}", file=sys.stderr)
                continue
            family = kernels.get_family(pair.family)
            chosen = recording.fastest(pair.family, pair.problem, top)
            # every compile queued before the first timing, each kept for all the rounds
            compiles = {tuple(config.items()): pool.submit(family, dict(config))
                        for config, _ in chosen}
            measurer.set_problem(pair.problem)

            def measure(config: dict[str, int]) -> RecordedResult:
                return measurer.measure(family, config, compiles[tuple(config.items())])

            timed = time_in_rounds([dict(c) for c, _ in chosen], rounds, measure, rng)
            values = [[float(r.gflops) if r.usable else 0.0 for r in round_] for round_ in timed]
            clocks = sorted({int(r.sm_clock_mhz) for round_ in timed for r in round_
                             if r.sm_clock_mhz})
            summary = summarise([float(r.gflops) for _, r in chosen], values)
            rows.append({"recording": Path(pair.path).name, "family": pair.family,
                         "shape": pair.problem.shape, "configs": [c for c, _ in chosen],
                         "rounds": values, "sm_clock_mhz": clocks, **asdict(summary)})
            print(table([rows[-1]]), flush=True)
    finally:
        pool.close()
    return info, rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    out = []
    for row in rows:
        head = (f"{row['recording']} {row['family']} {row['shape']}: recorded optimum re-timed "
                f"at place {row['optimum_rank'] + 1} ({row['optimum_retimed']:.3f} of the best); "
                f"within 3 %: recorded {row['near_recorded']}, re-timed {row['near_retimed']}, "
                f"both {row['near_both']}; SM clock {row['sm_clock_mhz']} MHz")
        lines = [[str(i + 1), f"{rec:.3f}", f"{ret:.3f}", f"{spread:.3f}",
                  " ".join(f"{k}={v}" for k, v in config.items())]
                 for i, (rec, ret, spread, config) in enumerate(
                     zip(row["recorded"], row["retimed"], row["spread"], row["configs"]))]
        out.append(head + "\n" + format_table(
            ["rec. place", "recorded", "re-timed", "spread", "config"], lines))
    return "\n\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", action="append", required=True, metavar="FILE:MxNxK",
                        help="a recording and one of its shapes; repeatable")
    parser.add_argument("--top", type=int, default=12, help="configs re-timed per pair")
    parser.add_argument("--rounds", type=int, default=5, help="times each config is re-timed")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="compile processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rounds' orders")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.top < 2 or args.rounds < 1:
        parser.error("--top must be at least 2 and --rounds at least 1")
    try:
        pairs = [parse_pair(text) for text in args.pair]
    except ValueError as error:
        parser.error(str(error))
    from tuner.measure.live import default_workers

    info, rows = retime(pairs, args.top, args.rounds, args.gpu,
                        args.workers or default_workers(), args.seed)
    out = args.out or ROOT / "bench" / "results" / f"recording_noise-{gpu_slug(info['name'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": info, "top": args.top, "rounds": args.rounds,
                               "pairs": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
