"""Writes and queries of db.Database, against SQLite and (when available) PostgreSQL."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

import db
from db.testing import BACKENDS, PG_MISSING, postgres_available, scratch_url

HASH_V1 = hashlib.sha256(b"warptile v1").hexdigest()
HASH_V2 = hashlib.sha256(b"warptile v2").hexdigest()


@pytest.fixture(params=[pytest.param(b, marks=[pytest.mark.postgres] if b == "postgresql" else [])
                        for b in BACKENDS])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql" and not postgres_available():
        pytest.skip(PG_MISSING)
    with scratch_url(request.param, tmp_path) as scratch:
        yield scratch


@pytest.fixture
def database(url: str) -> Iterator[db.Database]:
    with db.open_database(url) as opened:
        yield opened


def gpu_info(name: str = "NVIDIA H100 80GB HBM3", uuid: str = "GPU-0001", **changes) -> db.GpuInfo:
    info = db.GpuInfo(name=name, uuid=uuid, compute_capability="9.0", sm_count=132,
                      memory_bytes=80 * 2**30, max_sm_clock_mhz=1980, driver_version="580.65",
                      cuda_version="13.0", nvrtc_version="13.0.48")
    return dataclasses.replace(info, **changes)


def ok(number: int, gflops: float, **extra) -> db.TrialRecord:
    return db.TrialRecord(number=number, params={"BM": 64 + number, "BN": 128}, state="ok",
                          time_median_ms=1000.0 / gflops, gflops=gflops, **extra)


def new_run(database: db.Database, *, gpu: db.GpuInfo | None = None, shape=(1024, 1024, 1024),
            family: str = "warptile", source_hash: str = HASH_V1, stale_after_s: float | None = None) -> int:
    return database.start_run(
        gpu_id=database.ensure_gpu(gpu or gpu_info()),
        problem_id=database.ensure_problem(*shape),
        family_id=database.ensure_family(family, source_hash),
        sampler="tpe", seed=7, budget={"trials": 50}, host="node1",
        command="python -m tuner --gpu 0", study_name=f"{family}-{shape}", stale_after_s=stale_after_s,
    )


# ---------------------------------------------------------------- writes


def test_ensure_is_idempotent_and_gpu_versions_refresh(database: db.Database) -> None:
    first = database.ensure_gpu(gpu_info())
    again = database.ensure_gpu(gpu_info(driver_version="590.01", nvrtc_version="13.1.0"))
    assert first == again
    (stored,) = database.list_gpus()
    assert (stored.driver_version, stored.nvrtc_version) == ("590.01", "13.1.0")
    assert stored.first_seen.tzinfo is not None

    assert database.ensure_problem(512, 256, 128) == database.ensure_problem(512, 256, 128)
    assert database.ensure_problem(512, 256, 128) != database.ensure_problem(
        512, 256, 128, general_alpha_beta=False)
    assert database.ensure_family("warptile", HASH_V1) == database.ensure_family(
        "warptile", HASH_V1.upper())


def test_edited_kernel_source_is_a_new_family_version_and_old_results_stay(
        database: db.Database) -> None:
    old_run = new_run(database, source_hash=HASH_V1)
    database.add_trial(old_run, ok(0, 900.0))
    new = new_run(database, source_hash=HASH_V2)
    database.add_trial(new, ok(0, 500.0))

    versions = database.list_families()
    assert [(v.name, v.source_hash) for v in versions] == [("warptile", HASH_V1),
                                                          ("warptile", HASH_V2)]
    best_any = database.best("NVIDIA H100 80GB HBM3", 1024, 1024, 1024)
    assert (best_any.source_hash, best_any.gflops) == (HASH_V1, 900.0)
    best_current = database.best("NVIDIA H100 80GB HBM3", 1024, 1024, 1024,
                                 source_hash=HASH_V2)
    assert (best_current.run_id, best_current.gflops) == (new, 500.0)


def test_run_lifecycle_and_trial_fields_round_trip(database: db.Database) -> None:
    run_id = new_run(database)
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    record = db.TrialRecord(
        number=0, params={"BM": 128, "BN": 64, "BK": 8}, state="ok", error=None,
        compile_seconds=0.25, registers=96, shared_bytes=16384, spill_bytes=0, occupancy=0.5,
        time_min_ms=0.9, time_median_ms=1.0, time_max_ms=1.3, launches=20, gflops=2147.48,
        sm_clock_mhz=1755, started_at=started)
    trial_id = database.add_trial(run_id, record)
    database.add_trial(run_id, db.TrialRecord(1, {"BM": 256}, "compile_error",
                                              error="ptxas: too much shared data"))
    database.finish_run(run_id, "finished")

    (trial, failed) = database.run_history(run_id)
    stored = {f.name: getattr(trial, f.name) for f in dataclasses.fields(db.TrialRecord)}
    assert stored == dataclasses.asdict(record)
    assert trial.id == trial_id and trial.recorded_at >= started
    assert (failed.state, failed.error, failed.gflops) == (
        "compile_error", "ptxas: too much shared data", None)

    run = database.get_run(run_id)
    assert run.state == "finished" and run.ended_at is not None
    assert run.ended_at >= run.started_at
    assert (run.n_trials, run.n_ok, run.best_gflops) == (2, 1, 2147.48)
    assert (run.sampler, run.seed, run.budget, run.study_name) == (
        "tpe", 7, {"trials": 50}, "warptile-(1024, 1024, 1024)")
    with pytest.raises(db.InvalidInputError, match="already ended as 'finished'"):
        database.finish_run(run_id, "failed")
    assert database.get_run(run_id).state == "finished"


def test_a_run_is_stale_after_its_own_stale_after_time(database: db.Database) -> None:
    """Each run keeps the stale-after time its tuner was started with: a reader marks it
    interrupted once its heartbeat is older than that, whatever the reader's default."""
    quick, beating = new_run(database, stale_after_s=0.2), new_run(database, stale_after_s=1.0)
    patient = new_run(database)  # no stale-after of its own: the default (300 s) applies
    time.sleep(0.4)
    assert database.heartbeat_run(beating)
    assert database.interrupt_stale_runs() == [quick]
    assert database.interrupt_stale_runs() == []  # marked once
    dead = database.get_run(quick)
    assert dead.state == "interrupted" and dead.ended_at is not None
    assert [database.get_run(r).state for r in (beating, patient)] == ["running", "running"]
    assert [r.id for r in database.list_runs(state="running")] == sorted([beating, patient], reverse=True)
    assert database.interrupt_stale_runs(0.1) == [patient]  # the default serves runs without one


# ---------------------------------------------------------------- best / top-k / nearest


def test_only_ok_trials_can_be_best(database: db.Database) -> None:
    run_id = new_run(database)
    # Faster-looking numbers on failed trials must never win.
    database.add_trial(run_id, db.TrialRecord(0, {"BM": 1}, "wrong_result",
                                              time_median_ms=0.01, gflops=99999.0))
    database.add_trial(run_id, db.TrialRecord(1, {"BM": 2}, "timeout"))
    assert database.best("NVIDIA H100 80GB HBM3", 1024, 1024, 1024) is None
    database.add_trial(run_id, ok(2, 1200.0, occupancy=0.75, registers=128))

    best = database.best("NVIDIA H100 80GB HBM3", 1024, 1024, 1024)
    assert (best.match, best.distance, best.trial_number, best.gflops) == ("exact", 0.0, 2, 1200.0)
    assert (best.occupancy, best.registers, best.run_id, best.family) == (
        0.75, 128, run_id, "warptile")
    assert best.fraction_of_cublas is None  # no baseline measured yet


def test_fraction_of_cublas_uses_latest_baseline_of_same_gpu_and_problem(
        database: db.Database) -> None:
    run_id = new_run(database)
    database.add_trial(run_id, ok(0, 1500.0))
    gpu_id = database.ensure_gpu(gpu_info())
    problem_id = database.ensure_problem(1024, 1024, 1024)
    other_problem = database.ensure_problem(2048, 2048, 2048)
    database.add_baseline(gpu_id=gpu_id, problem_id=problem_id, time_median_ms=1.0,
                          gflops=1000.0, run_id=run_id)
    database.add_baseline(gpu_id=gpu_id, problem_id=problem_id, time_median_ms=0.5,
                          gflops=2000.0, sm_clock_mhz=1755)
    database.add_baseline(gpu_id=gpu_id, problem_id=other_problem, time_median_ms=1.0,
                          gflops=9000.0)

    best = database.best("nvidia h100 80gb hbm3", 1024, 1024, 1024)
    assert best.baseline_gflops == 2000.0
    assert best.fraction_of_cublas == pytest.approx(0.75)
    latest = database.latest_baseline(gpu_id, problem_id)
    assert (latest.gflops, latest.sm_clock_mhz, latest.library) == (2000.0, 1755, "cublas")


def test_gpu_lookup_by_name_covers_every_board_and_uuid_picks_one(database: db.Database) -> None:
    board_a = gpu_info(uuid="GPU-aaaa")
    board_b = gpu_info(uuid="GPU-bbbb")
    run_a = new_run(database, gpu=board_a)
    run_b = new_run(database, gpu=board_b)
    database.add_trial(run_a, ok(0, 1000.0))
    database.add_trial(run_b, ok(0, 1100.0))

    assert database.best("NVIDIA H100 80GB HBM3", 1024, 1024, 1024).gpu_uuid == "GPU-bbbb"
    by_uuid = database.best("gpu-AAAA", 1024, 1024, 1024)
    assert (by_uuid.gpu_uuid, by_uuid.gflops) == ("GPU-aaaa", 1000.0)
    assert [g.uuid for g in database.find_gpus("nvidia H100 80GB hbm3")] == ["GPU-aaaa",
                                                                             "GPU-bbbb"]
    assert database.find_gpus("RTX 4090") == []
    with pytest.raises(db.UnknownGpuError, match="'RTX 4090'.*'NVIDIA H100 80GB HBM3'"):
        database.best("RTX 4090", 1024, 1024, 1024)


def test_best_over_one_family_or_all(database: db.Database) -> None:
    naive = new_run(database, family="naive")
    warp = new_run(database, family="warptile")
    database.add_trial(naive, ok(0, 300.0))
    database.add_trial(warp, ok(0, 2000.0))
    gpu = "NVIDIA H100 80GB HBM3"
    assert database.best(gpu, 1024, 1024, 1024).family == "warptile"
    assert database.best(gpu, 1024, 1024, 1024, family="naive").gflops == 300.0
    assert database.best(gpu, 1024, 1024, 1024, family="splitk") is None


def test_nearest_problem_by_log2_distance(database: db.Database) -> None:
    for shape, gflops in (((1024, 1024, 1024), 1000.0), ((4096, 4096, 4096), 4000.0),
                          ((256, 4096, 64), 50.0)):
        database.add_trial(new_run(database, shape=shape), ok(0, gflops))
    gpu = "NVIDIA H100 80GB HBM3"

    best = database.best(gpu, 2048, 2048, 1024)
    # log2 distances: to 1024³ sqrt(1+1+0)=1.414, to 4096³ sqrt(1+1+4)=2.449
    assert (best.match, best.problem.m, best.gflops) == ("nearest", 1024, 1000.0)
    assert best.distance == pytest.approx(math.sqrt(2))
    assert best.requested == (2048, 2048, 1024)
    assert database.best(gpu, 2048, 2048, 1024, nearest=False) is None

    near = database.nearest_problems(gpu, 3000, 3000, 3000, limit=2)
    assert [(p.problem.m, p.problem.n, p.problem.k) for p in near] == [(4096, 4096, 4096),
                                                                      (1024, 1024, 1024)]
    assert near[0].distance == pytest.approx(db.log2_distance((4096,) * 3, (3000,) * 3))
    assert (near[0].best_gflops, near[0].n_ok) == (4000.0, 1)
    assert db.log2_distance((1024, 1024, 1024), (2048, 1024, 1024)) == 1.0


def test_nearest_ignores_problems_without_ok_trials_and_other_gpus(database: db.Database) -> None:
    failed = new_run(database, shape=(2048, 2048, 2048))
    database.add_trial(failed, db.TrialRecord(0, {"BM": 1}, "crashed", error="SIGSEGV"))
    other_gpu = new_run(database, gpu=gpu_info(name="NVIDIA A100", uuid="GPU-a100"),
                        shape=(2048, 2048, 1024))
    database.add_trial(other_gpu, ok(0, 800.0))
    database.add_trial(new_run(database, shape=(128, 128, 128)), ok(0, 10.0))

    best = database.best("NVIDIA H100 80GB HBM3", 2048, 2048, 2048)
    assert (best.match, best.problem.m) == ("nearest", 128)


def test_top_k_for_problem_and_run(database: db.Database) -> None:
    first = new_run(database)
    second = new_run(database)
    for i, g in enumerate((100.0, 700.0, 300.0)):
        database.add_trial(first, ok(i, g))
    database.add_trial(first, db.TrialRecord(3, {"BM": 9}, "launch_error", error="bad grid"))
    database.add_trial(second, ok(0, 500.0))

    top = database.top_k("NVIDIA H100 80GB HBM3", 1024, 1024, 1024, limit=3)
    assert [(t.run_id, t.gflops) for t in top] == [(first, 700.0), (second, 500.0),
                                                   (first, 300.0)]
    assert [t.gflops for t in database.top_k_for_run(first, limit=10)] == [700.0, 300.0, 100.0]
    assert database.top_k("NVIDIA H100 80GB HBM3", 64, 64, 64) == []


def test_a_re_timed_trial_serves_its_median_timing_and_says_of_how_many(
        database: db.Database) -> None:
    """A lucky first timing (900) re-timed to 640 loses the best to the config at 700."""
    run = new_run(database)
    lucky = database.add_trial(run, ok(0, 900.0, sm_clock_mhz=1980, launches=40))
    database.add_trial(run, ok(1, 700.0))
    gpu = "NVIDIA H100 80GB HBM3"
    assert database.best(gpu, 1024, 1024, 1024).trial_id == lucky
    database.retime_trial(lucky, timings=4, time_median_ms=1000.0 / 640.0, gflops=640.0,
                          time_min_ms=1.5, time_max_ms=1.7, launches=38, sm_clock_mhz=1755)
    best = database.best(gpu, 1024, 1024, 1024)
    assert (best.trial_id, best.gflops) == (lucky + 1, 700.0)
    assert [t.gflops for t in database.top_k_for_run(run, limit=2)] == [700.0, 640.0]
    assert [(t.gflops, t.timings) for t in database.best_table()] == [(700.0, 1)]
    first = database.run_history(run)[0]
    assert (first.gflops, first.timings, first.sm_clock_mhz, first.launches,
            first.params) == (640.0, 4, 1755, 38, {"BM": 64, "BN": 128})


def test_re_timing_refuses_what_it_cannot_store_and_changes_nothing(database: db.Database) -> None:
    run = new_run(database)
    trial = database.add_trial(run, ok(0, 900.0))
    failed = database.add_trial(run, db.TrialRecord(1, {"BM": 9}, "launch_error", error="bad grid"))
    for bad, message in ((dict(trial_id=trial, timings=1), "timings"),
                         (dict(trial_id=trial, gflops=-1.0), "gflops"),
                         (dict(trial_id=trial, time_median_ms=math.nan), "time_median_ms"),
                         (dict(trial_id=failed), r"only a verified \('ok'\) trial"),
                         (dict(trial_id=trial + 99), "no trial with id")):
        arguments = dict(timings=3, time_median_ms=1.0, gflops=1000.0) | bad
        with pytest.raises(db.InvalidInputError, match=message):
            database.retime_trial(**arguments)
    assert [(t.gflops, t.timings) for t in database.run_history(run)] == [(900.0, 1), (None, 1)]


# ---------------------------------------------------------------- listings


def test_list_runs_filters_and_newest_first(database: db.Database) -> None:
    a = new_run(database, family="naive")
    b = new_run(database, family="warptile", shape=(512, 512, 512))
    c = new_run(database, gpu=gpu_info(name="NVIDIA A100", uuid="GPU-a100"))
    database.finish_run(a, "interrupted")

    assert [r.id for r in database.list_runs()] == [c, b, a]
    assert [r.id for r in database.list_runs(limit=2, offset=1)] == [b, a]
    assert [r.id for r in database.list_runs(gpu="nvidia a100")] == [c]
    assert [r.id for r in database.list_runs(family="naive")] == [a]
    assert [r.id for r in database.list_runs(state="running")] == [c, b]
    small = database.ensure_problem(512, 512, 512)
    assert [r.id for r in database.list_runs(problem_id=small)] == [b]
    assert [(p.m, p.n, p.k) for p in database.list_problems()] == [(512, 512, 512),
                                                                    (1024, 1024, 1024)]
    assert [g.name for g in database.list_gpus()] == ["NVIDIA A100", "NVIDIA H100 80GB HBM3"]


def test_trials_paging_state_filter_and_counts(database: db.Database) -> None:
    run_id = new_run(database)
    states = ["ok", "rejected", "ok", "compile_error", "ok", "missing", "rejected"]
    # Stored out of order: listings must still come back in trial-number order.
    for number in (3, 0, 6, 1, 5, 2, 4):
        state = states[number]
        record = (ok(number, 100.0 + number) if state == "ok"
                  else db.TrialRecord(number, {"BM": number}, state))
        database.add_trial(run_id, record)

    assert [t.number for t in database.run_history(run_id)] == list(range(7))
    assert [t.number for t in database.trials(run_id, offset=2, limit=3)] == [2, 3, 4]
    assert [t.number for t in database.trials(run_id, state="rejected")] == [1, 6]
    counts = database.count_trials(run_id)
    assert counts == {"ok": 3, "rejected": 2, "compile_error": 1, "launch_error": 0,
                      "wrong_result": 0, "timeout": 0, "crashed": 0, "missing": 1}
    assert list(counts) == list(db.TRIAL_STATES)


def test_overview_has_best_per_gpu_name_and_problem(database: db.Database) -> None:
    h100_a = new_run(database, family="naive")
    h100_b = new_run(database, gpu=gpu_info(uuid="GPU-second"), family="warptile")
    a100 = new_run(database, gpu=gpu_info(name="NVIDIA A100", uuid="GPU-a100"))
    big = new_run(database, shape=(4096, 4096, 4096))
    database.add_trial(h100_a, ok(0, 400.0))
    database.add_trial(h100_b, ok(0, 1600.0))
    database.add_trial(a100, ok(0, 900.0))
    database.add_trial(big, db.TrialRecord(0, {"BM": 1}, "timeout"))  # no ok trial: no cell
    database.add_baseline(gpu_id=database.ensure_gpu(gpu_info(uuid="GPU-second")),
                          problem_id=database.ensure_problem(1024, 1024, 1024),
                          time_median_ms=1.0, gflops=2000.0)

    cells = {(c.gpu_name, c.problem.m): c for c in database.overview()}
    assert set(cells) == {("NVIDIA A100", 1024), ("NVIDIA H100 80GB HBM3", 1024)}
    h100 = cells[("NVIDIA H100 80GB HBM3", 1024)]
    assert (h100.best_gflops, h100.family, h100.gpu_uuid, h100.run_id) == (
        1600.0, "warptile", "GPU-second", h100_b)
    assert h100.fraction_of_cublas == pytest.approx(0.8)
    assert cells[("NVIDIA A100", 1024)].fraction_of_cublas is None


def test_results_are_plain_frozen_dataclasses(database: db.Database) -> None:
    run_id = new_run(database)
    database.add_trial(run_id, ok(0, 100.0))
    best = database.best("NVIDIA H100 80GB HBM3", 1024, 1024, 1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        best.gflops = 1.0  # type: ignore[misc]
    database.close()  # nothing returned may depend on an open session
    assert dataclasses.asdict(best)["problem"]["m"] == 1024


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("make", "names"), [
    (lambda: db.TrialRecord(0, {"BM": 64}, "slow"), ["'slow'", "'compile_error'", "'missing'"]),
    (lambda: db.TrialRecord(-1, {"BM": 64}, "rejected"), ["-1", ">= 0"]),
    (lambda: db.TrialRecord(0, {"BM": "64"}, "rejected"), ["params", "str → int"]),
    (lambda: db.TrialRecord(0, {"BM": 64}, "ok", gflops=10.0), ["'ok'", "time_median_ms"]),
    (lambda: db.TrialRecord(0, {"BM": 64}, "ok", time_median_ms=1.0, gflops=1.0,
                            occupancy=1.5), ["1.5", "0..1"]),
    (lambda: gpu_info(uuid=" "), ["GPU uuid", "non-empty"]),
    (lambda: gpu_info(sm_count=0), ["GPU sm_count", "0", "positive int"]),
])
def test_bad_trial_records_are_refused_with_what_is_allowed(make, names: list[str]) -> None:
    with pytest.raises(db.InvalidInputError) as caught:
        make()
    assert isinstance(caught.value, ValueError)
    for name in names:
        assert name in str(caught.value)


def test_bad_arguments_name_the_value_and_nothing_is_written(database: db.Database) -> None:
    run_id = new_run(database)
    database.add_trial(run_id, ok(0, 100.0))
    cases = [
        (lambda: database.ensure_problem(0, 1024, 1024), ["m", "0", "positive int"]),
        (lambda: database.ensure_problem(64, 64, 64, dtype="float32"), ["'float32'", "'fp32'"]),
        (lambda: database.ensure_family("warptile", "abc"), ["'abc'", "sha256"]),
        (lambda: database.best("NVIDIA H100 80GB HBM3", 1024, -8, 1024), ["n", "-8"]),
        (lambda: database.add_trial(run_id, ok(0, 5.0)), ["trial number 0", f"run {run_id}"]),
        (lambda: database.finish_run(run_id, "done"), ["'done'", "'finished'", "'interrupted'"]),
        (lambda: database.trials(run_id, state="fine"), ["'fine'", "'wrong_result'"]),
        (lambda: database.list_runs(state="paused"), ["'paused'", "'running'"]),
        (lambda: database.trials(run_id, limit=0), ["limit", "0"]),
        (lambda: database.add_trial(str(run_id), ok(1, 5.0)), ["run id", f"'{run_id}'"]),
        (lambda: database.start_run(gpu_id=999, problem_id=1, family_id=1, sampler="tpe",
                                    seed=None, budget={}, host="h", command="c",
                                    study_name=None), ["gpu_id", "999", "gt_gpus"]),
        (lambda: new_run(database, stale_after_s=0), ["stale_after_s", "0", "positive number of seconds"]),
        (lambda: database.interrupt_stale_runs(float("nan")), ["stale_after_s", "nan"]),
    ]
    for call, names in cases:
        with pytest.raises(db.InvalidInputError) as caught:
            call()
        for name in names:
            assert name in str(caught.value), (name, str(caught.value))
    assert [t.gflops for t in database.run_history(run_id)] == [100.0]
    assert len(database.list_runs()) == 1 and len(database.list_problems()) == 1


def test_unknown_run_id_is_a_lookup_and_value_error(database: db.Database) -> None:
    run_id = new_run(database)
    for call in (lambda: database.get_run(run_id + 100),
                 lambda: database.add_trial(run_id + 100, ok(0, 1.0)),
                 lambda: database.finish_run(run_id + 100, "failed"),
                 lambda: database.trials(run_id + 100),
                 lambda: database.count_trials(run_id + 100),
                 lambda: database.top_k_for_run(run_id + 100)):
        with pytest.raises(db.UnknownRunError, match=f"unknown run id {run_id + 100}") as caught:
            call()
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, LookupError)
    assert database.run_history(run_id) == []
