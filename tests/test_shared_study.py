"""bench/shared_study.py on CPU: two stand-in workers on one GPU index (issue 17 part 3).

The workers are real ``python -m tuner`` processes with the CPU stand-in GPU backend
(GEMMTUNE_GPU_BACKEND=tuner.testing) against PostgreSQL: GEMMTUNE_TEST_PG_URL (source
.ci/postgres.sh), else a private server from the pgserver wheel, else the test is skipped.
Only the mechanics are checked (no config measured twice, the killed worker's claim retried);
stand-in timings say nothing about a speed-up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import db
from bench_support import bench_module
from db.testing import PG_URL_ENV, postgres_available
from tuner.measure.testing import MEASURE_ENV

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "shared_study.py"

needs_server = pytest.mark.skipif(
    not postgres_available() and importlib.util.find_spec("pgserver") is None,
    reason=f"needs {PG_URL_ENV} (source .ci/postgres.sh) or the pgserver wheel")


def run_script(*args: str, measure_s: float) -> subprocess.CompletedProcess:
    """bench/shared_study.py with the CPU stand-in GPU (each evaluation taking measure_s) on the
    test server, or the script's own pgserver."""
    argv = [sys.executable, str(SCRIPT), *args]
    if postgres_available():
        argv += ["--storage", os.environ[PG_URL_ENV]]
    env = os.environ | {"GEMMTUNE_GPU_BACKEND": "tuner.testing", MEASURE_ENV: str(measure_s),
                        "PYTHONPATH": os.pathsep.join(filter(None, [
                            str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _shared_study():
    bench_module("throughput")  # what the script imports from its own folder
    return bench_module("shared_study")


@needs_server
def test_two_workers_on_one_gpu_share_the_study_and_retry_a_killed_claim(tmp_path):
    out = tmp_path / "shared.json"
    # 36 of naive's 48 configs: with 12, a loaded CI host started worker 2's study after worker
    # 1 had measured the whole budget (1 of 4 local runs beside a busy loop), and the survivor
    # could finish before the killed claim went stale
    # 0.25 s per evaluation: the survivor, measuring alone once worker 2 is killed, cannot
    # finish the budget before the killed claim goes stale (2 s); at the stand-in's instant
    # answers it did on a loaded CI host (2 of about ten CI runs), and at 0.1 s once more
    # (no claim failed as stale)
    done = run_script("--gpus", "0,0", "--shape", "128x128x128", "--family", "naive", "--trials", "36",
                      "--repeats", "2", "--timeout", "30", "--kill-after", "0", "--heartbeat", "0.5",
                      "--stale-after", "2", "--cache", str(tmp_path / "cubins"), "--out", str(out),
                      "--retime-rounds", "0", measure_s=0.25)  # re-timing: the one-command test
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[kill] ended" in done.stdout and "mechanics only" in done.stdout

    result = json.loads(out.read_text())
    assert result["complete"] is True and result["mode"].startswith("mechanics only")
    assert result["backend"] == "tuner.testing"
    assert result["devices"] == ["Stand-in GPU (analytic model)"]
    assert len(result["repeats"]) == 2 and "[single2] ended" in done.stdout
    for repeat in result["repeats"]:
        [(key, single)] = repeat["single"]["studies"].items()
        assert key == "naive 128x128x128" and single["best_gflops"] > 0
        assert single["time_to_target_s"] is not None and single["duplicates"] == 0
        # every level of its own best is reached, the lower ones no later than the best
        levels = single["time_to_level_s"]
        assert list(levels) == ["0.95", "0.98", "0.99", "0.995"]
        assert levels["0.995"] == single["time_to_target_s"]
        assert sorted(levels.values()) == list(levels.values())
        assert single["budget_done_s"] >= single["best_found_s"]
        pair = repeat["pair"]
        assert len(pair["workers"]) == 2 and all(w["returncode"] == 0 for w in pair["workers"])
        assert pair["duplicates"] == 0
        assert {w["gpu"] for w in pair["workers"]} == {0}
        assert sum(r["measured"] > 0 for r in pair["studies"][key]["runs"]) == 2, "both measured"
        assert set(repeat["speedup"]) == {"per_study", "single_s", "pair_s", "overall", "levels",
                                          "budget"}

    kill = result["kill"]
    survivor, victim = kill["workers"]
    assert survivor["returncode"] == 0 and victim["returncode"] == -9  # SIGKILL
    assert kill["killed_claims"], "worker 2 was killed holding a claim"
    stale = [c for c in kill["killed_claims"] if c["failed_as_stale"]]
    assert stale and all(c["retried"] and c["measured_by_w1"] for c in stale), json.dumps(kill)
    assert kill["retried"] is True and kill["duplicates"] == 0

    verdicts = result["verdicts"]
    assert verdicts["duplicates"] == {"value": 0, "target": 0, "met": True}
    assert verdicts["retried"]["met"] is True
    assert verdicts["speedup"]["met"] is None and verdicts["speedup"]["value"] is None
    speed = result["speedup"]
    assert speed["repeats"] == 2 and len(speed["per_repeat"]) == 2
    phases = [r[p] for r in result["repeats"] for p in ("single", "pair")] + [kill]
    assert len({w["log"] for p in phases for w in p["workers"]}) == 2 * 3 + 2, "a log each"
    assert all(Path(w["log"]).exists() and "--claim-trials" in w["command"]
               for p in phases for w in p["workers"])


def test_the_speed_up_is_the_median_over_repeats_a_pair_that_never_reached_counting_as_0():
    shared = _shared_study()
    assert shared.median_speedup([2.0, None, 1.8]) == 1.8
    assert shared.median_speedup([None, None, 1.8]) == 0.0
    assert shared.median_speedup([1.5, 1.9]) == pytest.approx(1.7)


@pytest.mark.parametrize("gpus", ["0", "a,b", "-1,0"])
def test_gpus_must_name_device_indices(gpus, capsys):
    with pytest.raises(SystemExit) as exit_:
        _shared_study().parse_args([f"--gpus={gpus}"])
    assert exit_.value.code == 2
    assert "device indices separated by commas, one per worker" in capsys.readouterr().err


def test_repeats_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        _shared_study().parse_args(["--repeats", "0"])
    assert exit_.value.code == 2
    assert "--repeats 0: at least 1" in capsys.readouterr().err


def test_the_kill_must_go_stale_within_the_study_timeout(capsys):
    with pytest.raises(SystemExit) as exit_:
        _shared_study().parse_args(["--timeout", "10", "--kill-after", "5"])
    assert exit_.value.code == 2
    assert "must stay below --timeout 10" in capsys.readouterr().err


@needs_server
def test_one_command_on_two_gpus_is_one_run_measuring_the_budget_once(tmp_path):
    """--one-command: the pair phase is one python -m tuner --gpus 0,1 (stand-in GPUs): one
    run per study, nothing measured twice, the budget met."""
    out = tmp_path / "shared.json"
    done = run_script("--one-command", "--gpus", "0,1", "--shape", "128x128x128", "--family", "naive",
                      "--trials", "12", "--timeout", "60", "--skip-kill", "--cache", str(tmp_path / "cubins"),
                      "--out", str(out), measure_s=0.05)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["mode"] == "2 GPUs, one command (--gpus)" and result["claims"] is True
    verdicts = result["verdicts"]  # the fleet issue's two figures for two GPUs
    assert verdicts["configs_per_s"]["target"] == 1.8 and verdicts["time_to_best"]["target"] == 0.6
    [repeat] = result["repeats"]
    [worker] = repeat["pair"]["workers"]
    assert worker["gpu"] == [0, 1] and "--gpus 0,1" in worker["command"]
    [(key, study)] = repeat["pair"]["studies"].items()
    assert key == "naive 128x128x128" and study["duplicates"] == 0
    assert [r["measured"] for r in study["runs"]] == [12]
    assert "2 GPUs (0, 1; " in Path(worker["log"]).read_text()
    # the stand-in's timing of a config never changes, so re-timing moves no run's time to best
    retimed = repeat["retimed"]["per_study"][key]
    assert retimed["single_best_retimed_gflops"] == retimed["single_best_measured_gflops"]
    assert retimed["single"]["time_to_target_s"] == repeat["single"]["studies"][key]["time_to_target_s"]
    assert retimed["pair"]["time_to_target_s"] == study["time_to_target_s"]
    assert retimed["retimed"][0]["params"] == repeat["single"]["studies"][key]["best_params"]
    assert "by re-timed speeds" in verdicts["time_to_best"]["note"]


def _trial(number: int, params: dict[str, int], gflops: float, at_s: float) -> db.Trial:
    return db.Trial(id=number, run_id=1, number=number, params=params, state="ok", error=None,
                    compile_seconds=None, registers=None, shared_bytes=None, spill_bytes=None,
                    occupancy=None, time_min_ms=None, time_median_ms=1.0, time_max_ms=None,
                    launches=None, gflops=gflops, sm_clock_mhz=None, started_at=None,
                    recorded_at=START + timedelta(seconds=at_s))


START = datetime(2026, 11, 29, tzinfo=timezone.utc)


def test_re_timed_speeds_are_one_ruler_for_both_runs():
    """The single run's best was a lucky timing (B at 104): measured, the pair never reaches
    it. Re-timed, B is no faster than A, which the pair measured first: it reached the level
    at 0.5 s, the single run at 1 s. C, measured 10 % below, is not re-timed."""
    shared = _shared_study()
    a, b, c = {"X": 1}, {"X": 2}, {"X": 3}
    alone = shared.StudyTrials(START, [_trial(0, a, 100.0, 1.0), _trial(1, c, 94.0, 2.0),
                                       _trial(2, b, 104.0, 5.0)])
    together = shared.StudyTrials(START, [_trial(0, a, 99.0, 0.5), _trial(1, c, 93.0, 0.6)])
    assert shared.retime_candidates(alone, together) == [b, a]
    assert together.first_at_or_above(104.0 * (1 - shared.BEST_TOLERANCE)) is None
    speeds = {"naive 8x8x8": {shared.params_key(a): 101.0, shared.params_key(b): 101.2}}
    result = shared.retimed_speedups({"naive 8x8x8": alone}, {"naive 8x8x8": together},
                                     speeds, rounds=5)
    row = result["per_study"]["naive 8x8x8"]
    assert row["level_gflops"] == pytest.approx(101.2 * (1 - shared.BEST_TOLERANCE))
    assert row["single"]["time_to_target_s"] == 1.0 and row["single"]["params"] == a
    assert row["pair"]["time_to_target_s"] == 0.5
    assert row["speedup"] == result["overall"] == 2.0
    assert row["time_to_level_s"]["0.98"] == {"single": 1.0, "pair": 0.5}
    assert result["levels"] == {"0.98": 2.0, "0.99": 2.0, "0.995": 2.0}
    summary = shared.summary([{"speedup": {"overall": None, "levels": {"0.95": None},
                                           "budget": 1.0}, "retimed": result}])
    assert summary["retimed"]["levels"]["0.99"] == 2.0


def test_without_claims_the_runs_say_so_and_only_one_command_may(capsys):
    shared = _shared_study()
    args = shared.parse_args(["--one-command", "--no-claims", "--skip-kill"])
    argv = shared.tuner_argv(args, (0, 1), ("db", "storage"), Path("cache"), [("naive", "64x64x64")],
                             kill=False)
    assert "--no-claim-trials" in argv and "--claim-trials" not in argv
    assert shared.out_path(args, []).name == "shared_study-gpu-one-command-2-no-claims.json"
    claimed = shared.parse_args(["--one-command", "--skip-kill"])
    assert "--claim-trials" in shared.tuner_argv(claimed, (0, 1), ("db", "storage"), Path("cache"),
                                                 [("naive", "64x64x64")], kill=False)
    for refused in (["--no-claims", "--skip-kill"], ["--one-command", "--no-claims"]):
        with pytest.raises(SystemExit):
            shared.parse_args(refused)
        assert "--no-claims needs --one-command and --skip-kill" in capsys.readouterr().err


def test_one_command_needs_distinct_gpus(capsys):
    with pytest.raises(SystemExit):
        _shared_study().parse_args(["--one-command", "--gpus=0,1,1"])
    assert "--one-command measures on distinct GPUs: --gpus 0,1,1 names one twice" in capsys.readouterr().err


def test_more_than_two_gpus_are_one_tuners(capsys):
    assert _shared_study().parse_args(["--one-command", "--gpus=0,1,2,3"]).gpus == (0, 1, 2, 3)
    with pytest.raises(SystemExit):
        _shared_study().parse_args(["--gpus=0,1,2,3"])
    assert "more GPUs need --one-command" in capsys.readouterr().err
