"""Several real processes writing at once, a reader polling, and a writer killed with SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

import db
from db.testing import BACKENDS, PG_MISSING, postgres_available, scratch_url

WRITERS = 4
TRIALS_PER_WRITER = 150
SOURCE_HASH = "ab" * 32
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=[pytest.param(b, marks=[pytest.mark.postgres] if b == "postgresql" else [])
                        for b in BACKENDS])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql" and not postgres_available():
        pytest.skip(PG_MISSING)
    with scratch_url(request.param, tmp_path) as scratch:
        yield scratch


def _start_run(database: db.Database, host: str) -> int:
    # Every writer creates the same GPU, problem and family: get-or-create must not race.
    return database.start_run(
        gpu_id=database.ensure_gpu(db.GpuInfo("NVIDIA H100", "GPU-1", "9.0", 132, 2**36)),
        problem_id=database.ensure_problem(2048, 2048, 2048),
        family_id=database.ensure_family("warptile", SOURCE_HASH),
        sampler="random", seed=0, budget={"trials": TRIALS_PER_WRITER}, host=host,
        command="test", study_name=None)


def _writer(url: str, index: int, start: multiprocessing.synchronize.Barrier,
            errors: multiprocessing.Queue) -> None:
    try:
        start.wait()
        # The database does not exist yet: all writers open (and migrate) it at once.
        with db.open_database(url) as database:
            run_id = _start_run(database, f"writer-{index}")
            for number in range(TRIALS_PER_WRITER):
                state = "ok" if number % 3 else "rejected"
                database.add_trial(run_id, db.TrialRecord(
                    number=number, params={"BM": number, "writer": index}, state=state,
                    time_median_ms=1.0 if state == "ok" else None,
                    gflops=float(index * 1000 + number) if state == "ok" else None))
            database.finish_run(run_id, "finished")
    except BaseException:
        errors.put(f"writer {index}:\n{traceback.format_exc()}")
        raise


def _reader(url: str, start: multiprocessing.synchronize.Barrier, stop: multiprocessing.Event,
            report: multiprocessing.Queue) -> None:
    polls, last_total, problems = 0, 0, []
    try:
        start.wait()
        # Opens while the writers create the schema: it migrates with them or waits for them.
        database = db.open_database(url)
        while not stop.is_set():
            total = sum(run.n_trials for run in database.list_runs())
            for run in database.list_runs():
                database.count_trials(run.id)
                database.trials(run.id, limit=20)
            database.overview()
            if total < last_total:
                problems.append(f"trial count went back from {last_total} to {total}")
            last_total, polls = total, polls + 1
        database.close()
    except BaseException:
        problems.append(traceback.format_exc())
    report.put((polls, last_total, problems))


def test_four_writers_and_a_polling_reader_lose_nothing(url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, stop = ctx.Barrier(WRITERS + 1), ctx.Event()
    errors, report = ctx.Queue(), ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(url, i, start, errors)) for i in range(WRITERS)]
    reader = ctx.Process(target=_reader, args=(url, start, stop, report))
    for process in (*writers, reader):
        process.start()
    for process in writers:
        process.join(timeout=180)
    stop.set()
    polls, seen, reader_problems = report.get(timeout=60)
    reader.join(timeout=30)

    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == [] and [p.exitcode for p in writers] == [0] * WRITERS
    assert reader_problems == [] and reader.exitcode == 0
    assert polls >= 3, f"the reader polled only {polls} times while the writers ran"

    with db.open_database(url) as database:
        runs = database.list_runs(limit=100)
        assert sorted(r.host for r in runs) == [f"writer-{i}" for i in range(WRITERS)]
        assert len(database.list_gpus()) == len(database.list_problems()) == 1
        assert len(database.list_families()) == 1
        for run in runs:
            assert run.state == "finished"
            history = database.run_history(run.id)
            assert [t.number for t in history] == list(range(TRIALS_PER_WRITER))
            writer = history[0].params["writer"]
            assert all(t.params == {"BM": t.number, "writer": writer} for t in history)
            assert database.count_trials(run.id)["ok"] == TRIALS_PER_WRITER * 2 // 3
        best = database.best("NVIDIA H100", 2048, 2048, 2048)
        assert best.gflops == float((WRITERS - 1) * 1000 + TRIALS_PER_WRITER - 1)
    assert seen <= WRITERS * TRIALS_PER_WRITER


KILLED_WRITER = textwrap.dedent("""
    import sys
    import db
    database = db.open_database(sys.argv[1])
    run_id = database.start_run(
        gpu_id=database.ensure_gpu(db.GpuInfo("NVIDIA H100", "GPU-1", "9.0", 132, 2**36)),
        problem_id=database.ensure_problem(4096, 4096, 4096),
        family_id=database.ensure_family("warptile", "cd" * 32),
        sampler="tpe", seed=1, budget={}, host="doomed", command="test", study_name=None)
    print("run", run_id, flush=True)
    number = 0
    while True:
        database.add_trial(run_id, db.TrialRecord(
            number, {"BM": number}, "ok", error="x" * 2000,
            time_median_ms=1.0, gflops=float(number + 1)))
        print("stored", number, flush=True)  # acknowledged only after the commit returned
        number += 1
""")


def test_writer_killed_with_sigkill_loses_at_most_the_trial_in_flight(url: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, url], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_line = child.stdout.readline().split()
        assert run_line[:1] == ["run"], child.stderr.read()
        run_id = int(run_line[1])
        acknowledged = -1
        while acknowledged < 40:
            line = child.stdout.readline()
            assert line.startswith("stored"), child.stderr.read()
            acknowledged = int(line.split()[1])
        os.kill(child.pid, signal.SIGKILL)
        # through the same reader: lines readline() already buffered are not lost (communicate()
        # would read past them and miss acknowledgements)
        rest = child.stdout.read()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    for line in rest.splitlines():  # acknowledgements still in the pipe when it died
        acknowledged = int(line.split()[1])

    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as plain:
            assert plain.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with db.open_database(url) as database:
        numbers = [t.number for t in database.run_history(run_id)]
        # Every acknowledged trial is there, in order; at most the one in flight is extra.
        assert numbers == list(range(len(numbers)))
        assert acknowledged + 1 <= len(numbers) <= acknowledged + 2
        assert database.get_run(run_id).state == "running"  # no one said otherwise
        database.add_trial(run_id, db.TrialRecord(len(numbers), {"BM": 0}, "timeout"))
        database.finish_run(run_id, "interrupted")
        assert database.count_trials(run_id)["timeout"] == 1
        assert database.get_run(run_id).state == "interrupted"
