"""Workload files (db/workloads.py): round trip and refusals; `python -m tuner --workload` tunes
their problems largest share first and stores the workload; the API and the dashboard show the
share of its GEMM time that tuned kernels serve. CPU only: the tuner replays a recording."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

import db
import kernels
from api.app import create_app
from tuner.measure.record import record_with_evaluator
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem
from tuner.run.cli import main, parse_args
from tuner.run.options import EXIT_OK

NAIVE = kernels.FAMILIES["naive"]
TUNED = Problem(384, 256, 512)  # in the recording
ALSO = Problem(128, 128, 128)  # in the recording, and tuned too
NEVER = Problem(96, 80, 72, layout="nt", batch=4)  # in no recording: nothing tuned


def workload(problems=((TUNED, 0.6, 12), (NEVER, 0.3, 40), (ALSO, 0.1, 3))) -> dict:
    return {"format": "gemmtune-workload", "version": 1, "gpu": "Replay Test GPU", "label": "test", "gemm_ms": 2.5,
            "skipped": {}, "problems": [{"m": p.m, "n": p.n, "k": p.k, "layout": p.layout, "batch": p.batch,
                                         "count": count, "share": share, "time_ms": 2.5 * share}
                                        for p, share, count in problems]}


def test_a_workload_file_round_trips_and_lists_largest_share_first(tmp_path):
    path = db.write_workload(workload(), tmp_path / "w.json")
    data = db.read_workload(path)
    problems = db.workloads.check_workload(data, str(path))
    assert [(p.m, p.n, p.k, p.layout, p.batch) for p in problems] == [
        (384, 256, 512, "nn", 1), (96, 80, 72, "nt", 4), (128, 128, 128, "nn", 1)]
    assert problems[1].label == "4x96x80x72:nt" and problems[1].count == 40


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    (json.dumps({"format": "something else"}), "is not a gemmtune workload"),
    (json.dumps(dict(workload(), version=7)), "version 7"),
    (json.dumps(dict(workload(), problems=[])), "non-empty list"),
    (json.dumps(dict(workload(), problems=[{"m": 4, "n": 4, "k": 0}])), r"problem 0 .*positive integers"),
    (json.dumps(dict(workload(), problems=[{"m": 4, "n": 4, "k": 4, "layout": "row-major"}])), "nn, nt, tn, tt"),
    (json.dumps(dict(workload(), problems=[{"m": 4, "n": 4, "k": 4, "share": 1.5}])), "share in 0..1"),
])
def test_a_bad_workload_is_refused_naming_the_file_and_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(db.WorkloadError, match=message) as caught:
        db.read_workload(path)
    assert str(path) in str(caught.value)


def test_the_tuner_takes_a_workloads_problems_after_the_shapes_largest_share_first(tmp_path, capsys):
    path = db.write_workload(workload(), tmp_path / "w.json")
    options = parse_args(["--workload", str(path), "--shape", "64x64x64"])
    assert options.problems == [Problem(64, 64, 64), TUNED, NEVER, ALSO] and options.shapes_named
    assert options.workload[0] == "w.json"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--workload", str(tmp_path / "bad.json")])
    assert exit_.value.code == 2 and "--workload" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--workload", str(path), "--worker"])
    assert "a --worker takes its problems from the job queue" in capsys.readouterr().err


def test_a_tuned_workload_shows_the_share_of_its_gemm_time_that_tuned_kernels_serve(tmp_path, capsys):
    recording = record_with_evaluator(StandInEvaluator(gpu_name="Replay Test GPU", gpu_uuid="GPU-replay-fixture"),
                                      [NAIVE], [TUNED, ALSO], max_configs=200, note="test fixture (stand-in model)")
    rec = recording.save(tmp_path / "fixture.json.gz")
    path = db.write_workload(workload(((TUNED, 0.6, 12), (ALSO, 0.4, 3))), tmp_path / "w.json")
    url = f"sqlite:///{tmp_path / 'w.sqlite'}"
    assert main(["--replay", str(rec), "--db", url, "--workload", str(path), "--kernel", "naive",
                 "--trials", "5", "--patience", "0"]) == EXIT_OK
    bars = capsys.readouterr().err  # each study's progress bar says where it stands in the command
    assert "[1/2] naive 384x256x512" in bars and "[2/2] naive 128x128x128" in bars
    with db.open_database(url) as database:
        [stored] = database.list_workloads()
        # the stand-in's cuBLAS (18 TFLOP/s) beats every naive config; a slower cuBLAS measured
        # later on one problem makes the tuned kernel the faster one there
        [gpu] = database.list_gpus()
        database.add_baseline(gpu_id=gpu.id, problem_id=database.ensure_problem(TUNED.m, TUNED.n, TUNED.k),
                              time_median_ms=1e3, gflops=1.0)
        assert database.best(gpu.name, ALSO.m, ALSO.n, ALSO.k, nearest=False).fraction_of_cublas < 1
    expected = 0.6
    client = TestClient(create_app(url))
    answer = client.get(f"/api/workloads/{stored.id}").json()
    assert answer["gpu"] == "Replay Test GPU" and answer["name"] == "w.json"
    assert answer["served_share"] == pytest.approx(expected)
    assert [p["label"] for p in answer["problems"]] == ["384x256x512", "128x128x128"]
    assert all(p["best"]["family"] == "naive" for p in answer["problems"])
    # how far tuning came, per problem: one finished run of 5 measured trials each
    assert [p["tuning"] for p in answer["problems"]] == [
        {"runs": 1, "running": 0, "measured": 5, "latest_run": p["tuning"]["latest_run"]} for p in answer["problems"]]
    assert not answer["running"] and all(p["tuning"]["latest_run"] for p in answer["problems"])
    page = client.get(f"/workloads/{stored.id}")
    assert page.status_code == 200 and f"{100 * expected:.1f}%" in page.text and "384×256×512" in page.text
    assert client.get("/workloads").status_code == 200
    assert client.get("/api/workloads/999").status_code == 404


def test_a_budget_is_shared_by_the_workloads_shares_of_gemm_time(tmp_path):
    """With --budget, each study's time is its problem's share of what the studies still to run
    weigh (a --shape beside the workload weighs an average share); time a study leaves unused
    goes to the later ones in proportion."""
    from tuner.run.session import MIN_STUDY_SECONDS, time_share

    path = db.write_workload(workload(), tmp_path / "w.json")
    options = parse_args(["--workload", str(path), "--shape", "64x64x64", "--budget", "100"])
    assert options.weights == {TUNED: 0.6, NEVER: 0.3, ALSO: 0.1, Problem(64, 64, 64): 1 / 3}
    weights = [0.6, 0.3, 0.1]
    assert time_share(100.0, weights, 0) == pytest.approx(60.0)
    assert time_share(70.0, weights, 1) == pytest.approx(52.5)  # the first used 30 s of its 60
    assert time_share(5.0, weights, 2) == MIN_STUDY_SECONDS  # never less than a study's floor
    assert time_share(90.0, [0.0, 0.0, 0.0], 0) == pytest.approx(30.0)  # no shares: equal parts
    assert parse_args(["--shape", "64x64x64"]).weights == {}  # no workload: equal parts
