"""Issue 19: consecutive studies of one shape overlap. When a study asks for no more candidates,
the next one opens and asks for its own, so that its compiles run and its first candidates reach
the GPU child while the first one drains (StudyRun.run's hand_over); nothing measured is lost and
every run ends as before. Real NVRTC compiles and the stand-in GPU child, on CPU."""

from __future__ import annotations

from typing import Any

import db
import kernels
import optuna
import pytest

from tuner.measure.live import LiveEvaluator
from tuner.problem import Problem
from tuner.run.session import tune_all
from tuner.search.study import Budget, Session, StudyRun

NAIVE = kernels.get_family("naive")
BLOCKTILE1D = kernels.get_family("blocktile1d")
PROBLEM = Problem(128, 96, 64)
TRIALS = 6


def _tune(tmp_path, hand_over: bool, monkeypatch) -> tuple[list[tuple[str, str]], Any, Any]:
    """tune_all over naive then blocktile1d; returns the evaluator calls in order, as (call,
    family), the summary and the database."""
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    calls: list[tuple[str, str]] = []
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=2, backend="tuner.testing",
                       backend_options={"measure_s": 0.2}) as evaluator:
        prepare, submit, collect = evaluator.prepare, evaluator.submit, evaluator.collect
        families: dict[int, str] = {}  # ticket → family

        def preparing(family, config):
            calls.append(("prepare", family.name))
            return prepare(family, config)

        def submitting(family, config, problem):
            ticket = submit(family, config, problem)
            families[id(ticket)] = family.name
            calls.append(("submit", family.name))
            return ticket

        def collecting(ticket):
            measurement = collect(ticket)
            calls.append(("collect", families[id(ticket)]))
            return measurement

        monkeypatch.setattr(evaluator, "prepare", preparing)
        monkeypatch.setattr(evaluator, "submit", submitting)
        monkeypatch.setattr(evaluator, "collect", collecting)
        session = Session(database=database, evaluator=evaluator,
                          storage=optuna.storages.RDBStorage(database.url),
                          gpu_id=database.ensure_gpu(db.GpuInfo(**evaluator.info())),
                          gpu_name="Hand-over Test GPU", sampler="random", seed=11,
                          batch=evaluator.batch, warm_start=False, progress=False,
                          phases=evaluator.phases, hand_over=hand_over)
        summary = tune_all(session, [NAIVE, BLOCKTILE1D], [PROBLEM],
                           Budget(trials=TRIALS, timeout_s=120, patience=None))
    return calls, summary, database


@pytest.mark.parametrize("hand_over", [True, False])
def test_the_next_study_asks_while_one_drains_and_nothing_is_lost(tmp_path, monkeypatch,
                                                                  hand_over):
    calls, summary, database = _tune(tmp_path, hand_over, monkeypatch)
    first_of_next = calls.index(("prepare", "blocktile1d"))
    last_of_first = max(i for i, call in enumerate(calls) if call == ("collect", "naive"))
    if hand_over:
        assert first_of_next < last_of_first, "the next study waited for the first to drain"
    else:
        assert first_of_next > last_of_first
    # every candidate handed over was measured, and each study's own results recorded
    assert [call for call, _ in calls].count("submit") == 2 * TRIALS
    assert [(f.name, o.run_state, o.stop_reason, o.measured_now)
            for _, f, o in summary.outcomes] == [
        ("naive", "finished", "trial budget", TRIALS),
        ("blocktile1d", "finished", "trial budget", TRIALS)]
    runs = database.list_runs()
    assert sorted(run.state for run in runs) == ["finished", "finished"]
    for run in runs:
        trials = [t for t in database.run_history(run.id) if t.state != "rejected"]
        assert len(trials) == TRIALS and all(t.state == "ok" for t in trials)
    database.close()


def test_an_error_in_a_study_ends_the_next_one_it_opened(tmp_path, monkeypatch):
    """A study that fails after handing over: the next study's run is ended too (its claims let
    go, marked interrupted), and the error reaches the caller."""
    loop = StudyRun._loop

    def failing_after_the_hand_over(self, bar, hand_over):
        if self.family is NAIVE:
            def handed_over_then_failed():
                hand_over()
                raise RuntimeError("planted failure after the hand-over")
            return loop(self, bar, handed_over_then_failed)
        return loop(self, bar, hand_over)

    monkeypatch.setattr(StudyRun, "_loop", failing_after_the_hand_over)
    with pytest.raises(RuntimeError, match="planted failure"):
        _tune(tmp_path, True, monkeypatch)
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    states = {run.id: run.state for run in database.list_runs()}
    assert sorted(states.values()) == ["failed", "interrupted"], states
    database.close()
