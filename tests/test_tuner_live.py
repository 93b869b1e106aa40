"""The live evaluator's machinery on CPU: real NVRTC compiles in the spawn pool, a real GPU
child process — running the stand-in bench (tuner.measure.testing) instead of tuner.measure.gpu — that faults,
hangs and dies, and is replaced each time."""

from __future__ import annotations

import hashlib
import time

import db
import kernels
import optuna
import pytest

from tuner.measure.live import GpuUnavailable, LiveEvaluator
from tuner.measure.testing import (PLANTED_COMPILE_ERROR, PLANTED_ILLEGAL_ADDRESS,
                                   PLANTED_INFINITE_LOOP, PLANTED_OK, PlantedFamily)
from tuner.problem import Problem
from tuner.search.study import Budget, Session, run_study

PLANTED = PlantedFamily()
SMALL = Problem(64, 48, 32)
TRIAL_TIMEOUT_S = 3.0


def cubin_digest(mode: int, cache) -> str:
    compiled = kernels.compile_config(PLANTED, {"MODE": mode}, cache_dir=cache)
    return hashlib.sha256(compiled.cubin).hexdigest()


@pytest.fixture
def planted_evaluator(tmp_path):
    cache = tmp_path / "cubins"
    faults = {cubin_digest(PLANTED_ILLEGAL_ADDRESS, cache): "fault",
              cubin_digest(PLANTED_INFINITE_LOOP, cache): "hang"}
    evaluator = LiveEvaluator(0, cache_dir=cache, workers=2, trial_timeout_s=TRIAL_TIMEOUT_S,
                              backend="tuner.testing", backend_options={"faults": faults})
    yield evaluator
    evaluator.close()


def test_a_fault_or_a_hang_is_recorded_and_the_gpu_process_replaced(planted_evaluator):
    evaluator = planted_evaluator
    evaluator.set_problem(SMALL)
    ok = evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL)
    assert ok.state == "ok" and ok.gflops > 0 and ok.registers > 0 and 0 < ok.occupancy <= 1
    first_pid = evaluator.child.process.pid

    crashed = evaluator.evaluate(PLANTED, {"MODE": PLANTED_ILLEGAL_ADDRESS}, SMALL)
    assert crashed.state == "crashed" and "ILLEGAL_ADDRESS" in crashed.error
    second_pid = evaluator.child.process.pid
    assert second_pid != first_pid

    started = time.monotonic()
    hung = evaluator.evaluate(PLANTED, {"MODE": PLANTED_INFINITE_LOOP}, SMALL)
    assert hung.state == "timeout" and f"{TRIAL_TIMEOUT_S:g} s" in hung.error
    assert TRIAL_TIMEOUT_S <= time.monotonic() - started < TRIAL_TIMEOUT_S + 30
    assert evaluator.child.process.pid != second_pid and evaluator.replacements == 2

    # the fresh process was given the problem again (the stand-in refuses to time without one)
    assert evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL).state == "ok"

    broken = evaluator.evaluate(PLANTED, {"MODE": PLANTED_COMPILE_ERROR}, SMALL)
    assert broken.state == "compile_error" and "planted compile error" in broken.error
    assert evaluator.replacements == 2  # a compile error never touches the GPU process


def test_a_gpu_process_that_dies_is_recorded_as_crashed(tmp_path):
    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       backend_options={"faults": {"k": "exit"}}) as evaluator:
        result = evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL)
        assert result.state == "crashed" and "exit code 3" in result.error
        assert evaluator.replacements == 1 and evaluator.child.process.is_alive()


def test_a_study_goes_on_past_planted_faults_and_records_each(planted_evaluator, tmp_path):
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    info = planted_evaluator.info()
    session = Session(database=database, evaluator=planted_evaluator,
                      storage=optuna.storages.RDBStorage(database.url),
                      gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                      sampler="random", batch=2, progress=False)
    outcome = run_study(session, PLANTED, SMALL, Budget(trials=10, timeout_s=120, patience=None))
    assert outcome.stop_reason == "search space exhausted" and outcome.run_state == "finished"
    states = {t.params["MODE"]: (t.state, t.error) for t in database.run_history(outcome.run_id)}
    assert states[PLANTED_OK][0] == "ok"
    assert states[PLANTED_ILLEGAL_ADDRESS][0] == "crashed"
    assert states[PLANTED_INFINITE_LOOP][0] == "timeout"
    assert states[PLANTED_COMPILE_ERROR][0] == "compile_error"
    assert all(error for state, error in states.values() if state != "ok")
    assert outcome.best_config == {"MODE": PLANTED_OK}
    database.close()


def test_no_gpu_is_reported_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_STANDIN_NO_GPU", "no CUDA driver in this test")
    with pytest.raises(GpuUnavailable, match="no CUDA driver in this test"):
        LiveEvaluator(0, cache_dir=tmp_path, backend="tuner.testing")


def test_a_started_evaluator_reports_no_gpu_when_waited_for_and_closes(tmp_path, monkeypatch):
    """``wait=False`` (the command imports the search meanwhile): the constructor returns with
    the processes starting; the reason comes from ``wait_started``, which closes everything."""
    monkeypatch.setenv("GEMMTUNE_STANDIN_NO_GPU", "no CUDA driver in this test")
    evaluator = LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                              wait=False)
    child = evaluator.child.process
    assert child is not None and evaluator.pool.arch is None  # not known before the child says
    with pytest.raises(GpuUnavailable, match="no CUDA driver in this test"):
        evaluator.wait_started()
    assert evaluator.child.process is None and not child.is_alive()
    assert evaluator.pool._executor is None


def test_a_started_evaluator_measures_once_waited_for(tmp_path):
    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       wait=False) as evaluator:
        evaluator.wait_started()
        evaluator.wait_started()  # a second wait returns at once
        assert evaluator.pool.arch == evaluator.arch() and evaluator.info()["name"]
        assert evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL).state == "ok"


def test_a_fault_while_another_candidate_waits_in_the_queue(planted_evaluator):
    """Asynchronous requests (issue 19): the candidate queued behind one that faults or hangs was
    never measured by the dying child; the new child measures it, and its answer is the one a
    lone request gets."""
    evaluator = planted_evaluator
    alone = evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL)
    for planted, state in ((PLANTED_ILLEGAL_ADDRESS, "crashed"),
                           (PLANTED_INFINITE_LOOP, "timeout")):
        before = evaluator.replacements
        bad = evaluator.submit(PLANTED, {"MODE": planted}, SMALL)
        queued = evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL)
        assert len(evaluator.lanes[0].queued) == 2  # both with the child before either is answered
        assert evaluator.collect(bad).state == state
        assert evaluator.replacements == before + 1
        behind = evaluator.collect(queued)
        assert behind.state == "ok"
        assert (behind.gflops, behind.time_median_ms) == (alone.gflops, alone.time_median_ms)
    assert not evaluator.lanes[0].queued


def test_answers_read_ahead_of_their_collect_are_kept(planted_evaluator):
    """A synchronous request (a new problem) reads the queued answers first; each stays with
    its ticket."""
    evaluator = planted_evaluator
    first = evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL)
    broken = evaluator.submit(PLANTED, {"MODE": PLANTED_COMPILE_ERROR}, SMALL)
    second = evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL)
    evaluator.set_problem(Problem(32, 32, 32))
    assert not evaluator.lanes[0].queued
    assert [evaluator.collect(t).state for t in (second, broken, first)] == [
        "ok", "compile_error", "ok"]


def test_two_gpus_are_one_evaluator_each_candidate_on_the_less_busy_one(tmp_path):
    """Several GPUs of one host (--gpus): one compile pool, a GPU child per device; candidates go
    to the GPU with the fewest waiting, every answer returns to its own ticket, and the batch the
    search keeps in flight grows by a queue per GPU."""
    with LiveEvaluator([0, 1], cache_dir=tmp_path, workers=1, backend="tuner.testing",
                       backend_options={"measure_s": 0.05}) as evaluator:
        assert evaluator.devices == [0, 1]
        assert evaluator.batch == 1 + 2 * evaluator.queue_depth
        assert len({lane.child.process.pid for lane in evaluator.lanes}) == 2
        alone = evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL)
        tickets = [evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL) for _ in range(5)]
        assert [t.lane.child.device for t in tickets] == [0, 1, 0, 1, 0]
        answers = [evaluator.collect(t) for t in reversed(tickets)]
        assert all((a.state, a.gflops) == ("ok", alone.gflops) for a in answers)
        assert not any(lane.queued for lane in evaluator.lanes)


def test_a_study_on_two_gpus_keeps_a_queue_waiting_at_each(tmp_path):
    """The search hands the evaluator as many candidates as it takes, a queue per GPU child; it
    once kept one queue's worth in all (three for four GPUs left one idle at every moment)."""
    database = db.open_database(f"sqlite:///{tmp_path / 'gemmtune.sqlite'}")
    with LiveEvaluator([0, 1], cache_dir=tmp_path / "cubins", workers=2, backend="tuner.testing",
                       backend_options={"measure_s": 0.3}) as evaluator:
        assert evaluator.tickets == 2 * evaluator.queue_depth
        outstanding: set[int] = set()
        most = 0
        submit, collect = evaluator.submit, evaluator.collect

        def counting_submit(*args):
            nonlocal most
            ticket = submit(*args)
            outstanding.add(id(ticket))
            most = max(most, len(outstanding))
            return ticket

        def counting_collect(ticket):
            answer = collect(ticket)
            outstanding.discard(id(ticket))
            return answer

        evaluator.submit, evaluator.collect = counting_submit, counting_collect
        info = evaluator.info()
        session = Session(database=database, evaluator=evaluator,
                          storage=optuna.storages.RDBStorage(database.url),
                          gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
                          sampler="random", batch=evaluator.batch, progress=False)
        naive = kernels.get_family("naive")
        outcome = run_study(session, naive, Problem(128, 128, 128),
                            Budget(trials=16, timeout_s=300, patience=None))
    database.close()
    assert outcome.measured_now == 16
    assert most > evaluator.queue_depth, f"at most {most} candidates with two GPUs at once"


def test_a_fault_on_one_gpu_replaces_only_that_gpus_process(tmp_path):
    cache = tmp_path / "cubins"
    faults = {cubin_digest(PLANTED_ILLEGAL_ADDRESS, cache): "fault"}
    with LiveEvaluator([0, 1], cache_dir=cache, workers=1, trial_timeout_s=TRIAL_TIMEOUT_S,
                       backend="tuner.testing", backend_options={"faults": faults}) as evaluator:
        evaluator.set_problem(SMALL)
        pids = [lane.child.process.pid for lane in evaluator.lanes]
        first = evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL)  # GPU 0
        bad = evaluator.submit(PLANTED, {"MODE": PLANTED_ILLEGAL_ADDRESS}, SMALL)  # GPU 1
        behind = evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL)  # GPU 0
        after_bad = evaluator.submit(PLANTED, {"MODE": PLANTED_OK}, SMALL)  # GPU 1, behind the fault
        assert evaluator.collect(bad).state == "crashed"
        assert [evaluator.collect(t).state for t in (first, behind, after_bad)] == ["ok"] * 3
        assert evaluator.replacements == 1
        assert evaluator.lanes[0].child.process.pid == pids[0] != pids[1] != evaluator.lanes[1].child.process.pid


def test_all_gpus_are_those_the_first_gpu_process_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_STANDIN_GPUS", "3")  # the stand-in driver's count, read by its child
    with LiveEvaluator("all", cache_dir=tmp_path, workers=1, backend="tuner.testing") as evaluator:
        assert evaluator.devices == [0, 1, 2]
        assert evaluator.evaluate(PLANTED, {"MODE": PLANTED_OK}, SMALL).state == "ok"


def test_devices_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        LiveEvaluator([0, 0], backend="tuner.testing")



def test_the_stand_in_takes_another_gpu_models_name_for_profiles(tmp_path, monkeypatch):
    """GEMMTUNE_STANDIN_NAME names the stand-in GPU (in the child, which reports it) as another
    model, so that a CPU profile of the start-ups reads that model's bundled recordings."""
    from tuner.measure.testing import NAME_ENV, StandInEvaluator

    assert StandInEvaluator().info()["name"] == "Stand-in GPU (analytic model)"
    monkeypatch.setenv(NAME_ENV, "NVIDIA H200")
    assert StandInEvaluator().info()["name"] == "NVIDIA H200"
    with LiveEvaluator(0, cache_dir=tmp_path, workers=1, backend="tuner.testing") as evaluator:
        assert evaluator.info()["name"] == "NVIDIA H200"
