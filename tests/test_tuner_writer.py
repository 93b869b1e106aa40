"""Storage writes on the writer thread (issue 19): the same trials are stored, in the same order
and with the same numbers, as when the main thread wrote them; a failing write surfaces on the
main thread; a stopped run keeps every trial it measured."""

from __future__ import annotations

import dataclasses
import threading
import time

import db
import kernels
import optuna
import pytest
from optuna.trial import TrialState

from tuner.lifetime import StopRequest
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem
from tuner.search.study import Budget, Session, run_study
from tuner.search.writer import StoreWriter, WriterFailed

NAIVE = kernels.FAMILIES["naive"]
P1024 = Problem(1024, 1024, 1024)
VOLATILE = {"id", "run_id", "started_at", "recorded_at"}  # when and where, not what

optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_session(path, evaluator, **options) -> Session:
    database = db.open_database(f"sqlite:///{path}")
    info = evaluator.info()
    return Session(database=database, evaluator=evaluator,
                   storage=optuna.storages.RDBStorage(database.url),
                   gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                   progress=False, warm_start=False, **options)


def slow_results_database(database, delay_s: float) -> None:
    """Each add_trial takes delay_s longer: writes queue up behind the loop."""
    add_trial = database.add_trial

    def slow(run_id, record):
        time.sleep(delay_s)
        return add_trial(run_id, record)

    database.add_trial = slow


def stored(session: Session, outcome) -> tuple[list, list]:
    """(the Optuna storage's trials, the results database's trials), without timestamps."""
    study = optuna.load_study(study_name=outcome.study_name, storage=session.storage)
    optuna_trials = [(t.number, t.state, t.params, t.values, t.user_attrs, t.system_attrs)
                     for t in study.get_trials(deepcopy=False)]
    results = [{k: v for k, v in dataclasses.asdict(t).items() if k not in VOLATILE}
               for t in session.database.run_history(outcome.run_id)]
    return optuna_trials, results


def test_the_writer_runs_jobs_in_order_and_a_failure_stops_it_and_is_raised():
    writer = StoreWriter()
    ran: list[int] = []
    threads: set[str] = set()

    def job(i: int):
        def run() -> int:
            threads.add(threading.current_thread().name)
            if i == 3:
                raise OSError("disk full")
            ran.append(i)
            return i
        return run

    futures = [writer.submit(job(i)) for i in range(6)]
    with pytest.raises(OSError, match="disk full"):
        writer.flush()
    assert ran == [0, 1, 2]  # nothing after the failed write: it would follow a gap
    assert [f.result() for f in futures[:3]] == [0, 1, 2]
    assert isinstance(futures[4].exception(), WriterFailed)
    assert threads == {"gemmtune-store"}
    with pytest.raises(OSError, match="disk full"):  # and at the next enqueue
        writer.submit(job(9))
    assert isinstance(writer.close(), OSError)


def test_background_writes_store_what_the_main_thread_stored(tmp_path):
    """Same seed, same stand-in: a study written by the writer thread and one written on the
    main thread store identical trials (numbers, states, params, values, attributes, the
    duplicates' duplicate_of) in both the Optuna storage and the results database."""
    seen = []
    for background in (False, True):
        evaluator = StandInEvaluator()
        session = open_session(tmp_path / f"{background}.sqlite", evaluator, sampler="random",
                               batch=3, background_store=background)
        if background:
            slow_results_database(session.database, 0.01)  # let the queue hold several
        outcome = run_study(session, NAIVE, P1024,
                            Budget(trials=30, timeout_s=None, patience=None))
        seen.append((stored(session, outcome), outcome.best_number, outcome.best_config,
                     outcome.measured_now))
        session.database.close()
    assert seen[0] == seen[1]
    (optuna_trials, results), *_ = seen[0]
    assert any("duplicate_of" in attrs for *_, attrs, _ in optuna_trials)  # the lazy numbers
    assert [r["number"] for r in results] == sorted(r["number"] for r in results)


def test_a_failing_write_surfaces_on_the_main_thread_and_fails_the_run(tmp_path):
    evaluator = StandInEvaluator()
    session = open_session(tmp_path / "g.sqlite", evaluator, batch=3)
    add_trial, calls = session.database.add_trial, []

    def failing(run_id, record):
        calls.append(threading.current_thread().name)
        if len(calls) == 4:
            raise OSError("disk full")
        return add_trial(run_id, record)

    session.database.add_trial = failing
    with pytest.raises(OSError, match="disk full"):
        run_study(session, NAIVE, P1024, Budget(trials=10, timeout_s=None, patience=None))
    assert set(calls) == {"gemmtune-store"}  # written off the main thread
    (run,) = session.database.list_runs()
    assert run.state == "failed"
    # the three trials written before the failure are there, under the storage's numbers
    assert [t.number for t in session.database.run_history(run.id)] == [0, 1, 2]
    session.database.close()


@pytest.mark.parametrize("how", ["ctrl-c", "second ctrl-c"])
def test_an_interrupted_run_keeps_every_trial_it_measured(tmp_path, how):
    """Writes lag behind (a slow results database) when the run is stopped: the first Ctrl-C
    (stop after the trial in hand) and an abort (KeyboardInterrupt out of the evaluator) both
    store every measured trial in both stores before the run ends, and a resume goes on."""

    class AbortAfter(StandInEvaluator):
        def evaluate(self, family, config, problem):
            if len(self.calls) == 5:
                raise KeyboardInterrupt
            return super().evaluate(family, config, problem)

    evaluator = (StandInEvaluator(interrupt_after=5) if how == "ctrl-c" else AbortAfter())
    path = tmp_path / "g.sqlite"
    with StopRequest() as stop:
        session = open_session(path, evaluator, batch=3, stop=stop)
        slow_results_database(session.database, 0.05)
        budget = Budget(trials=20, timeout_s=None, patience=None)
        if how == "ctrl-c":
            outcome = run_study(session, NAIVE, P1024, budget)
            assert outcome.run_state == "interrupted" and outcome.measured_now == 5
        else:
            with pytest.raises(KeyboardInterrupt):
                run_study(session, NAIVE, P1024, budget)
    measured = len(evaluator.calls)
    assert measured == 5
    study_name = optuna.get_all_study_names(session.storage)[0]
    study = optuna.load_study(study_name=study_name, storage=session.storage)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == measured and not study.get_trials(states=(TrialState.RUNNING,))
    (run,) = session.database.list_runs()
    assert run.state == "interrupted"
    assert session.database.count_trials(run.id)["ok"] == measured
    assert sorted(t.number for t in session.database.run_history(run.id)) == \
        sorted(t.number for t in complete)
    session.database.close()

    again_evaluator = StandInEvaluator()
    again = run_study(open_session(path, again_evaluator, batch=3), NAIVE, P1024,
                      Budget(trials=8, timeout_s=None, patience=None))
    assert (again.measured, again.measured_now) == (8, 3)
