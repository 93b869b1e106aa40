"""The tuner on a real GPU (skipped without one): a short real study, and planted faulty kernels
(an illegal address, an infinite loop) recorded as crashed / timeout while the study goes on."""

from __future__ import annotations

import db
import kernels
import optuna
import pytest

from tuner.measure.live import LiveEvaluator
from tuner.measure.testing import (PLANTED_COMPILE_ERROR, PLANTED_ILLEGAL_ADDRESS,
                                   PLANTED_INFINITE_LOOP, PLANTED_OK, PlantedFamily)
from tuner.problem import Problem
from tuner.run.session import tune_all
from tuner.search.study import Budget, Session, run_study

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    evaluator = LiveEvaluator(0, cache_dir=tmp_path_factory.mktemp("cubins"), trial_timeout_s=10)
    yield evaluator
    evaluator.close()


@pytest.fixture
def database(tmp_path):
    with db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}") as opened:
        yield opened


def session_for(database, evaluator, **options) -> Session:
    gpu = db.GpuInfo(**evaluator.info())
    return Session(database=database, evaluator=evaluator,
                   storage=optuna.storages.RDBStorage(database.url),
                   gpu_id=database.ensure_gpu(gpu), gpu_name=gpu.name,
                   batch=evaluator.batch, progress=False, **options)


def test_a_short_study_finds_a_verified_recorded_config_faster_than_naive(live, database):
    problem = Problem(1024, 1024, 1024)
    naive, tiled = kernels.FAMILIES["naive"], kernels.FAMILIES["vectorized"]
    summary = tune_all(session_for(database, live), [naive, tiled], [problem],
                       Budget(trials=12, timeout_s=240, patience=None))
    outcomes = {family.name: outcome for _, family, outcome in summary.outcomes}
    assert outcomes["naive"].best_gflops and outcomes["vectorized"].best_gflops
    assert outcomes["vectorized"].best_gflops > outcomes["naive"].best_gflops

    best = database.best(live.info()["uuid"], 1024, 1024, 1024, nearest=False)
    # Configs can tie to the last digit (medians of quantized event times): the stored best is then
    # the first stored, the study's the first finished; the speed is the invariant.
    assert best.family == "vectorized" and best.gflops == pytest.approx(outcomes["vectorized"].best_gflops)
    assert best.baseline_gflops and 0 < best.fraction_of_cublas < 2

    # verified once more, from scratch: correct against the float64 reference, similar speed
    again = live.evaluate(tiled, best.params, problem)
    assert again.state == "ok", again.error
    assert again.gflops == pytest.approx(best.gflops, rel=0.3)


def test_planted_faulty_kernels_are_recorded_while_the_study_goes_on(live, database):
    planted = PlantedFamily()
    outcome = run_study(session_for(database, live, sampler="random"), planted,
                        Problem(256, 256, 256), Budget(trials=10, timeout_s=300, patience=None))
    assert outcome.run_state == "finished" and outcome.stop_reason == "search space exhausted"
    states = {t.params["MODE"]: t for t in database.run_history(outcome.run_id)}
    assert states[PLANTED_OK].state == "ok"
    assert states[PLANTED_ILLEGAL_ADDRESS].state == "crashed"
    assert states[PLANTED_INFINITE_LOOP].state == "timeout"
    assert states[PLANTED_COMPILE_ERROR].state == "compile_error"
    assert all(t.error for mode, t in states.items() if mode != PLANTED_OK)
    assert outcome.best_config == {"MODE": PLANTED_OK}
    assert live.replacements >= 2
    # the replaced GPU process still measures correctly
    assert live.evaluate(planted, {"MODE": PLANTED_OK}, Problem(256, 256, 256)).state == "ok"
