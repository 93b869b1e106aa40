"""Issue 19: the next study's start-up prepared in a child process while one runs
(tuner.search.prefetch) is the start-up the study computes itself; the process is accounted for
(phase startup_bg) and ends with the command, however it ends. Real NVRTC compiles, no GPU."""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import db
import kernels
from kernels.compiler import cached_config
import numpy as np
import optuna
import pytest

from tuner.measure.live import LiveEvaluator
from tuner.measure.phases import STARTUP_BG, Phases
from tuner.problem import Problem
from tuner.run import session as run_session
from tuner.search import prior
from tuner.search.costmodel import matrix
from tuner.search import prefetch as prefetch_module
from tuner.search.prefetch import StartupPrefetch
from tuner.measure.recording import BUNDLED_RECORDINGS, load
from tuner.search import space
from tuner.search.learned import (LearnedSpace, ModelSampler, bundled_examples,
                                  examples_for_study, examples_from_recordings, first_picks)
from tuner.search.study import Budget, Session, _accepted_configs, _enumerate, _rank, _seed_for

BLOCKTILE1D = kernels.get_family("blocktile1d")  # 284 accepted configs, one group each
NAIVE = kernels.get_family("naive")
SMEM = kernels.get_family("smem")
PROBLEM = Problem(256, 256, 256)
COMPILES = 3  # the prior's compiles per study here (48 on a GPU host: minutes on CI's cores)


class _Evaluator:
    """What the prefetch and tune_all read of an evaluator, without a GPU child."""

    pool = None  # a live evaluator's compile pool (new_session turns prefetching on for it)

    def info(self) -> dict[str, Any]:
        return {"sm_count": 132}

    def arch(self) -> str:
        return "sm_90"

    def set_problem(self, problem: Problem) -> None:
        pass

    def baseline(self) -> Any:
        raise RuntimeError("no cuBLAS here")


def _session(evaluator: Any, cache: Path, **fields: Any) -> Session:
    # training: the model's examples of other problems (none here: no database to read)
    defaults: dict[str, Any] = dict(database=None, storage=None, gpu_id=1, phases=Phases(),
                                    training=[], gpu_name="test")
    return Session(evaluator=evaluator, batch=4, seed=7, progress=False,
                   prior_compiles=COMPILES, compile_cache=cache, **(defaults | fields))


def _pool_workers() -> list[mp.process.BaseProcess]:
    """The preparing process (the evaluator's compile pool is its own, closed before)."""
    return [p for p in mp.active_children() if p.name.startswith("SpawnProcess")]


def test_a_prefetched_startup_is_the_one_the_study_computes(tmp_path):
    session = _session(_Evaluator(), tmp_path / "cubins")
    with StartupPrefetch(session) as prefetch:
        prefetch.plan([(BLOCKTILE1D, PROBLEM)])
        assert prefetch.take(NAIVE, PROBLEM) is None  # not the one prepared: computed anew
        prefetch.plan([(BLOCKTILE1D, PROBLEM)])
        prepared = prefetch.take(BLOCKTILE1D, PROBLEM)
        assert prefetch.take(BLOCKTILE1D, PROBLEM) is None  # taken once
    assert not _pool_workers()
    assert prepared is not None and session.phases.counts[STARTUP_BG] == 1
    here = _enumerate(BLOCKTILE1D, "sm_90", PROBLEM, "prior")
    ranked, ranking = _rank(BLOCKTILE1D, "sm_90", PROBLEM, here, 132, session.batch,
                            session.seed, COMPILES,
                            prior.compiled_usage(BLOCKTILE1D, "sm_90", tmp_path / "cubins"))
    assert prepared.accepted == here.accepted and prepared.groups == here.groups
    assert prepared.ranked == ranked and prepared.ranking.compiled == ranking.compiled == COMPILES


def test_the_model_samplers_prior_start_up_is_prepared_ahead_too(tmp_path):
    """--sampler model (and the default, which is the model where the space is listed) starts
    from the static prior where it has not learned the family elsewhere: that ranking, with its
    compiles, is prepared in the process, not on the main thread when the study begins."""
    for sampler in ("model", "default"):
        session = _session(_Evaluator(), tmp_path / sampler, sampler=sampler)
        with StartupPrefetch(session) as prefetch:
            prefetch.plan([(BLOCKTILE1D, PROBLEM)])
            prepared = prefetch.take(BLOCKTILE1D, PROBLEM)
        here, ranked = _fresh(BLOCKTILE1D, tmp_path / sampler, session)
        assert prepared is not None and prepared.ranked == ranked, sampler
        assert prepared.ranking.compiled == COMPILES
        # and the cost model's feature rows of every accepted config, off the main thread
        assert prepared.features is not None and np.array_equal(
            prepared.features, matrix(BLOCKTILE1D, here.accepted, PROBLEM,
                                      prior.Target(132, "sm_90")), equal_nan=True)


def test_a_start_up_the_study_will_not_take_from_the_prior_is_enumerated_only(tmp_path):
    session = _session(_Evaluator(), tmp_path / "cubins", sampler="model")
    with StartupPrefetch(session) as prefetch:
        prefetch.plan([(BLOCKTILE1D, PROBLEM)], rank=lambda family, problem: False)
        prepared = prefetch.take(BLOCKTILE1D, PROBLEM)
    assert prepared is not None and prepared.accepted == _enumerate(
        BLOCKTILE1D, "sm_90", PROBLEM, "model").accepted
    assert prepared.ranked is None and prepared.ranking.compiled == 0
    assert not list((tmp_path / "cubins").glob("*.cubin"))  # nothing compiled


def _fresh(family: Any, cache: Path, session: Session) -> tuple[Any, Any]:
    here = _enumerate(family, "sm_90", PROBLEM, "prior")
    ranked, _ = _rank(family, "sm_90", PROBLEM, here, 132, session.batch, session.seed,
                      COMPILES, prior.compiled_usage(family, "sm_90", cache))
    return here, ranked


def _assert_each_is_the_studys_own(studies: list, prepared: list, cache: Path, session: Session) -> None:
    for (family, _), startup in zip(studies, prepared):
        here, ranked = _fresh(family, cache, session)
        assert startup is not None and startup.accepted == here.accepted
        assert startup.groups == here.groups and startup.ranked == ranked


def test_the_process_works_through_the_planned_studies_in_order_a_few_ahead(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(prefetch_module, "AHEAD", 2)
    session = _session(_Evaluator(), tmp_path / "cubins")
    studies = [(NAIVE, PROBLEM), (BLOCKTILE1D, PROBLEM), (SMEM, PROBLEM)]
    with StartupPrefetch(session) as prefetch:
        prefetch.plan(studies)
        jobs = list(prefetch._jobs.values())  # submitted: AHEAD of them, in order
        assert list(prefetch._jobs) == [("naive", PROBLEM), ("blocktile1d", PROBLEM)]
        jobs[-1].result(timeout=300)  # the second prepared without the first being taken
        prepared = [prefetch.take(family, problem) for family, problem in studies]
    assert not _pool_workers() and session.phases.counts[STARTUP_BG] == 3
    _assert_each_is_the_studys_own(studies, prepared, tmp_path / "cubins", session)


def test_one_start_up_is_prepared_at_once_per_eight_cores():
    from tuner.search import preparer

    assert [preparer.processes(c) for c in (1, 2, 7, 8, 16, 31, 32, 128)] == [1, 1, 1, 1, 2, 3, 4, 4]


def test_two_preparing_processes_prepare_the_start_ups_each_study_computes(tmp_path):
    """As a host of 16 cores runs it: two processes, each start-up the study's own."""
    from tuner.search import preparer

    session = _session(_Evaluator(), tmp_path / "cubins", prefetch_process=preparer.start(workers=2))
    studies = [(NAIVE, PROBLEM), (BLOCKTILE1D, PROBLEM), (SMEM, PROBLEM)]
    with StartupPrefetch(session) as prefetch:
        prefetch.plan(studies)
        for job in list(prefetch._jobs.values()):
            job.result(timeout=300)
        assert len(_pool_workers()) == 2  # the second spawned once there was work for it
        prepared = [prefetch.take(family, problem) for family, problem in studies]
    assert not _pool_workers() and session.phases.counts[STARTUP_BG] == 3
    _assert_each_is_the_studys_own(studies, prepared, tmp_path / "cubins", session)


def test_a_killed_preparing_process_leaves_the_studies_to_compute_their_own(tmp_path):
    with StartupPrefetch(_session(_Evaluator(), tmp_path / "cubins")) as prefetch:
        prefetch.plan([(BLOCKTILE1D, PROBLEM)])
        for process in _pool_workers():
            process.kill()
        assert prefetch.take(BLOCKTILE1D, PROBLEM) is None
        prefetch.plan([(BLOCKTILE1D, PROBLEM)])  # not again
        assert prefetch.take(BLOCKTILE1D, PROBLEM) is None and not _pool_workers()


def test_a_preparing_process_started_by_the_command_prepares_the_start_ups(tmp_path):
    """The command starts the preparing process beside its GPU child (tuner.search.preparer):
    the prefetch takes that process over instead of starting one, prepares the same start-up
    in it, and ends it; one never taken over is ended too."""
    from tuner.search import preparer

    started = preparer.start()
    assert len(_pool_workers()) == 1
    session = _session(_Evaluator(), tmp_path / "cubins", prefetch_process=started)
    with StartupPrefetch(session) as prefetch:
        prefetch.plan([(BLOCKTILE1D, PROBLEM)])
        assert prefetch._executor is started and len(_pool_workers()) == 1
        prepared = prefetch.take(BLOCKTILE1D, PROBLEM)
    assert not _pool_workers()
    here = _enumerate(BLOCKTILE1D, "sm_90", PROBLEM, "prior")
    assert prepared is not None and prepared.accepted == here.accepted
    untaken = preparer.start()
    with StartupPrefetch(_session(_Evaluator(), tmp_path / "cubins", prefetch_process=untaken)):
        pass
    assert not _pool_workers()


def test_an_interrupted_command_ends_the_preparing_process(tmp_path, monkeypatch):
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    session = _session(_Evaluator(), tmp_path / "cubins", prefetch_startup=True,
                       database=database)
    started: list[int] = []

    class Interrupted:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def run(self, *args: Any) -> None:
            started.append(len(_pool_workers()))  # the next study's start-up is being prepared
            raise KeyboardInterrupt

    monkeypatch.setattr(run_session, "StudyRun", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_session.tune_all(session, [NAIVE, BLOCKTILE1D], [PROBLEM],
                             Budget(trials=2, timeout_s=None, patience=None))
    assert started == [1] and not _pool_workers()


def _live_session(evaluator: LiveEvaluator, database: Any, cache: Path, **fields: Any
                  ) -> Session:
    """A session of the stand-in GPU child with a real results database and Optuna storage."""
    return _session(evaluator, cache, database=database,
                    storage=optuna.storages.RDBStorage(database.url), warm_start=False,
                    gpu_id=database.ensure_gpu(db.GpuInfo(**evaluator.info())),
                    phases=evaluator.phases, **fields)


def _startups_logged(tmp_path: Path, folder: str, prefetch: bool,
                     caplog: pytest.LogCaptureFixture) -> list[str]:
    """tune_all over naive and blocktile1d on the stand-in GPU child: the start-ups logged."""
    (tmp_path / folder).mkdir()
    database = db.open_database(f"sqlite:///{tmp_path / folder / 'gemmtune.sqlite'}")
    caplog.clear()
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1,
                       backend="tuner.testing") as evaluator, \
            caplog.at_level(logging.INFO, logger="tuner.search.study"):
        session = _live_session(evaluator, database, tmp_path / "cubins",
                                prefetch_startup=prefetch)
        summary = run_session.tune_all(session, [NAIVE, BLOCKTILE1D], [PROBLEM],
                                       Budget(trials=2, timeout_s=60, patience=None))
        assert len(summary.outcomes) == 2
        # both start-ups prepared ahead: the second in the process, the first on a thread
        # beside the baseline
        assert evaluator.phases.counts.get(STARTUP_BG, 0) == (2 if prefetch else 0)
    assert not _pool_workers()
    database.close()
    return [r.getMessage().split(" in ")[0] + r.getMessage().split("):")[1]
            for r in caplog.records if "start-up from the static prior" in r.getMessage()]


def test_the_compile_pools_usage_is_the_priors_own(tmp_path):
    """The command's first start-up ranks with the compile processes' reports
    (``CompilePool.usage``): the same Usage as NVRTC on this process's threads, and None for a
    config the family rejects."""
    configs = _accepted_configs(NAIVE, "sm_90")[:3]
    with LiveEvaluator(0, cache_dir=tmp_path / "pool", workers=1,
                       backend="tuner.testing") as evaluator:
        pooled = evaluator.pool.usage(NAIVE)
        assert pooled({"BX": 128, "BY": 32, "COALESCED": 1}) is None  # 4096 threads: rejected
        from_pool = [pooled(c) for c in configs]
    here = prior.compiled_usage(NAIVE, "sm_90", tmp_path / "here")
    assert from_pool == [here(c) for c in configs] and all(u is not None for u in from_pool)


def test_tune_all_prepares_the_next_start_up_ahead_with_the_same_result(tmp_path, caplog):
    ahead = _startups_logged(tmp_path, "ahead", True, caplog)
    here = _startups_logged(tmp_path, "here", False, caplog)
    assert len(ahead) == 2 and ahead == here


def test_the_models_first_fit_is_made_ahead_and_is_the_one_the_sampler_makes_itself(tmp_path):
    """Where the model learns the family from other problems, its first fit (0.4-1.2 s of the
    main thread per study at 2048³) is made in the process: the scores the sampler starts from
    are those its first ask would have fitted; a study whose examples differ (the command
    measured another shape since) or whose seed differs fits on its own."""
    skinny = kernels.get_family("skinny")
    problem = Problem(9, 4096, 2048)  # no recording holds it
    examples = examples_from_recordings([load(BUNDLED_RECORDINGS / "h100-skinny-16x4096x4096+7x11008x4096.json.gz")])
    session = _session(_Evaluator(), tmp_path / "cubins", sampler="default", training=examples)
    with StartupPrefetch(session) as prefetch:
        prefetch.plan([(skinny, problem)], rank=lambda family, problem: False)
        prepared = prefetch.take(skinny, problem)
        assert prepared is not None and prepared.fitted is not None
        # the examples reached the process through one file, written once for the problem
        (shipped,) = prefetch._examples_files.values()
        assert Path(shipped.path).is_file() and prefetch._examples_file(problem) is shipped
        folder = Path(prefetch._folder)
        assert prepared.fitted.scores is not None and len(prepared.fitted.scores) == len(
            prepared.accepted)
        # and the model's first window (batch 4) is being compiled in the process, niced
        picks = [prepared.accepted[row] for row in
                 first_picks(prepared.features, prepared.fitted.scores, session.batch)]
        deadline = time.monotonic() + 120
        while (time.monotonic() < deadline
               and not all(cached_config(skinny, c, "sm_90", tmp_path / "cubins") for c in picks)):
            time.sleep(0.2)
    assert len(picks) == 4 and all(cached_config(skinny, c, "sm_90", tmp_path / "cubins")
                                   for c in picks)
    assert not folder.exists()  # removed with the processes
    programs = {skinny.program(c) for c in picks}  # launch-time parameters share one
    assert len(list((tmp_path / "cubins").rglob("*.cubin"))) == len(programs)  # nothing else

    positions = space.params_from_configs(skinny, prepared.accepted)
    distributions = space.distributions(skinny)
    seed = _seed_for(session.seed, 0)
    ahead = ModelSampler(LearnedSpace(positions, prepared.features, examples, "skinny",
                                      prepared.fitted), distributions, [], seed)
    here = ModelSampler(LearnedSpace(positions, prepared.features, examples, "skinny"),
                        distributions, [], seed)
    assert here.scores is None
    here._refit([])  # what its first ask does
    assert ahead.scores is not None and np.array_equal(ahead.scores, here.scores)
    assert (ahead.fits, ahead.fitted_on) == (here.fits, here.fitted_on) == (1, 0)

    with pytest.raises(ValueError, match="other examples or another seed"):
        ModelSampler(LearnedSpace(positions, prepared.features, examples[:-1], "skinny",
                                  prepared.fitted), distributions, [], seed)
    with pytest.raises(ValueError, match="other examples or another seed"):
        ModelSampler(LearnedSpace(positions, prepared.features, examples, "skinny",
                                  prepared.fitted), distributions, [], seed + 1)


def test_the_bundled_examples_are_written_once_and_each_problem_reads_its_own(tmp_path):
    """The preparing processes read a problem's examples as its study does
    (``examples_for_study``: the results database's, then the GPU model's bundled recordings less
    the problem's shape), from two files: the bundled examples, written once for the command,
    and the database's of the problem. (All of them written again for each shape held the main
    thread 0.9 s at every shape change, the GPU idle.)"""
    h200 = "NVIDIA H200"
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    gpu_id = database.ensure_gpu(db.GpuInfo(h200, "GPU-0", "9.0", 132, 141 << 30, 1980,
                                            "test", "test", "test"))
    stored = Problem(384, 384, 384)
    run_id = database.start_run(
        gpu_id=gpu_id, problem_id=database.ensure_problem(384, 384, 384),
        family_id=database.ensure_family(NAIVE.name, NAIVE.source_hash), sampler="default",
        seed=1, budget={"trials": 2}, host="test", command="test", study_name=None)
    for number, config in enumerate(NAIVE.sample_accepted(2, seed=3)):
        database.add_trial(run_id, db.TrialRecord(number=number, params=config, state="ok",
                                                  time_median_ms=1.0, gflops=100.0 + number))
    recorded = Problem(2048, 2816, 2304)  # a shape of the H200's bundled pipelined recordings
    session = _session(_Evaluator(), tmp_path / "cubins", database=database, gpu_name=h200,
                       training=None, sampler="default", learn_from_recordings=True)
    with StartupPrefetch(session) as prefetch:
        files = {problem: prefetch._examples_file(problem) for problem in (recorded, stored)}
        for problem, file in files.items():
            read = file.read()
            assert read == examples_for_study(database, h200, problem, True)
            assert read == prefetch._examples(problem)
        assert len(files[recorded].read()) < len(bundled_examples(h200)) + 2  # its shape held out
        assert len(files[stored].read()) == len(bundled_examples(h200))  # its own trials held out
        assert files[recorded].bundled == files[stored].bundled  # one file for both
        assert len(list(Path(prefetch._folder).iterdir())) == 3
        assert [e.problem for e in prefetch_module._read_examples(files[recorded].path)] == [
            stored, stored]
    database.close()


def test_a_shapes_start_ups_are_planned_at_its_start_with_the_shapes_before_as_examples(
        tmp_path, caplog, monkeypatch):
    """Two shapes of one family in one command: the second shape's start-up is prepared once the
    first shape's trials are stored and re-timed, so its fit is of the examples its study reads
    and the study uses it (prepared a shape ahead, it was of fewer examples and the study fitted
    again on the main thread, at every study of every later shape)."""
    events: list[tuple[str, Problem]] = []
    settle, prepare_here = run_session.Summary.settle, StartupPrefetch.prepare_here

    def settled(summary: run_session.Summary, session: Session, problem: Problem) -> None:
        events.append(("re-timed", problem))
        settle(summary, session, problem)

    def here(prefetch: StartupPrefetch, family: Any, problem: Problem, rank: bool) -> None:
        events.append(("planned", problem))
        prepare_here(prefetch, family, problem, rank)

    monkeypatch.setattr(run_session.Summary, "settle", settled)
    monkeypatch.setattr(StartupPrefetch, "prepare_here", here)
    second = Problem(192, 160, 128)
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1,
                       backend="tuner.testing") as evaluator, \
            caplog.at_level(logging.INFO, logger="tuner.search.study"):
        session = _live_session(evaluator, database, tmp_path / "cubins", prefetch_startup=True,
                                training=None, sampler="default", retime_rounds=2)
        summary = run_session.tune_all(session, [NAIVE], [PROBLEM, second],
                                       Budget(trials=6, timeout_s=60, patience=None))
    database.close()
    assert [o.measured for _, _, o in summary.outcomes] == [6, 6]
    assert summary.retimed > 0
    assert events == [("planned", PROBLEM), ("re-timed", PROBLEM), ("planned", second),
                      ("re-timed", second)]
    assert evaluator.phases.counts.get(STARTUP_BG, 0) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any("learns from 6 measured configs of other problems (6 of naive;" in m
               for m in messages)
    assert not any("fit prepared ahead is of other examples" in m for m in messages)


def test_a_study_whose_examples_grew_since_its_fit_was_prepared_fits_its_own(tmp_path, caplog):
    """A start-up prepared before another problem's trials were stored (another worker sharing
    the database, here a command run in between): the prepared fit is set aside and the study
    fits on the examples it reads at its start."""
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    later = Problem(192, 160, 128)
    budget = Budget(trials=6, timeout_s=60, patience=None)
    with LiveEvaluator(0, cache_dir=tmp_path / "cubins", workers=1,
                       backend="tuner.testing") as evaluator, \
            caplog.at_level(logging.INFO, logger="tuner.search.study"):
        session = _live_session(evaluator, database, tmp_path / "cubins", prefetch_startup=True,
                                training=None, sampler="default")
        with StartupPrefetch(session) as prefetch:
            prefetch.plan([(NAIVE, later)])
            prepared = prefetch.take(NAIVE, later)  # of an empty database
        assert prepared is not None and prepared.fitted is not None
        run_session.tune_all(session, [NAIVE], [PROBLEM], budget)  # 6 trials stored meanwhile
        evaluator.set_problem(later)
        outcome = run_session.StudyRun(session, NAIVE, later, budget, None, prepared).run()
    database.close()
    assert outcome.measured == 6
    assert any("fit prepared ahead is of other examples" in r.getMessage()
               for r in caplog.records)


def test_a_start_up_lays_each_accepted_config_out_once(tmp_path, monkeypatch):
    """The prior's groups and the model's feature rows read the same launch geometries: computed
    once per accepted config (split-K's 214,440 took 3 s each time on the 2-core machine), and
    not carried in the start-up handed over."""
    from tuner.search import study

    calls = []
    real = prior.geometry
    monkeypatch.setattr(prior, "geometry", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    startup = study.prepare_startup("blocktile1d", "sm_90", PROBLEM, "default", 132, 4, 7, 0,
                                    str(tmp_path / "cubins"), rank=True, examples=[])
    accepted = len(startup.accepted)
    assert startup.groups is not None and startup.features is not None and len(startup.features) == accepted
    assert len(calls) == accepted and startup.geometries is None
    here = matrix(kernels.bind(BLOCKTILE1D, PROBLEM.layout, PROBLEM.batch), startup.accepted, PROBLEM,
                  prior.Target(132, "sm_90"))
    assert np.array_equal(startup.features, here, equal_nan=True)  # the rows laid out anew
