"""A family's declared starting points: accepted everywhere, and measured first by a fresh study."""
from __future__ import annotations

from pathlib import Path

import db
import kernels
import optuna
import pytest

from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem
from tuner.search.study import Budget, Session, run_study
from tuner.search.warmstart import warm_start

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
WITH_POINTS = [f for f in kernels.FAMILIES.values() if f.starting_points]


def all_warm(*args, **kwargs) -> list[dict[str, int]]:
    """The warm start's two lists as one, in the order a study asks them."""
    same, rest = warm_start(*args, **kwargs)
    return same + rest


def test_some_family_declares_starting_points():
    assert WITH_POINTS, "tf32x3 declares its measured-good configs"


@pytest.mark.parametrize("family", WITH_POINTS, ids=lambda f: f.name)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_starting_points_are_distinct_accepted_configs(family, arch):
    if not family.offered_on(arch):
        pytest.skip(f"{family.name} runs only on {', '.join(family.architectures)}")
    points = [dict(p) for p in family.starting_points]
    assert all(family.reject_reasons(p, arch) == [] for p in points)
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)


@pytest.fixture
def database(tmp_path):
    with db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}") as database:
        yield database


def test_a_fresh_study_measures_the_starting_points_first(database):
    family = kernels.get_family("tf32x3")
    problem = Problem(1024, 1024, 1024)
    assert all_warm(database, "NVIDIA H100 80GB HBM3", family, problem, "sm_90") == \
        [dict(p) for p in family.starting_points]

    evaluator = StandInEvaluator()
    info = evaluator.info()
    session = Session(database=database, evaluator=evaluator,
                      storage=optuna.storages.RDBStorage(database.url),
                      gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                      progress=False)
    count = len(family.starting_points)
    run_study(session, family, problem, Budget(trials=count + 2, timeout_s=None, patience=None))
    measured = [config for _, config, _ in evaluator.calls]
    assert measured[:count] == [dict(p) for p in family.starting_points]


def test_stored_results_come_before_the_starting_points(database):
    family = kernels.get_family("tf32x3")
    evaluator = StandInEvaluator()
    info = evaluator.info()
    session = Session(database=database, evaluator=evaluator,
                      storage=optuna.storages.RDBStorage(database.url),
                      gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                      progress=False, warm_start=False)
    tuned = run_study(session, family, Problem(512, 512, 512),
                      Budget(trials=10, timeout_s=None, patience=None))
    configs = all_warm(database, info["name"], family, Problem(1024, 1024, 1024), "sm_90")
    assert configs[0] == tuned.best_config
    points = [dict(p) for p in family.starting_points]
    assert len(configs) == len(points) + (tuned.best_config not in points)


def test_a_config_stored_before_a_parameter_existed_starts_as_it_ran(database):
    """A wgmma config stored before ASPLIT existed (declared with before=0; the committed pack's
    H200 entries were such until refreshed) is warm-started as ASPLIT=0, not dropped as a config
    the family no longer names."""
    from gemmtune.pack import import_pack, read_pack

    pack = read_pack(ROOT / "examples" / "pack-h100-h200.json")
    h100 = {(e["m"], e["n"], e["k"]): e["config"] for e in pack["entries"]
            if e["gpu"] == "NVIDIA H100 80GB HBM3" and e["family"] == "wgmma"}
    # an H200 entry whose shape the H100 tuned to another config (else its warm start, which
    # comes next, would hide the fault), stored as it was before ASPLIT
    old = next(e for e in pack["entries"] if e["gpu"] == "NVIDIA H200" and e["family"] == "wgmma"
               and e["config"]["ASPLIT"] == 0 and h100[e["m"], e["n"], e["k"]] != e["config"])
    old["config"] = {name: value for name, value in old["config"].items() if name != "ASPLIT"}
    import_pack(pack, database, source="pack-h100-h200.json")
    family = kernels.get_family("wgmma")
    configs = all_warm(database, "NVIDIA H200", family, Problem(old["m"], old["n"], old["k"]),
                                 "sm_90")
    assert configs[0] == {**old["config"], "ASPLIT": 0}
    assert family.completed({"ASPLIT": 1, **old["config"]})["ASPLIT"] == 1  # a stored value stays


def test_another_gpus_best_this_gpu_cannot_run_is_not_warm_started(database):
    """An H100's best config for the problem, needing more shared memory per block than an
    Ampere GPU allows, starts no study on the Ampere GPU (it would be asked and rejected)."""
    family = kernels.get_family("tf32x3")
    config = next(c for c in family.accepted_configs("sm_90") if not family.accepts(c, "sm_80"))
    problem = Problem(1024, 1024, 1024)
    gpu_id = database.ensure_gpu(db.GpuInfo(name="NVIDIA H100 80GB HBM3", uuid="GPU-h100-test",
                                            compute_capability="9.0", sm_count=132,
                                            memory_bytes=80 * 2**30))
    run_id = database.start_run(
        gpu_id=gpu_id, problem_id=database.ensure_problem(problem.m, problem.n, problem.k),
        family_id=database.ensure_family(family.name, family.source_hash), sampler="default",
        seed=0, budget={}, host="test", command="test", study_name=None)
    database.add_trial(run_id, db.TrialRecord(number=0, params=config, state="ok",
                                              gflops=40000.0, time_median_ms=0.05))
    points = [dict(p) for p in family.starting_points]
    assert all_warm(database, "NVIDIA A100-SXM4-80GB", family, problem, "sm_90") == \
        [config] + [p for p in points if p != config]
    assert all_warm(database, "NVIDIA A100-SXM4-80GB", family, problem, "sm_80") == points


def test_the_warm_start_takes_turns_with_the_models_picks_model_first():
    from types import SimpleNamespace

    from tuner.search.study import StudyRun

    accepted = [{"X": i} for i in range(10)]
    asked: list[int] = []

    class Ranked:  # a model sampler whose ranking is rows 7, 2, 5, ...
        def first_picks(self, study, count):
            asked.append(count)
            return [7, 2, 5, 9][:count]

    study = SimpleNamespace(study=SimpleNamespace(sampler=Ranked()), accepted_all=accepted)
    warm = [{"X": 2}, {"X": 3}, {"X": 4}]
    # 2 is both the model's second pick and a warm-start config: asked once, where first due
    assert StudyRun._beside_model_picks(study, warm) == [{"X": 7}, {"X": 2}, {"X": 3}, {"X": 5}, {"X": 4}]
    assert asked == [3]  # as many of the model's as the warm start has
    # no model ranking (the static prior starts, or another sampler): the warm start alone
    study.study.sampler = object()
    assert StudyRun._beside_model_picks(study, warm) == warm
    study.study.sampler = SimpleNamespace(first_picks=lambda study, count: [])
    assert StudyRun._beside_model_picks(study, warm) == warm


def test_a_study_the_model_can_rank_asks_its_picks_beside_the_starting_points(database):
    """On the H100's bundled recordings the model knows tf32x3 at other shapes, so it ranks the
    configs from the start: its picks and the starting points alternate, the model's first."""
    family = kernels.get_family("tf32x3")
    problem = Problem(1024, 1024, 1024)
    evaluator = StandInEvaluator(gpu_name="NVIDIA H100 80GB HBM3")
    info = evaluator.info()
    session = Session(database=database, evaluator=evaluator,
                      storage=optuna.storages.RDBStorage(database.url),
                      gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                      progress=False, learn_from_recordings=True)
    points = [dict(p) for p in family.starting_points]
    run_study(session, family, problem, Budget(trials=2 * len(points), timeout_s=None, patience=None))
    measured = [config for _, config, _ in evaluator.calls]
    assert all(p in measured for p in points)
    assert measured[:len(points)] != points  # (before: the starting points, then the model's)


def test_the_best_stored_for_this_very_problem_is_asked_before_the_models_picks(database):
    """A best measured at this problem on this GPU model (an older source of the family, a
    pack's entry) is asked first even where the model ranks the configs: bench/refresh_pack.py
    re-measures a pack entry with one trial that must be the entry's own config."""
    family = kernels.get_family("tf32x3")
    problem = Problem(1024, 1024, 1024)
    evaluator = StandInEvaluator(gpu_name="NVIDIA H100 80GB HBM3")
    info = evaluator.info()
    gpu_id = database.ensure_gpu(db.GpuInfo(**info))
    points = [dict(p) for p in family.starting_points]
    stored = next(c for c in family.accepted_configs("sm_90") if c not in points)
    run_id = database.start_run(
        gpu_id=gpu_id, problem_id=database.ensure_problem(problem.m, problem.n, problem.k),
        family_id=database.ensure_family(family.name, "0" * 64), sampler="default",  # an older source
        seed=0, budget={}, host="test", command="test", study_name=None)
    database.add_trial(run_id, db.TrialRecord(number=0, params=stored, state="ok", gflops=40000.0,
                                              time_median_ms=0.05))
    assert warm_start(database, info["name"], family, problem, "sm_90") == ([stored], points)
    session = Session(database=database, evaluator=evaluator,
                      storage=optuna.storages.RDBStorage(database.url), gpu_id=gpu_id,
                      gpu_name=info["name"], progress=False, learn_from_recordings=True)
    run_study(session, family, problem, Budget(trials=3, timeout_s=None, patience=None))
    measured = [config for _, config, _ in evaluator.calls]
    assert measured[0] == stored and points[0] in measured[1:3] and measured[1:3] != points[:2]
