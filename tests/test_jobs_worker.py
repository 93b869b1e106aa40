"""``python -m tuner --worker`` without a GPU: the replay backend answers from the real H100
recording in tuner/recordings, jobs come through the real API and land in a real SQLite file.

In process: claiming, running, failing with a reason, --once, --max-jobs. As whole commands in
their own processes: SIGTERM hands the job back (exit 130), and a worker killed outright leaves
its job running until another worker reclaims it after --stale-after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import db
from api import create_app
from db.testing import BACKENDS, PG_MISSING, postgres_available, scratch_url
from tuner.run.cli import main
from tuner.run.options import EXIT_INTERRUPTED, EXIT_OK
from tuner.measure.recording import BUNDLED_RECORDINGS

ROOT = Path(__file__).resolve().parents[1]
RECORDING = BUNDLED_RECORDINGS / "h100-warptile+vectorized-2048x2048x2048+1024x1024x1024.json.gz"
H100 = "NVIDIA H100 80GB HBM3"  # the recording's GPU
TOKEN = "worker-test-token"


@pytest.fixture(params=[pytest.param(b, marks=[pytest.mark.postgres] if b == "postgresql" else [])
                        for b in BACKENDS])
def any_url(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "postgresql" and not postgres_available():
        pytest.skip(PG_MISSING)
    with scratch_url(request.param, tmp_path) as scratch:
        yield scratch


def worker(url: str, *extra: str) -> int:
    return main(["--worker", "--replay", str(RECORDING), "--db", url, "--poll", "0.1", *extra])


def queue(url: str, expect: int = 201, **body) -> dict:
    with TestClient(create_app(url, api_token=TOKEN)) as client:
        r = client.post("/api/jobs", json={"gpu": H100, **body}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == expect, r.text
    return r.json()


def test_worker_registers_its_gpu_runs_queued_jobs_and_fails_the_impossible_ones(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    # an empty queue: --once returns at once, but the GPU model is now known to the API
    assert worker(url, "--once") == EXIT_OK
    with db.open_database(url) as database:
        assert [g.name for g in database.list_gpus()] == [H100]

    good = queue(url, m=1024, n=1024, k=1024, families=["warptile"], budget={"trials": 6, "patience": 0})
    second = queue(url, m=2048, n=2048, k=2048, families=["vectorized"], budget={"trials": 4})
    absent = queue(url, m=512, n=512, k=512, families=["warptile"])
    unrecorded = queue(url, 200, m=1024, n=1024, k=1024, families=["naive"])  # same shape: the open job
    assert unrecorded["id"] == good["id"]

    assert worker(url, "--max-jobs", "1") == EXIT_OK  # only the oldest
    with db.open_database(url) as database:
        done = database.get_job(good["id"])
        assert done.state == "done" and done.attempts == 1 and len(done.run_ids) == 1
        assert done.reason.startswith("best warptile ") and "of cuBLAS" in done.reason
        [run] = database.list_runs()
        assert run.id == done.run_ids[0] and run.family == "warptile" and run.state == "finished"
        assert (run.problem.m, run.problem.n, run.problem.k) == (1024, 1024, 1024)
        assert run.n_trials >= 6 and "job " in run.command
        assert database.get_job(second["id"]).state == "queued"
    naive = queue(url, m=1024, n=1024, k=1024, families=["naive"])  # the first ended: a new job

    assert worker(url, "--once") == EXIT_OK  # everything queued, then exit
    with db.open_database(url) as database:
        assert database.get_job(second["id"]).state == "done"
        failed = database.get_job(absent["id"])
        assert failed.state == "failed" and failed.run_ids == []
        assert "has no 512x512x512; it holds 2048x2048x2048, 1024x1024x1024" in failed.reason
        failed = database.get_job(naive["id"])
        assert failed.state == "failed" and "no family 'naive'" in failed.reason
        assert database.count_jobs() == {"queued": 0, "running": 0, "done": 2, "failed": 2}
    with TestClient(create_app(url)) as client:
        best = client.get("/api/best", params={"gpu": H100, "m": 1024, "n": 1024, "k": 1024}).json()
        assert best["match"] == "exact" and best["best"]["run_id"] == done.run_ids[0]

    out = capsys.readouterr().out
    assert f"takes jobs for '{H100}'" in out
    assert f"job {good['id']}: 1024x1024x1024 on {H100} (warptile;" in out
    assert f"job {good['id']}: done: best warptile" in out and f"job {absent['id']}: failed: cannot run it here" in out
    assert "exiting after 3 job(s)" in out


def test_worker_refuses_shapes_on_its_command_line(tmp_path, capsys):
    assert main(["--worker", "--replay", str(RECORDING), "--db", str(tmp_path / "x.sqlite"),
                 "--shape", "64x64x64"]) == 2
    assert "--worker takes its shapes from the jobs" in capsys.readouterr().err
    assert not (tmp_path / "x.sqlite").exists()


# ---------------------------------------------------------------- whole commands, signals


def start_worker(url: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuner", "--worker", "--replay", str(RECORDING), "--db", url, "--poll", "0.2", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, what: str, proc: subprocess.Popen, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"worker exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}:\n{proc.communicate()[0]}")


LONG_BUDGET = {"trials": 10_000, "patience": 0, "total_seconds": 600}  # runs until stopped


def test_sigterm_finishes_the_trial_in_hand_and_puts_the_job_back(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    proc = start_worker(url)  # waits on an empty queue
    try:
        with db.open_database(url) as database:
            wait_for(lambda: database.list_gpus(), "the worker registered its GPU", proc)
            job = queue(url, m=2048, n=2048, k=2048, families=["warptile"], budget=LONG_BUDGET)
            wait_for(lambda: database.get_job(job["id"]).state == "running", "the job was claimed", proc)
            wait_for(lambda: any(r.n_trials >= 2 for r in database.list_runs()), "some trials", proc)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == EXIT_INTERRUPTED, out
            back = database.get_job(job["id"])
            assert (back.state, back.worker, back.attempts) == ("queued", None, 1)
            assert "its worker was stopped" in back.reason
            [run] = database.list_runs()
            assert run.state == "interrupted"
            assert f"job {job['id']}: back in the queue" in out and "stopped after 0 job(s)" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_workers_job_is_reclaimed_and_finished_by_another(any_url):
    url = any_url
    first = start_worker(url, "--heartbeat", "0.2")
    try:
        with db.open_database(url) as database:
            wait_for(lambda: database.list_gpus(), "the worker registered its GPU", first)
            job = queue(url, m=1024, n=1024, k=1024, families=["warptile"], budget={"trials": 12, "patience": 0})
            wait_for(lambda: database.get_job(job["id"]).state == "running", "the job was claimed", first)
            os.kill(first.pid, signal.SIGKILL)
            first.communicate(timeout=30)
            dead = database.get_job(job["id"])
            assert dead.state == "running"  # nobody said otherwise

            # within the grace period the job stays with its (dead) worker
            assert worker(url, "--once", "--stale-after", "600") == EXIT_OK
            assert database.get_job(job["id"]).state == "running"
            time.sleep(1.1)
            assert worker(url, "--once", "--stale-after", "1", "--heartbeat", "0.2") == EXIT_OK
            done = database.get_job(job["id"])
            assert (done.state, done.attempts) == ("done", 2) and done.worker != dead.worker
            assert done.run_ids and database.get_run(done.run_ids[-1]).state == "finished"
    finally:
        if first.poll() is None:
            first.kill()


def test_workers_racing_for_the_queue_run_each_job_once(any_url):
    url = any_url
    with db.open_database(url) as database:
        database.ensure_gpu(db.GpuInfo(H100, "GPU-registered-by-hand", "9.0", 132, 80 * 2**30))
    shapes = [(1024, 1024, 1024, "warptile"), (1024, 1024, 1024, "vectorized"),
              (2048, 2048, 2048, "warptile"), (2048, 2048, 2048, "vectorized")]
    jobs = []
    for m, n, k, family in shapes:  # one open job per shape: the second family of a shape waits
        jobs.append(queue(url, 201 if not jobs or jobs[-1]["m"] != m else 200, m=m, n=n, k=k,
                          families=[family], budget={"trials": 3, "patience": 0}))
    ids = sorted({j["id"] for j in jobs})
    workers = [start_worker(url, "--once") for _ in range(2)]
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    assert [w.returncode for w in workers] == [EXIT_OK, EXIT_OK], outputs
    with db.open_database(url) as database:
        ended = [database.get_job(i) for i in ids]
        assert [j.reason for j in ended if j.state != "done"] == []
        assert [(j.state, j.attempts) for j in ended] == [("done", 1)] * len(ids)
        assert sum(len(j.run_ids) for j in ended) == len(database.list_runs()) == len(ids)
    for job in ended:  # each job was announced by exactly one of the workers
        announced = [out for out in outputs if f"job {job.id}: done" in out]
        assert len(announced) == 1 and job.worker in announced[0]


def test_a_worker_whose_job_was_taken_over_stops_it_and_goes_on(tmp_path):
    """A worker that was merely slow (its heartbeat late past someone's --stale-after) learns from
    its next heartbeat that the job is another's, stops its studies and leaves the job alone."""
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    proc = start_worker(url, "--heartbeat", "0.5", "--max-jobs", "1")
    try:
        with db.open_database(url) as database:
            wait_for(lambda: database.list_gpus(), "the worker registered its GPU", proc)
            job = queue(url, m=2048, n=2048, k=2048, families=["warptile"], budget=LONG_BUDGET)
            wait_for(lambda: database.get_job(job["id"]).state == "running", "the job was claimed", proc)
            # a thief with a tiny grace period takes it between two heartbeats
            stolen = wait_for(lambda: database.claim_job(H100, "thief", stale_after_s=0.05), "a takeover", proc)
            assert stolen.id == job["id"] and stolen.attempts == 2
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == EXIT_OK, out  # --max-jobs 1: the lost job counts
            assert f"job {job['id']}: taken over by another worker" in out
            after = database.get_job(job["id"])
            assert (after.state, after.worker) == ("running", "thief")  # left to its new holder
            [run] = database.list_runs()
            assert run.state == "interrupted"
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------- two GPU models, one queue

H200 = "NVIDIA H200"


def h200_recording(tmp_path: Path) -> Path:
    """The H100 recording under another GPU's header: a replay worker of another model."""
    from tuner.measure import recording

    copy = recording.load(RECORDING)
    copy.gpu = {**copy.gpu, "name": H200, "uuid": "GPU-h200-replay-test", "memory_bytes": 141 * 2**30}
    return copy.save(tmp_path / "h200-replay.json.gz")


def test_each_models_jobs_go_to_a_worker_of_that_model_and_never_to_the_other(any_url, tmp_path, capsys):
    url, h200 = any_url, h200_recording(tmp_path)
    h100_worker = ["--worker", "--replay", str(RECORDING), "--db", url, "--poll", "0.1", "--once"]
    h200_worker = ["--worker", "--replay", str(h200), "--db", url, "--poll", "0.1", "--once"]
    assert main(h200_worker) == EXIT_OK and main(h100_worker) == EXIT_OK  # both models known
    with db.open_database(url) as database:
        assert sorted(g.name for g in database.list_gpus()) == [H100, H200]
    budget = {"trials": 3, "patience": 0}
    by_model = {H100: [], H200: []}
    for gpu in (H200, H100):  # interleaved, the other model's job is always the older one
        for m, family in ((1024, "warptile"), (2048, "vectorized")):
            by_model[gpu].append(queue(url, gpu=gpu, m=m, n=m, k=m, families=[family], budget=budget))
    h100_ids, h200_ids = ([j["id"] for j in by_model[g]] for g in (H100, H200))
    capsys.readouterr()

    assert main(h100_worker) == EXIT_OK  # drains its model's queue: the H200 jobs stay queued
    h100_out = capsys.readouterr().out
    with db.open_database(url) as database:
        assert [(database.get_job(i).state, database.get_job(i).attempts) for i in h100_ids] == [("done", 1)] * 2
        untouched = [database.get_job(i) for i in h200_ids]
        assert [(j.state, j.attempts, j.worker) for j in untouched] == [("queued", 0, None)] * 2
        assert database.claim_job(H100, "another-h100") is None  # nothing left for an H100

    assert main(h200_worker) == EXIT_OK
    h200_out = capsys.readouterr().out
    with db.open_database(url) as database:
        jobs = {i: database.get_job(i) for i in h100_ids + h200_ids}
        assert [(j.state, j.attempts) for j in jobs.values()] == [("done", 1)] * 4, [j.reason for j in jobs.values()]
        for ids, out, gpu in ((h100_ids, h100_out, H100), (h200_ids, h200_out, H200)):
            assert f"takes jobs for {gpu!r}" in out and "exiting after 2 job(s)" in out
            for i in ids:
                job = jobs[i]
                assert job.gpu_name == gpu and job.worker in out  # held by this model's worker
                assert f"job {i}: done" in out and f"job {i}: " not in (h200_out if gpu == H100 else h100_out)
                [run_id] = job.run_ids
                assert database.get_run(run_id).gpu_name == gpu  # measured on, and stored for, its model
        assert len(database.list_runs()) == 4
    with TestClient(create_app(url)) as client:
        for gpu in (H100, H200):
            best = client.get("/api/best", params={"gpu": gpu, "m": 1024, "n": 1024, "k": 1024}).json()
            assert best["match"] == "exact" and best["best"]["run_id"] in [r for i in by_model[gpu] for r in jobs[i["id"]].run_ids]
