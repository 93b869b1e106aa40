"""bench/search_efficiency.py across GPU models (issue 17 part 2) on CPU: the committed H100
tf32x3-kheavy recording (one problem) beside a copy of it under another GPU model's header, whose
own optimum is made different (the H100 optimum turned into a wrong result there), so what a row
starts from shows whose recording it came from."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import db
import kernels
import pytest

from tuner.measure.recording import BUNDLED_RECORDINGS, RecordedResult, Recording, load
from tuner.problem import Problem
from tuner.search.warmstart import warm_start
from bench_support import search_efficiency

ROOT = Path(__file__).resolve().parents[1]
H100_PATH = BUNDLED_RECORDINGS / "h100-tf32x3-256x256x16384.json.gz"
FAMILY, PROBLEM = "tf32x3", Problem(256, 256, 16384)
OTHER = "NVIDIA H200 (test)"


def other_model(source: Recording) -> Recording:
    """``source`` as another GPU model's recording whose optimum is another config."""
    copy = load(H100_PATH)
    copy.gpu = {**source.gpu, "name": OTHER, "uuid": "GPU-other-model-test"}
    best, _ = source.optimum(FAMILY, PROBLEM)  # type: ignore[misc]
    copy.add(FAMILY, PROBLEM, best, RecordedResult(state="wrong_result", error="test: another model"))
    return copy


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> tuple[str, str]:
    """(the H100 recording, the other model's)."""
    other = other_model(load(H100_PATH))
    return str(H100_PATH), str(other.save(tmp_path_factory.mktemp("xmodel") / "other.json.gz"))


def options(**changes: Any) -> argparse.Namespace:
    """The benchmark's own defaults, with both extra rows, one seed and ``changes``."""
    defaults = vars(search_efficiency().arguments().parse_args([]))
    return argparse.Namespace(**(defaults | dict(warm_start=True, cross_model=True, seeds=1)
                                 | changes))


def the_job(paths: tuple[str, str], recording: str, sampler: str) -> Any:
    bench = search_efficiency()
    jobs, _, _ = bench.plan(list(paths), ["default"], options())
    return next(j for j in jobs if j.recording == recording and j.sampler == sampler)


class InProcess:
    """ProcessPoolExecutor's stand-in: the runs in this process, where the spies are."""

    def __init__(self, max_workers: int, initializer: Any = None) -> None:
        pass  # no initializer: the pool's quieter logging must not reach the tests after this

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def map(self, function: Any, jobs: Any, chunksize: int = 1) -> Any:
        return map(function, jobs)


def test_no_other_gpu_models_recording_reaches_a_plain_rows_warm_start_or_training(
        paths, tmp_path, monkeypatch):
    """Every recording any run loads (its seed, its training), by sampler and searched model:
    a plain row's must all be of the searched GPU model, whatever the other holds."""
    bench = search_efficiency()
    loaded: dict[tuple[str, str], set[str]] = {}
    current: list[Any] = []
    real_run_one, real_state = bench.run_one, bench._worker_state

    def run_one(job: Any) -> dict[str, Any]:
        current[:] = [job]
        return real_run_one(job)

    def worker_state(path: str) -> Any:
        state = real_state(path)
        if current:
            searched = real_state(current[0].recording)[1].gpu["name"]
            loaded.setdefault((current[0].sampler, searched), set()).add(state[1].gpu["name"])
        return state

    monkeypatch.setattr(bench, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(bench, "run_one", run_one)
    monkeypatch.setattr(bench, "_worker_state", worker_state)
    out = tmp_path / "se.json"
    assert bench.main([*(a for p in paths for a in ("--recording", p)), "--seeds", "1",
                       "--samplers", "default", "model", "hybrid", "--warm-start",
                       "--cross-model", "--kernel-tuner", "none", "--out", str(out)]) == 0
    h100 = load(H100_PATH).gpu["name"]
    plain = ("default", "model", "hybrid", bench.WARM, bench.DEFAULT_WARM)
    assert {key for key in loaded} == {(s, m) for s in (*plain, bench.XMODEL) for m in (h100, OTHER)}
    for sampler in plain:
        for model in (h100, OTHER):
            assert loaded[(sampler, model)] == {model}, (sampler, model)
    assert loaded[(bench.XMODEL, h100)] == {h100, OTHER}  # the other model's optima: its seed
    rows = json.loads(out.read_text())["summary"]
    assert {(r["sampler"], r["fit"]) for r in rows if r["sampler"] == bench.XMODEL} == {
        (bench.XMODEL, f"warm-started from {OTHER}"), (bench.XMODEL, f"warm-started from {h100}")}


def test_plain_rows_others_are_the_searched_models_recordings_and_mixing_is_refused(paths, tmp_path):
    bench = search_efficiency()
    h100, other = paths
    jobs, _, skipped = bench.plan(list(paths), ["default", "model"], options())
    assert skipped == []  # each model has the other's recording of tf32x3
    for job in jobs:
        assert job.others == (job.recording,)
        assert job.other_models == ((other if job.recording == h100 else h100,)
                                    if job.sampler == bench.XMODEL else ())
    # training on the H100: nothing of the other model (its copy of this very problem included)
    job = next(j for j in jobs if j.recording == h100 and j.sampler == "model")
    assert bench.training_for(job, load(H100_PATH).gpu["name"]) == []  # its only problem held out
    mixed = bench.Job(h100, FAMILY, PROBLEM, bench.WARM, 0, 10, paths)
    with pytest.raises(ValueError, match="another GPU model"):
        bench.training_for(mixed, load(H100_PATH).gpu["name"])
    with pytest.raises(ValueError, match="another GPU model"):
        bench._seed_other_optima(db.open_database(f"sqlite:///{tmp_path / 'w.sqlite'}"), mixed,
                                load(H100_PATH).gpu)


def test_pairs_without_another_models_recording_are_skipped_for_the_xmodel_row(paths):
    bench = search_efficiency()
    jobs, _, skipped = bench.plan([paths[0]], ["default"], options())
    assert bench.XMODEL not in {j.sampler for j in jobs}
    assert skipped == [f"{H100_PATH.name} {FAMILY} {PROBLEM.shape}: no {bench.XMODEL} row: no "
                       f"recording of another GPU model than {load(H100_PATH).gpu['name']} "
                       f"holds {FAMILY}"]


def test_the_xmodel_row_starts_from_the_other_models_optimum_of_this_problem(paths, tmp_path,
                                                                           monkeypatch):
    bench = search_efficiency()
    h100 = load(H100_PATH)
    own, _ = h100.optimum(FAMILY, PROBLEM)  # type: ignore[misc]
    theirs, _ = load(paths[1]).optimum(FAMILY, PROBLEM)  # type: ignore[misc]
    family = kernels.FAMILIES[FAMILY]
    assert theirs != own and theirs not in family.starting_points  # the check can tell them apart
    job = the_job(paths, paths[0], bench.XMODEL)

    # the seed: the other model's optimum of this problem, under its own GPU; nothing of the H100
    with db.open_database(f"sqlite:///{tmp_path / 'seed.sqlite'}") as database:
        assert bench._seed_other_models(database, job) == [OTHER]
        assert [g.name for g in database.list_gpus()] == [OTHER]
        stored = database.best(OTHER, PROBLEM.m, PROBLEM.n, PROBLEM.k, family=FAMILY, nearest=False)
        assert stored.params == theirs
        same, rest = warm_start(database, h100.gpu["name"], family, PROBLEM, h100.arch)
        assert (same + rest)[0] == theirs

    # the run: its first measured config is that optimum
    measured: list[dict[str, int]] = []
    evaluate = bench._StopNearOptimum.evaluate

    def spy(self: Any, family: Any, config: dict[str, int], problem: Problem) -> Any:
        measured.append(dict(config))
        return evaluate(self, family, config, problem)

    monkeypatch.setattr(bench._StopNearOptimum, "evaluate", spy)
    result = bench.run_one(job)
    assert measured[0] == theirs and result["warm_from"] == [OTHER]


def test_the_cross_model_target_is_half_the_cold_prior_set_ups_median():
    bench = search_efficiency()

    def row(sampler: str, median: float) -> dict[str, Any]:
        return {"recording": "r", "family": FAMILY, "shape": PROBLEM.shape, "sampler": sampler,
                "fit": "-", "3%": {"median": median, "p90": median}}

    checks = bench.cross_model_check([row("prior", 8), row(bench.XMODEL, 4)])
    assert [(c["ratio"], c["met"]) for c in checks] == [(0.5, True)]
    assert not bench.cross_model_check([row("prior", 8), row(bench.XMODEL, 5)])[0]["met"]
    assert not bench.cross_model_check([row("prior", 8), row(bench.XMODEL, float("inf"))])[0]["met"]
    assert bench.cross_model_check([row("prior", 8), row(bench.WARM, 1)]) == []


def test_learn_from_recordings_are_learned_from_but_never_searched(paths):
    """``--learn-from``: a recording of the searched GPU model joins every row's others (its
    training and warm start), one of another model only the cross-model row's; neither gets a
    row of its own."""
    bench = search_efficiency()
    h100, other = paths
    learned = str(BUNDLED_RECORDINGS / "h100-tf32x3-2560x2816x2304.json.gz")  # another H100 tf32x3 shape
    jobs, caps, _ = bench.plan([h100], ["default"], options(), learn_from=[learned, other])
    assert {j.recording for j in jobs} == {h100} and list(caps) == [(H100_PATH.name, FAMILY,
                                                                     PROBLEM.shape)]
    job = next(j for j in jobs if j.sampler == "default")
    assert set(job.others) == {h100, learned}
    training = bench.training_for(job, load(H100_PATH).gpu["name"])
    assert {e.problem.shape for e in training} == {"2560x2816x2304"}  # and nothing of its own
    xmodel = next(j for j in jobs if j.sampler == bench.XMODEL)
    assert xmodel.other_models == (other,)


def test_a_rows_examples_do_not_depend_on_how_the_files_are_named_or_ordered(paths):
    """A fresh file searched beside ``--learn-from`` files (itself among them, as with a glob),
    listed in any order, learns from the examples a replay of every file gives it: the cap on
    a study's examples sorts them before it samples, so their order is not part of the row."""
    from tuner.search.learned import capped

    bench = search_efficiency()
    h100, _ = paths
    bundled = [str(BUNDLED_RECORDINGS / name) for name in (
        "h100-tf32x3-2560x2816x2304.json.gz", "h100-tf32x3-1536x4096x2560+2304x2304x4608.json.gz")]
    plain = options(warm_start=False, cross_model=False)
    replay = bench.plan(sorted([h100, *bundled]), ["default"], plain)[0]
    fresh = bench.plan([h100], ["default"], plain, learn_from=[*reversed(bundled), h100])[0]
    [job] = [j for j in replay if j.recording == h100 and j.seed == 0]
    [new] = [j for j in fresh if j.seed == 0]
    assert sorted(new.others) == sorted(job.others) and new.others != job.others
    gpu = load(H100_PATH).gpu["name"]
    learned = bench.training_for(job, gpu)
    assert len(learned) > 500  # so that the cap below samples
    assert capped(bench.training_for(new, gpu), job.family, limit=500) == capped(
        learned, job.family, limit=500)
