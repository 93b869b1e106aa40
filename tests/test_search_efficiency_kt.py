"""bench/search_efficiency.py's Kernel Tuner rows on CPU: a small slice of the committed H100
recording (vectorized at 1024³, BM and BN in {64, 128}: 116 configs), with one config turned into a
compile error, searched by Kernel Tuner itself (no mock) in simulation mode."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import kernels
import pytest

from tuner.measure.recording import (BUNDLED_RECORDINGS, FamilyHeader, ProblemRecording, RecordedResult, Recording,
                                     Selection, load)
from tuner.problem import Problem
from bench_support import search_efficiency

kernel_tuner = pytest.importorskip("kernel_tuner")

ROOT = Path(__file__).resolve().parents[1]
SOURCE = BUNDLED_RECORDINGS / "h100-warptile+vectorized-2048x2048x2048+1024x1024x1024.json.gz"
FAMILY, PROBLEM = "vectorized", Problem(1024, 1024, 1024)
NARROW = {"BM": (64, 128), "BN": (64, 128)}




def _slice(recording: Recording) -> Recording:
    """The recorded pair narrowed to NARROW and to the configs the family accepts today (the
    recording predates blocked sums, which halved the register-tiled spaces): still the full
    accepted space of its (smaller) grid; the first config that is not the optimum becomes a
    compile error."""
    header = recording.families[FAMILY]
    family = kernels.get_family(FAMILY)
    grid = {name: NARROW.get(name, values) for name, values in header.grid.items()}
    rows = {header.values(c): r for c, r in recording.results(FAMILY, PROBLEM)
            if all(c[name] in values for name, values in NARROW.items()) and family.accepts(c)}
    best = max(rows, key=lambda values: rows[values].gflops)
    broken = next(values for values in rows if values != best)
    rows[broken] = RecordedResult(state="compile_error", error="test: a failed config")
    narrowed = FamilyHeader(FAMILY, header.source_hash, header.params, grid,
                            Selection("full", len(rows), len(rows), None))
    return Recording(gpu=recording.gpu, arch=recording.arch, nvrtc_version=recording.nvrtc_version,
                     families={FAMILY: narrowed},
                     problems=[ProblemRecording(PROBLEM, None, {FAMILY: rows})], note="test slice")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, Recording]:
    recording = _slice(load(SOURCE))
    path = recording.save(tmp_path_factory.mktemp("kt") / "tiny.json.gz")
    return str(path), recording


def _keys(recording: Recording) -> dict[str, RecordedResult]:
    params = recording.families[FAMILY].params
    return {",".join(str(c[p]) for p in params): r for c, r in recording.results(FAMILY, PROBLEM)}


def test_the_restriction_admits_exactly_the_recorded_configs(tiny):
    from kernel_tuner.searchspace import Searchspace

    bench = search_efficiency()
    _, recording = tiny
    header = recording.families[FAMILY]
    recorded = _keys(recording)
    restriction = bench._kt_restriction(set(recorded))
    space = Searchspace({k: list(v) for k, v in header.grid.items()}, [restriction], 1 << 30)
    admitted = {",".join(str(v) for v in config) for config in space.list}
    assert admitted == recorded.keys()
    everything = list(itertools.product(*header.grid.values()))
    family = kernels.get_family(FAMILY)
    rejected = [values for values in everything
                if family.reject_reasons(dict(zip(header.params, values)))]
    assert rejected and len(recorded) + len(rejected) == len(everything)
    # what the family rejects was never recorded and is never admitted
    assert not any(",".join(map(str, values)) in admitted for values in rejected)


@pytest.mark.parametrize("strategy", ["brute_force", "random_sample", "genetic_algorithm"])
def test_each_run_counts_recorded_configs_once_in_the_order_served(tiny, strategy):
    bench = search_efficiency()
    path, recording = tiny
    recorded = _keys(recording)
    broken = next(k for k, r in recorded.items() if r.state == "compile_error")
    orders = []
    for seed in (0, 1, 0):
        job = bench.Job(path, FAMILY, PROBLEM, f"kt:{strategy}", seed, len(recorded))
        search = bench.kt_search(job)
        order = [key for key, _ in search.measured]
        assert len(order) == len(set(order)) == search.spent  # each once, as Kernel Tuner counted
        assert set(order) <= recorded.keys() and search.returned == order
        for key, ms in search.measured:
            assert ms == (recorded[key].time_median_ms if recorded[key].usable else float("inf"))
        run = bench.run_kernel_tuner(job)
        assert run["evaluations"] == len(order) and run["sampler"] == f"kt:{strategy}"
        if strategy in ("brute_force", "random_sample"):  # max_fevals = the space: it gets there
            assert run["reached"]["1%"] is not None
        if strategy == "brute_force":  # one runner call over the whole space: the failed config
            assert broken in order and len(order) == len(recorded)  # is measured and counted
        orders.append(order)
    assert orders[0] == orders[2]  # seeded: the same seed, the same search
    if strategy != "brute_force":
        assert orders[0] != orders[1]


def test_rows_and_best_strategy_in_the_table_and_json(tiny, tmp_path, capsys):
    bench = search_efficiency()
    path, recording = tiny
    out = tmp_path / "kt.json"
    assert bench.main(["--recording", path, "--samplers", "random", "--kernel-tuner",
                       "random_sample", "genetic_algorithm", "brute_force", "no_such_strategy",
                       "--seeds", "2", "--workers", "1", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    rows = {r["sampler"]: r for r in document["summary"]}
    assert set(rows) == {"random", "kt:random_sample", "kt:genetic_algorithm", "kt:brute_force"}
    assert rows["kt:random_sample"]["max_evals"] == len(_keys(recording))
    assert rows["kt:brute_force"]["distinct_orders"] == 1  # it ignores the seed
    assert "kt:no_such_strategy" in document["skipped_samplers"]
    (best,) = document["kernel_tuner_best"]
    candidates = [r for name, r in rows.items() if name in ("kt:random_sample",
                                                            "kt:genetic_algorithm")]
    lowest = min((r["3%"]["median"], r["3%"]["p90"]) for r in candidates)
    assert (best["median"], best["p90"]) == lowest and best["strategy"] != "kt:brute_force"
    assert rows[best["strategy"]]["3%"]["median"] == best["median"]
    printed = capsys.readouterr().out
    assert f"best Kernel Tuner strategy (lowest median to 3%): {FAMILY} {PROBLEM.shape}: " \
           f"{best['strategy']}" in printed
    assert "kt:genetic_algorithm" in printed

    # --merge keeps the rows and the best strategy
    merged = tmp_path / "merged.json"
    assert bench.main(["--merge", str(out), "--out", str(merged)]) == 0
    assert json.loads(merged.read_text())["kernel_tuner_best"] == document["kernel_tuner_best"]


def test_none_runs_no_kernel_tuner_rows(tiny, tmp_path):
    bench = search_efficiency()
    path, _ = tiny
    out = tmp_path / "none.json"
    assert bench.main(["--recording", path, "--samplers", "random", "--kernel-tuner", "none",
                       "--seeds", "1", "--workers", "1", "--out", str(out)]) == 0
    assert {r["sampler"] for r in json.loads(out.read_text())["summary"]} == {"random"}


def test_slice_is_a_full_recording_of_its_grid(tiny):
    _, recording = tiny
    family = kernels.get_family(FAMILY)
    grid = recording.families[FAMILY].grid
    accepted = [c for c in family.accepted_configs(recording.arch)
                if all(c[n] in grid[n] for n in grid)]
    assert len(accepted) == len(_keys(recording))
    assert dataclasses.asdict(recording.families[FAMILY].selection)["mode"] == "full"
