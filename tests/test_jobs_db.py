"""The job queue in db: enqueue (deduplicated), claim (atomic, also across processes), heartbeat,
finish, release, reclaim after a dead worker; on SQLite and, with GEMMTUNE_TEST_PG_URL, PostgreSQL."""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

import db
from db.testing import BACKENDS, PG_MISSING, postgres_available, scratch_url

H100 = db.GpuInfo("NVIDIA H100 80GB HBM3", "GPU-h100-a", "9.0", 132, 80 * 2**30)
H100_B = db.GpuInfo("NVIDIA H100 80GB HBM3", "GPU-h100-b", "9.0", 132, 80 * 2**30)
A100 = db.GpuInfo("NVIDIA A100-SXM4-40GB", "GPU-a100", "8.0", 108, 40 * 2**30)


@pytest.fixture(params=[pytest.param(b, marks=[pytest.mark.postgres] if b == "postgresql" else [])
                        for b in BACKENDS])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql" and not postgres_available():
        pytest.skip(PG_MISSING)
    with scratch_url(request.param, tmp_path) as scratch:
        yield scratch


@pytest.fixture
def database(url: str) -> Iterator[db.Database]:
    with db.open_database(url) as database:
        for gpu in (H100, H100_B, A100):
            database.ensure_gpu(gpu)
        yield database


def test_enqueue_stores_the_request_and_a_repeat_returns_the_open_job(database: db.Database) -> None:
    job, created = database.enqueue_job("nvidia h100 80gb hbm3", 1024, 512, 256,
                                        families=["warptile", "splitk", "warptile"],
                                        budget={"trials": 20, "total_seconds": 90.5})
    assert created and job.state == "queued" and job.attempts == 0 and job.worker is None
    assert job.gpu_name == H100.name  # the stored spelling, whatever case was asked for
    assert (job.m, job.n, job.k, job.dtype, job.layout, job.general_alpha_beta) == (
        1024, 512, 256, "fp32", "nn", True)
    assert job.families == ["warptile", "splitk"] and job.budget == {"trials": 20, "total_seconds": 90.5}
    assert job.origin == "request" and job.run_ids == [] and job.created_at.tzinfo is not None
    assert database.get_job(job.id) == job

    # the same model by a board's UUID, another budget: still the same open job
    again, created = database.enqueue_job("GPU-h100-b", 1024, 512, 256, budget={"trials": 5},
                                          origin="best")
    assert not created and again == job
    other, created = database.enqueue_job(H100.name, 1024, 512, 257)
    assert created and other.id != job.id and other.families == [] and other.budget == {}
    a100, created = database.enqueue_job(A100.name, 1024, 512, 256)
    assert created and a100.gpu_name == A100.name
    assert [j.id for j in database.list_jobs()] == [a100.id, other.id, job.id]


def test_bad_requests_are_refused_naming_the_value_and_write_nothing(database: db.Database) -> None:
    with pytest.raises(db.UnknownGpuError) as caught:
        database.enqueue_job("H100", 64, 64, 64)
    message = str(caught.value)
    assert "'H100'" in message and repr(H100.name) in message and repr(A100.name) in message
    assert "--worker" in message  # says how a model becomes known
    cases = [
        (dict(m=0), "invalid m 0"),
        (dict(k=-5), "invalid k -5"),
        (dict(budget={"trials": 0}), "job budget trials 0; allowed: an int in 1..10000"),
        (dict(budget={"trials": 2.5}), "job budget trials 2.5"),
        (dict(budget={"patience": True}), "job budget patience True"),
        (dict(budget={"total_seconds": float("nan")}), "job budget total_seconds nan"),
        (dict(budget={"trails": 3}), "job budget key 'trails'; allowed: 'trials', 'patience', 'total_seconds'"),
        (dict(families=["warptile", ""]), "job families"),
        (dict(families="warptile"), "job families"),
        (dict(origin="cron"), "job origin 'cron'; allowed: 'request', 'best'"),
        (dict(dtype="fp16"), "invalid dtype 'fp16'; allowed: 'fp32'"),
    ]
    for change, expected in cases:
        args = dict(gpu=H100.name, m=64, n=64, k=64) | change
        with pytest.raises(db.InvalidInputError) as caught:
            database.enqueue_job(**args)
        assert expected in str(caught.value), (change, str(caught.value))
    assert database.list_jobs() == [] and database.count_jobs() == dict.fromkeys(db.JOB_STATES, 0)
    with pytest.raises(db.UnknownJobError, match="unknown job id 7; allowed: an existing job id"):
        database.get_job(7)
    with pytest.raises(db.InvalidInputError, match="invalid job state 'paused'"):
        database.list_jobs(state="paused")


def test_a_worker_claims_the_oldest_job_of_its_model_and_ends_it(database: db.Database) -> None:
    first, _ = database.enqueue_job(H100.name, 256, 256, 256)
    database.enqueue_job(A100.name, 256, 256, 256)
    second, _ = database.enqueue_job(H100.name, 512, 512, 512)

    assert database.claim_job("NVIDIA RTX 4090", "w-other") is None
    claimed = database.claim_job(H100.name.upper(), "w1")  # models match in any case
    assert claimed is not None and claimed.id == first.id and claimed.state == "running"
    assert claimed.worker == "w1" and claimed.attempts == 1
    assert claimed.claimed_at is not None and claimed.heartbeat_at == claimed.claimed_at
    assert database.claim_job(H100.name, "w2").id == second.id
    assert database.claim_job(H100.name, "w3") is None  # nothing left for this model
    assert database.count_jobs() == {"queued": 1, "running": 2, "done": 0, "failed": 0}

    time.sleep(0.01)
    assert database.heartbeat_job(first.id, "w1")
    assert database.get_job(first.id).heartbeat_at > claimed.heartbeat_at
    assert not database.heartbeat_job(first.id, "w2")  # not w2's job
    with pytest.raises(db.InvalidInputError, match="job .* is not held by worker 'w2'.*held by 'w1'"):
        database.finish_job(first.id, "w2", "done")
    with pytest.raises(db.InvalidInputError, match="invalid reason None"):
        database.finish_job(first.id, "w1", "failed")  # a failure needs its reason
    with pytest.raises(db.InvalidInputError, match="job end state 'queued'"):
        database.finish_job(first.id, "w1", "queued")

    done = database.finish_job(first.id, "w1", "done", reason="best 1234 GFLOP/s", run_ids=[4, 5])
    assert done.state == "done" and done.run_ids == [4, 5] and done.ended_at is not None
    assert not database.heartbeat_job(first.id, "w1")  # an ended job takes no heartbeats
    failed = database.finish_job(second.id, "w2", "failed", reason="no GPU")
    assert (failed.state, failed.reason) == ("failed", "no GPU")
    with pytest.raises(db.InvalidInputError, match="it is 'failed'"):
        database.finish_job(second.id, "w2", "done")

    # an ended job no longer blocks a new request for the same problem
    again, created = database.enqueue_job(H100.name, 256, 256, 256)
    assert created and again.id not in (first.id, second.id)
    assert [j.id for j in database.list_jobs(state="done")] == [first.id]
    assert {j.gpu_name for j in database.list_jobs(gpu="gpu-a100")} == {A100.name}
    with pytest.raises(db.UnknownGpuError):
        database.list_jobs(gpu="no such GPU")


def test_a_released_job_is_queued_again(database: db.Database) -> None:
    job, _ = database.enqueue_job(H100.name, 128, 128, 128)
    database.claim_job(H100.name, "w1")
    released = database.release_job(job.id, "w1", reason="worker stopped (SIGTERM)")
    assert (released.state, released.worker, released.heartbeat_at) == ("queued", None, None)
    assert released.attempts == 1
    assert database.claim_job(H100.name, "w2").attempts == 2


def test_a_dead_workers_job_is_reclaimed_after_the_grace_period_then_given_up(database: db.Database) -> None:
    job, _ = database.enqueue_job(H100.name, 128, 128, 128)
    assert database.claim_job(H100.name, "dead-1").id == job.id
    # within the grace period it stays with its worker
    assert database.claim_job(H100.name, "w2", stale_after_s=60) is None
    time.sleep(0.3)
    taken = database.claim_job(H100.name, "dead-2", stale_after_s=0.2)
    assert taken is not None and taken.id == job.id and taken.worker == "dead-2" and taken.attempts == 2
    assert not database.heartbeat_job(job.id, "dead-1")  # the first worker learns it lost the job
    with pytest.raises(db.InvalidInputError, match="held by 'dead-2'"):
        database.finish_job(job.id, "dead-1", "done")
    time.sleep(0.3)
    assert database.claim_job(H100.name, "dead-3", stale_after_s=0.2).attempts == db.MAX_JOB_ATTEMPTS
    time.sleep(0.3)
    # the third dead worker: the job is what kills them; it fails instead of being claimed again
    assert database.claim_job(H100.name, "w4", stale_after_s=0.2) is None
    failed = database.get_job(job.id)
    assert failed.state == "failed" and "gave up after 3 claims" in failed.reason
    assert "dead-3" in failed.reason
    with pytest.raises(db.InvalidInputError, match="stale_after_s"):
        database.claim_job(H100.name, "w5", stale_after_s=0)


# ---------------------------------------------------------------- several processes at once

PROCESSES = 4
JOBS = 60


def _worker_process(url: str, index: int, start, results) -> None:
    """Opens the database, then (all at once) asks for one shared problem, then claims jobs
    until none is left, ending each one."""
    try:
        name = f"claimer-{index}"
        with db.open_database(url) as database:
            start.wait()
            requested, created = database.enqueue_job(H100.name, 4096, 4096, 4096, origin="best")
            start.wait()
            taken = []
            while (job := database.claim_job(H100.name, name)) is not None:
                taken.append(job.id)
                # a job takes time, as a real one does: without it, on SQLite one process
                # could claim and finish all 61 while the others' busy handlers slept, and the
                # test saw no race at all
                time.sleep(0.005)
                database.finish_job(job.id, name, "done")
        results.put((index, (requested.id, created, taken), None))
    except BaseException:
        results.put((index, None, traceback.format_exc()))


def test_racing_processes_queue_one_job_per_problem_and_never_take_the_same_job(
        database: db.Database, url: str) -> None:
    queued = [database.enqueue_job(H100.name, 64 + i, 64, 64)[0].id for i in range(JOBS)]
    database.enqueue_job(A100.name, 64, 64, 64)  # another model's job: nobody here takes it
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_worker_process, args=(url, i, start, results))
             for i in range(PROCESSES)]
    for p in procs:
        p.start()
    answers = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert [err for _, _, err in answers if err] == [] and [p.exitcode for p in procs] == [0] * PROCESSES

    requested = {job_id for _, (job_id, _, _), _ in answers}
    assert len(requested) == 1  # one job for the problem all four asked for at once
    assert sorted(created for _, (_, created, _), _ in answers) == [False] * (PROCESSES - 1) + [True]
    taken = [ids for _, (_, _, ids), _ in answers]
    everything = [job_id for ids in taken for job_id in ids]
    assert sorted(everything) == sorted(queued + list(requested))  # each exactly once, none lost
    assert sum(1 for ids in taken if ids) >= 2, f"no race happened: {taken}"
    assert database.count_jobs() == {"queued": 1, "running": 0, "done": JOBS + 1, "failed": 0}
    assert all(j.attempts == 1 for j in database.list_jobs(state="done", limit=JOBS + 1))
