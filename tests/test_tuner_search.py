"""The search loop on CPU: real kernel families, real SQLite, real Optuna storage, and the
analytic stand-in evaluator in place of a GPU."""

from __future__ import annotations

from concurrent.futures import Future

import db
import kernels
import optuna
import pytest
from optuna.trial import TrialState

from tuner.lifetime import StopRequest
from tuner.measure.evaluator import OK
from tuner.measure.testing import StandInEvaluator, model_gflops
from tuner.problem import Problem, config_key
from tuner.run.session import tune_all
from tuner.search.space import config_from_params
from tuner.search.study import Budget, Session, _Known, _Tally, run_study, study_name

NAIVE = kernels.FAMILIES["naive"]
SMEM = kernels.FAMILIES["smem"]
BLOCKTILE1D = kernels.FAMILIES["blocktile1d"]
P1024 = Problem(1024, 1024, 1024)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def store(tmp_path):
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    yield database, optuna.storages.RDBStorage(database.url)
    database.close()


def session_for(store, evaluator: StandInEvaluator, **options) -> Session:
    database, storage = store
    info = evaluator.info()
    return Session(database=database, evaluator=evaluator, storage=storage,
                   gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                   progress=False, **options)


def measured_params(database, run_id: int) -> list[dict[str, int]]:
    return [t.params for t in database.run_history(run_id) if t.state != "rejected"]


def test_a_study_measures_its_budget_records_everything_and_reports_the_best(store):
    database, storage = store
    evaluator = StandInEvaluator()
    outcome = run_study(session_for(store, evaluator, batch=3), NAIVE, P1024,
                        Budget(trials=10, timeout_s=None, patience=None))

    assert outcome.run_state == "finished" and outcome.stop_reason == "trial budget"
    assert outcome.measured == outcome.measured_now == 10 == len(evaluator.calls)
    run = database.get_run(outcome.run_id)
    assert run.state == "finished" and run.study_name == study_name(
        evaluator.gpu_name, NAIVE, P1024)
    assert run.source_hash == NAIVE.source_hash and run.budget["trials"] == 10
    counts = database.count_trials(outcome.run_id)
    assert counts["ok"] == 10
    # every measured config reached the evaluator once; the reported best is the real maximum
    ok = [t for t in database.run_history(outcome.run_id) if t.state == "ok"]
    assert sorted(config_key(t.params) for t in ok) == sorted(
        config_key(c) for _, c, _ in evaluator.calls)
    top = max(ok, key=lambda t: t.gflops)
    assert outcome.best_config == top.params
    assert outcome.best_gflops == pytest.approx(model_gflops(NAIVE, top.params, P1024))
    best = database.best(evaluator.gpu_name, 1024, 1024, 1024, nearest=False)
    assert best is not None and best.params == top.params
    # the study in Optuna's storage holds the same trials, none left running
    study = optuna.load_study(study_name=run.study_name, storage=storage)
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}
    stored = {t.number: t for t in study.trials}
    for trial in database.run_history(outcome.run_id):
        # the study holds positions (tuner.search.space), the results database the real values
        assert config_from_params(NAIVE, stored[trial.number].params) == trial.params
        assert stored[trial.number].user_attrs["state"] == trial.state


def test_a_budget_filled_by_another_worker_during_the_fill_ends_as_the_trial_budget(
        store, monkeypatch):
    """Another worker's last result can arrive in the pull inside the window's fill: nothing is
    left to ask because the shared budget is full, and the run must say so (a worker of two on
    two H200s reported "search space exhausted" with most of its space unmeasured)."""
    from concurrent.futures import Future

    from tuner.search import study as study_module

    fill = study_module.StudyRun._fill
    arrived: list[int] = []

    def fill_with_a_result_arriving(self):
        if self.tally.measured == self.budget.trials - 1 and not arrived:
            stored: Future[int] = Future()
            stored.set_result(10_000)
            other = study_module._Known(stored, study_module.OK, 1.0, 0.0)
            self.tally.add(other, {"another": "worker's config"})
            arrived.append(self.tally.measured)
        fill(self)

    monkeypatch.setattr(study_module.StudyRun, "_fill", fill_with_a_result_arriving)
    outcome = run_study(session_for(store, StandInEvaluator(), batch=1), NAIVE, P1024,
                        Budget(trials=5, timeout_s=None, patience=None))
    assert arrived == [5] and outcome.measured_now == 4
    assert outcome.stop_reason == "trial budget"


def test_running_again_resumes_the_study_without_measuring_a_config_twice(store):
    database, storage = store
    evaluator = StandInEvaluator()
    first = run_study(session_for(store, evaluator, batch=2), NAIVE, P1024,
                      Budget(trials=6, timeout_s=None, patience=None))
    second = run_study(session_for(store, evaluator, batch=2), NAIVE, P1024,
                       Budget(trials=14, timeout_s=None, patience=None))
    assert first.study_name == second.study_name
    assert (first.measured_now, second.measured_now, second.measured) == (6, 8, 14)
    keys = [config_key(c) for _, c, _ in evaluator.calls]
    assert len(keys) == len(set(keys)) == 14
    assert len(optuna.get_all_study_names(storage)) == 1
    both = measured_params(database, first.run_id) + measured_params(database, second.run_id)
    assert len({config_key(p) for p in both}) == len(both) == 14
    assert second.best_gflops >= first.best_gflops

    # the budget is the study's: a third identical run has nothing left to do
    third = run_study(session_for(store, evaluator), NAIVE, P1024,
                      Budget(trials=14, timeout_s=None, patience=None))
    assert third.measured_now == 0 and third.stop_reason == "trial budget"
    assert len(evaluator.calls) == 14 and third.best_config == second.best_config


class _CompilesOutOfOrder(StandInEvaluator):
    """An asynchronous evaluator whose compiles finish only when waited for, the third
    prepared of those waited on first: a slow compile at the window's head."""

    tickets = 2

    def __init__(self) -> None:
        super().__init__()
        self.done: set = set()
        self.waits = 0

    def ready(self, family, config) -> bool:
        return config_key(config) in self.done

    def wait_any(self, family, configs) -> None:
        self.waits += 1
        configs = list(configs)
        self.done.add(config_key(configs[min(2, len(configs) - 1)]))

    def submit(self, family, config, problem):
        self.done.add(config_key(config))  # (submitted unready: the evaluator waits for it)
        return (family, config, problem)

    def collect(self, ticket):
        return self.evaluate(*ticket)


def test_with_nothing_compiled_the_study_takes_the_first_compile_to_finish_not_the_head(store):
    evaluator = _CompilesOutOfOrder()
    run_study(session_for(store, evaluator, sampler="random", seed=5, batch=4),
              kernels.FAMILIES["blocktile2d"], P1024,
              Budget(trials=6, timeout_s=None, patience=None))
    prepared = [config for _, config in evaluator.prepared]
    assert evaluator.waits >= 1
    assert evaluator.calls[0][1] == prepared[2]  # the head (prepared[0]) waited for no one


def test_rejected_configs_never_reach_the_evaluator_and_are_recorded_with_reasons(store):
    database, _ = store
    evaluator = StandInEvaluator()  # raises AssertionError on a config the family rejects
    outcome = run_study(session_for(store, evaluator, sampler="random", seed=3), BLOCKTILE1D,
                        P1024, Budget(trials=12, timeout_s=None, patience=None))
    assert outcome.measured == 12
    rejected = database.trials(outcome.run_id, state="rejected")
    assert rejected, "blocktile1d rejects ~40% of its space: random sampling must hit some"
    for trial in rejected:
        reasons = BLOCKTILE1D.reject_reasons(trial.params)
        assert reasons and trial.error == "; ".join(reasons)
    assert all(BLOCKTILE1D.accepts(config) for _, config, _ in evaluator.calls)
    assert not evaluator.prepared or all(BLOCKTILE1D.accepts(c) for _, c in evaluator.prepared)


def test_the_default_sampler_learns_to_avoid_rejected_configs(store):
    database, _ = store
    family = kernels.FAMILIES["warptile"]  # a few percent of its space is accepted
    uniform = 1 - sum(1 for _ in family.accepted_configs()) / family.space_size()
    session = session_for(store, StandInEvaluator(), batch=1)
    session.storage = optuna.storages.InMemoryStorage()  # about the sampler, not the storage
    outcome = run_study(session, family, P1024, Budget(trials=16, timeout_s=None,
                                                       patience=None))
    history = database.run_history(outcome.run_id)
    late = history[len(history) // 2:]
    rejected_late = sum(t.state == "rejected" for t in late) / len(late)
    assert outcome.measured == 16
    # uniform sampling would keep rejecting at the space's rate; the sampler must do better
    assert rejected_late < uniform - 0.05, (rejected_late, uniform)


def test_failed_and_wrong_configs_are_recorded_and_never_become_best(store):
    database, _ = store
    states = {1: "wrong_result", 2: "crashed", 4: "timeout", 8: "launch_error"}

    def planted(config):  # the model's favourite BY values misbehave
        return states.get(config["BY"])

    evaluator = StandInEvaluator(fault=planted)
    outcome = run_study(session_for(store, evaluator, seed=5), NAIVE, P1024,
                        Budget(trials=25, timeout_s=None, patience=None))
    assert outcome.measured == 25 and outcome.run_state == "finished"
    history = database.run_history(outcome.run_id)
    for trial in history:
        if trial.params["BY"] in states and trial.state != "rejected":
            assert trial.state == states[trial.params["BY"]]
            assert trial.error == f"stand-in: planted {trial.state}" and trial.gflops is None
    assert {t.state for t in history} & set(states.values()), "no planted fault was sampled"
    assert outcome.best_config is not None and outcome.best_config["BY"] not in states
    best = database.best(evaluator.gpu_name, 1024, 1024, 1024, nearest=False)
    assert best.params["BY"] not in states


def test_patience_stops_a_study_that_no_longer_improves(store):
    evaluator = StandInEvaluator(fault=lambda config: "wrong_result"
                                 if len(evaluator.calls) > 1 else None)
    outcome = run_study(session_for(store, evaluator), NAIVE, P1024,
                        Budget(trials=30, timeout_s=None, patience=4))
    assert outcome.stop_reason == "patience" and outcome.measured == 5


def test_the_best_is_the_fastest_measured_while_patience_needs_a_real_gain():
    """A config 0.3 % faster than the best is the new best (the database says so too), but
    timing noise of that size does not restart the patience count."""
    def known(value: float, state: str = OK) -> _Known:
        stored: Future[int] = Future()
        stored.set_result(0)
        return _Known(stored, state, value, 0.0)

    tally = _Tally()
    for value, state in [(100.0, OK), (200.0, "wrong_result"), (100.3, OK), (99.0, OK)]:
        tally.add(known(value, state), {"V": int(value * 10)})
    assert tally.best is not None and tally.best.value == 100.3
    assert tally.best_config == {"V": 1003}
    assert tally.measured == 4 and tally.since_best == 3
    tally.add(known(101.0), {"V": 1010})  # 0.7 % above the mark of 100: a gain
    assert tally.best_config == {"V": 1010} and tally.since_best == 0


def test_time_budget_stops_a_study(store):
    outcome = run_study(session_for(store, StandInEvaluator()), NAIVE, P1024,
                        Budget(trials=30, timeout_s=1e-6, patience=None))
    assert outcome.stop_reason == "time budget" and outcome.measured_now == 0
    assert outcome.run_state == "finished"


def test_a_small_space_ends_when_every_accepted_config_is_measured(store):
    evaluator = StandInEvaluator()
    outcome = run_study(session_for(store, evaluator, batch=2), SMEM, P1024,
                        Budget(trials=10, timeout_s=None, patience=None))
    assert outcome.stop_reason == "search space exhausted"
    assert sorted(c["TILE"] for _, c, _ in evaluator.calls) == [8, 16, 32]


def test_ctrl_c_stops_between_trials_and_marks_the_run_interrupted(store):
    database, storage = store
    evaluator = StandInEvaluator(interrupt_after=3)  # SIGINT during the third evaluation
    with StopRequest() as stop:
        outcome = run_study(session_for(store, evaluator, batch=3, stop=stop), NAIVE, P1024,
                            Budget(trials=20, timeout_s=None, patience=None))
    assert outcome.run_state == "interrupted" and outcome.measured_now == 3
    assert database.get_run(outcome.run_id).state == "interrupted"
    assert database.count_trials(outcome.run_id)["ok"] == 3  # the trial in hand was kept
    study = optuna.load_study(study_name=outcome.study_name, storage=storage)
    assert not study.get_trials(states=(TrialState.RUNNING,))

    # and the next run picks the study up where it stopped
    again = run_study(session_for(store, StandInEvaluator()), NAIVE, P1024,
                      Budget(trials=5, timeout_s=None, patience=None))
    assert (again.measured, again.measured_now) == (5, 2)


def test_a_new_problem_starts_from_the_best_configs_of_nearby_problems(store):
    tuned = StandInEvaluator()
    near = run_study(session_for(store, tuned), NAIVE, Problem(1024, 1024, 512),
                     Budget(trials=8, timeout_s=None, patience=None))
    far = run_study(session_for(store, tuned), NAIVE, Problem(64, 64, 64),
                    Budget(trials=8, timeout_s=None, patience=None))
    assert near.best_config != far.best_config or pytest.skip("both bests coincide")

    fresh = StandInEvaluator()
    run_study(session_for(store, fresh), NAIVE, P1024, Budget(trials=4, timeout_s=None,
                                                               patience=None))
    # taking turns with the model's picks (docs/search.md, "Warm start"), nearest first
    first_four = [config for _, config, _ in fresh.calls[:4]]
    assert near.best_config in first_four[:2] and far.best_config in first_four


def test_a_new_gpu_starts_from_the_same_problem_tuned_on_another_gpu(store):
    other = StandInEvaluator(gpu_name="Other GPU", gpu_uuid="GPU-other")
    tuned = run_study(session_for(store, other), NAIVE, P1024,
                      Budget(trials=8, timeout_s=None, patience=None))
    here = StandInEvaluator()
    run_study(session_for(store, here), NAIVE, P1024, Budget(trials=2, timeout_s=None,
                                                              patience=None))
    # first, or second after the model's first pick (docs/search.md, "Warm start")
    assert tuned.best_config in [config for _, config, _ in here.calls[:2]]


def test_tune_all_measures_each_baseline_once_and_summarises_the_best_per_shape(store):
    database, _ = store
    evaluator = StandInEvaluator()
    problems = [Problem(512, 512, 512), Problem(1023, 1025, 999)]
    summary = tune_all(session_for(store, evaluator), [NAIVE, SMEM], problems,
                       Budget(trials=4, timeout_s=None, patience=None), total_seconds=60)
    assert evaluator.baselines == problems
    assert len(summary.outcomes) == 4 and not summary.interrupted
    for problem in problems:
        problem_id = database.ensure_problem(problem.m, problem.n, problem.k)
        baseline = database.latest_baseline(database.list_gpus()[0].id, problem_id)
        assert baseline is not None and baseline.gflops == summary.baselines[problem].gflops
    table = summary.table()
    assert "512x512x512" in table and "1023x1025x999" in table and "of cuBLAS" in table
    for problem in problems:
        family, outcome = summary.best(problem)
        fraction = outcome.best_gflops / summary.baselines[problem].gflops
        assert f"{fraction:.2f}" in table and family.name in table


@pytest.mark.parametrize("sampler", ["default", "model", "prior", "hybrid", "tpe", "random",
                                     "cmaes", "gp"])
def test_every_sampler_runs_a_study_without_measuring_a_config_twice(store, sampler):
    from tuner.search.choices import missing_packages

    if missing_packages(sampler):
        pytest.skip(f"--sampler {sampler} needs {missing_packages(sampler)}")
    evaluator = StandInEvaluator()
    outcome = run_study(session_for(store, evaluator, sampler=sampler, batch=2), NAIVE, P1024,
                        Budget(trials=8, timeout_s=None, patience=None))
    assert outcome.measured == 8 and outcome.best_gflops > 0
    keys = [config_key(c) for _, c, _ in evaluator.calls]
    assert len(keys) == len(set(keys)) == 8
    database, _ = store
    # the run records the set-up it ran: the default is the model on naive's listed space
    ran = "model" if sampler == "default" else sampler
    assert database.get_run(outcome.run_id).sampler == ran


def test_the_default_sampler_is_the_model_where_the_space_is_listed_else_the_prior_set_up(
        store, tmp_path, monkeypatch):
    from tuner.search import study as study_module
    from tuner.search.learned import ModelSampler
    from tuner.search.samplers import FeasibleSampler

    database, _ = store
    session = session_for(store, StandInEvaluator(), batch=2, compile_cache=tmp_path / "c1")
    listed = study_module.StudyRun(session, NAIVE, P1024,
                                   Budget(trials=4, timeout_s=None, patience=None), None)
    assert listed.sampler == "model" and isinstance(listed.study.sampler, ModelSampler)
    # a space too large to list (the limit patched down: no shipped family is over it)
    # runs the prior set-up
    monkeypatch.setattr(study_module, "ENUMERABLE_SPACE", 10)
    session = session_for(store, StandInEvaluator(), batch=2, compile_cache=tmp_path / "c2")
    outcome = run_study(session, NAIVE, P1024, Budget(trials=4, timeout_s=None, patience=None))
    assert outcome.measured == 4
    assert database.get_run(outcome.run_id).sampler == "prior"
    too_large = study_module.StudyRun(session, NAIVE, Problem(512, 512, 512),
                                      Budget(trials=4, timeout_s=None, patience=None), None)
    assert too_large.sampler == "prior" and isinstance(too_large.study.sampler, FeasibleSampler)


def test_the_prior_ranks_enough_startup_configs_for_the_window(store, monkeypatch):
    """With batch candidates in flight, batch - 1 asks come before the start-up's results: the
    prior ranks that many more configs (not left to uniform draws)."""
    from tuner.search import prior
    from tuner.search.samplers import STARTUP_TRIALS

    counts = []
    real = prior.startup_configs

    def spy(*args, **kwargs):
        counts.append(args[6])  # count
        return real(*args, **kwargs)

    monkeypatch.setattr(prior, "startup_configs", spy)
    run_study(session_for(store, StandInEvaluator(), batch=5, prior_compiles=0), BLOCKTILE1D,
              P1024, Budget(trials=8, timeout_s=None, patience=None))
    assert counts == [STARTUP_TRIALS + 4]


def test_a_family_not_offered_on_the_gpus_architecture_gets_no_study(store, caplog):
    class Ampere(StandInEvaluator):
        def arch(self) -> str:
            return "sm_80"

    evaluator = Ampere()
    wgmma = kernels.get_family("wgmma")
    with caplog.at_level("WARNING"):
        summary = tune_all(session_for(store, evaluator), [NAIVE, wgmma], [P1024],
                           Budget(trials=3, timeout_s=None, patience=None))
    assert [family.name for _, family, _ in summary.outcomes] == ["naive"]
    assert all(config in NAIVE.accepted_configs("sm_80") for _, config, _ in evaluator.calls)
    assert any("wgmma skipped" in r.message and "sm_90" in r.message and "sm_80" in r.message
               for r in caplog.records)


def test_the_priors_compiles_are_prepared_only_for_studies_that_will_start_from_it(store,
                                                                                  monkeypatch):
    """The learned model starts from the static prior only where it has measured nothing of the
    family on another shape or GPU: a study whose family an earlier shape of the command or the
    database already holds gets no prior ranking prepared ahead (its compiles would be wasted);
    the prior set-up always starts from it."""
    from tuner.run.session import _prior_wanted
    from tuner.search import study as study_module

    evaluator = StandInEvaluator()
    run_study(session_for(store, evaluator, batch=2), BLOCKTILE1D, Problem(96, 80, 72),
              Budget(trials=2, timeout_s=None, patience=None))  # in the database: another shape
    other = Problem(512, 512, 512)
    order = [(P1024, NAIVE), (P1024, BLOCKTILE1D), (other, NAIVE), (other, BLOCKTILE1D)]

    def plan(sampler: str) -> list[bool]:
        wanted = _prior_wanted(session_for(store, evaluator, sampler=sampler), order)
        return [wanted(family, problem) for problem, family in order]

    assert plan("model") == plan("default") == [True, False, False, False]
    assert plan("prior") == plan("hybrid") == [True, True, True, True]
    assert plan("random") == [False] * 4
    monkeypatch.setattr(study_module, "ENUMERABLE_SPACE", 10)  # the default runs the prior set-up
    assert plan("default") == [True] * 4


H100 = "NVIDIA H100 80GB HBM3"  # the GPU model of most bundled recordings


def test_a_live_run_learns_each_family_the_bundled_recordings_of_its_gpu_model_hold(store):
    """The bundled recordings of the session's GPU model are examples like the database's: a
    family they hold at another shape starts from the model, not the prior (whose compiles are
    then never prepared); a replay (its recording may be a bundled one) does not learn from
    them, nor does a GPU model that has none."""
    from tuner.run.session import _prior_wanted
    from tuner.run.tune import Stores, new_session
    from tuner.run.options import SearchOptions
    from tuner.measure.replay import ReplayEvaluator
    from tuner.measure.recording import BUNDLED_RECORDINGS

    database, storage = store
    tf32x3, warptile = kernels.FAMILIES["tf32x3"], kernels.FAMILIES["warptile"]
    square, recorded = Problem(1792, 2304, 1536), Problem(2048, 2048, 2048)
    order = [(square, NAIVE), (square, tf32x3), (recorded, warptile)]

    def plan(gpu_name: str, recordings: bool) -> list[bool]:
        session = Session(database=database, evaluator=StandInEvaluator(), storage=storage,
                          gpu_id=1, gpu_name=gpu_name, progress=False,
                          learn_from_recordings=recordings)
        wanted = _prior_wanted(session, order)
        return [wanted(family, problem) for problem, family in order]

    # warptile at 2048³: its own recorded shape is held out, its 1024³ and 1023x1025x999 are not
    assert plan(H100, True) == [True, False, False]
    assert plan(H100, False) == plan("Stand-in GPU", True) == [True, True, True]

    stores = Stores(database, storage, False, 30.0, 300.0)

    def learns(evaluator) -> bool:
        return new_session(stores, evaluator, (1, H100), SearchOptions(), compile_cache=None,
                           command="test", stop=StopRequest()).learn_from_recordings

    assert learns(StandInEvaluator())
    assert not learns(ReplayEvaluator.open(BUNDLED_RECORDINGS / "h100-tf32x3-3000x3000x3000.json.gz"))


def test_a_live_model_study_measures_its_window_while_its_first_fit_runs(store, monkeypatch):
    """Where the evaluator measures while the study goes on (a GPU child), the first fit of the
    study's own measurements (after the static prior's start-up; the stand-in has no examples)
    runs on the fit thread, and the study hands the evaluator its window meanwhile: answers are
    collected while that fit runs, instead of after it with the GPU idle. Every config is
    measured once, and the budget is measured."""
    import functools
    import threading
    import time
    from dataclasses import dataclass

    from tuner.search import costmodel

    fitting, during, fitted_on = threading.Event(), [], []

    @dataclass
    class Measuring(StandInEvaluator):  # measures while its caller goes on, as a GPU child does
        def submit(self, family, config, problem):
            return functools.partial(self.evaluate, family, config, problem)

        def collect(self, ticket):
            if fitting.is_set():
                during.append(threading.current_thread().name)
            return ticket()

    real = costmodel.CostModel.fit

    def fit(model):  # the first fit lasts until three answers came meanwhile (or 20 s)
        fitted_on.append(threading.current_thread().name)
        fitting.set()
        deadline = time.monotonic() + 20
        while len(during) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        fitting.clear()
        return real(model)

    monkeypatch.setattr(costmodel.CostModel, "fit", fit)
    evaluator = Measuring()
    outcome = run_study(session_for(store, evaluator, sampler="model", seed=3,
                                    batch=8),
                        kernels.get_family("vectorized"), Problem(1536, 1792, 2048),
                        Budget(trials=20, timeout_s=None, patience=None))
    assert fitted_on and fitted_on[0].startswith("costmodel-fit")
    assert len(during) >= 3 and set(during) == {threading.current_thread().name}
    keys = [config_key(config) for _, config, _ in evaluator.calls]
    assert len(keys) == len(set(keys)) == outcome.measured == 20


def test_a_model_study_offers_its_foreseen_asks_for_compiling_ahead_and_asks_the_same(tmp_path):
    """Where the evaluator compiles ahead (a live one), a study run by the model offers it,
    after each fit, the configs its sampler foresees asking next (ModelSampler.upcoming), none
    measured or in flight then; it goes on to ask for most of them, and asks exactly what it
    asks where nothing is compiled ahead."""
    from dataclasses import dataclass, field

    @dataclass
    class CompilesAhead(StandInEvaluator):
        offered: list[tuple[int, dict[str, int]]] = field(default_factory=list)

        def compile_ahead(self, family, configs) -> int:
            for config in configs:
                self.offered.append((len(self.calls), dict(config)))
            return 0

    vectorized = kernels.get_family("vectorized")
    runs = []
    for evaluator in (StandInEvaluator(), CompilesAhead()):
        database = db.open_database(f"sqlite:///{tmp_path / f'{len(runs)}.sqlite'}")
        store = database, optuna.storages.RDBStorage(database.url)
        session = session_for(store, evaluator, sampler="model", seed=3, batch=8)
        run_study(session, vectorized, Problem(1536, 1792, 2048),
                  Budget(trials=40, timeout_s=None, patience=None))
        database.close()
        runs.append([config for _, config, _ in evaluator.calls])
    plain, ahead = runs
    assert ahead == plain  # the same asks, in the same order
    offered = evaluator.offered
    assert len(offered) >= 8
    for evaluated, config in offered:  # not measured when offered
        assert config_key(config) not in {config_key(c) for c in ahead[:evaluated]}
    # foreseen, not guessed: of 4,192 accepted configs a fifth of those offered are asked for
    # later (the refits between reorder the rest)
    distinct = {config_key(c) for _, c in offered}
    asked_later = distinct & {config_key(c) for c in ahead}
    assert len(asked_later) >= len(distinct) // 5, (len(asked_later), len(distinct))
