"""``python -m tuner --replay`` end to end without a GPU: recording → tuner → SQLite → db → API.

The recording is a TEST FIXTURE made with the analytic stand-in evaluator (see
tests/test_replay_format.py); what is checked is that the replay path stores exactly what
the recording holds and that the best config comes back through ``db`` and the API."""

from __future__ import annotations

import db
import kernels
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tuner.measure.record import record_with_evaluator
from tuner.measure.recording import load
from tuner.measure.replay import ReplayEvaluator
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem
from tuner.run.cli import main
from tuner.run.options import EXIT_OK, EXIT_USAGE

NAIVE = kernels.FAMILIES["naive"]
SMEM = kernels.FAMILIES["smem"]
P = Problem(384, 256, 512)
OTHER = Problem(128, 128, 128)


def _fault(config: dict[str, int]) -> str | None:
    return "launch_error" if config.get("BX") == 128 else None


@pytest.fixture(scope="module")
def recording_path(tmp_path_factory):
    recording = record_with_evaluator(
        StandInEvaluator(gpu_name="Replay Test GPU", gpu_uuid="GPU-replay-fixture", fault=_fault),
        [NAIVE, SMEM], [P, OTHER], max_configs=1000, note="test fixture (stand-in model)")
    return recording.save(tmp_path_factory.mktemp("rec") / "fixture.json.gz")


def _tune(path, url, *extra: str) -> int:
    return main(["--replay", str(path), "--db", url, "--patience", "0", *extra])


def test_replay_tunes_into_sqlite_and_the_best_comes_back_through_db_and_api(recording_path, tmp_path):
    recording = load(recording_path)
    url = f"sqlite:///{tmp_path / 'replay.sqlite'}"
    n_naive = len(NAIVE.accepted_configs())
    # a budget of the whole space: the search must end on the recorded optimum
    assert _tune(recording_path, url, "--kernel", "naive", "--shape", P.shape,
                 "--trials", str(n_naive), "--seed", "3") == EXIT_OK

    config, gflops = recording.optimum("naive", P)
    with db.open_database(url) as database:
        [gpu] = database.list_gpus()
        assert (gpu.name, gpu.uuid) == ("Replay Test GPU", "GPU-replay-fixture")
        [run] = database.list_runs()
        assert run.family == "naive" and run.source_hash == recording.families["naive"].source_hash
        # --sampler default runs the learned model where the space is listed, and says so
        assert run.state == "finished" and run.sampler == "model"
        trials = database.run_history(run.id)
        counts = database.count_trials(run.id)
        assert counts["missing"] == 0 and counts["launch_error"] > 0
        for trial in trials:  # every stored measurement is the recorded one
            if trial.state == "rejected":
                continue
            recorded = recording.result("naive", P, trial.params)
            assert trial.state == recorded.state and trial.gflops == recorded.gflops
            assert trial.registers == recorded.registers and trial.occupancy == recorded.occupancy
        best = database.best("Replay Test GPU", P.m, P.n, P.k, family="naive")
        assert best.match == "exact" and best.params == config and best.gflops == gflops
        assert best.baseline_gflops == recording.problem(P).baseline_result().gflops

    with TestClient(create_app(url)) as client:
        answer = client.get("/api/best", params={"gpu": "Replay Test GPU", "m": P.m, "n": P.n,
                                                 "k": P.k, "kernel": "naive"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["match"] == "exact" and body["best"]["config"] == config
        assert body["best"]["gflops"] == pytest.approx(gflops)
        assert body["best"]["cublas_gflops"] == pytest.approx(best.baseline_gflops)


def test_replay_defaults_to_every_recorded_family_and_shape(recording_path, tmp_path):
    url = f"sqlite:///{tmp_path / 'all.sqlite'}"
    assert _tune(recording_path, url, "--trials", "5") == EXIT_OK
    with db.open_database(url) as database:
        runs = database.list_runs()
        assert sorted((r.family, (r.problem.m, r.problem.n, r.problem.k)) for r in runs) == sorted(
            (f, (p.m, p.n, p.k)) for f in ("naive", "smem") for p in (P, OTHER))


def test_configs_absent_from_the_recording_are_missing(recording_path, tmp_path):
    recording = load(recording_path)
    table = recording.problem(P).results["naive"]
    for values in list(table)[::2]:  # forget every other config
        del table[values]
    partial = recording.save(tmp_path / "partial.json.gz")
    url = f"sqlite:///{tmp_path / 'partial.sqlite'}"
    assert _tune(partial, url, "--kernel", "naive", "--shape", P.shape, "--trials", "30") == EXIT_OK
    with db.open_database(url) as database:
        [run] = database.list_runs()
        missing = database.trials(run.id, state="missing")
        assert missing and all(recording.result("naive", P, t.params) is None for t in missing)
        assert all("not in the recording" in t.error for t in missing)


def test_bad_replay_input_is_refused_and_stores_nothing(recording_path, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'refused.sqlite'}"
    assert _tune(recording_path, url, "--shape", "64x64x64") == EXIT_USAGE
    assert "64x64x64 not in the recording; recorded: 384x256x512, 128x128x128" in capsys.readouterr().err
    assert _tune(recording_path, url, "--kernel", "warptile") == EXIT_USAGE
    assert "no family 'warptile'; it recorded naive, smem" in capsys.readouterr().err
    junk = tmp_path / "junk.json.gz"
    junk.write_text("{}")
    assert _tune(junk, url) == EXIT_USAGE
    assert "not a valid gemmtune recording" in capsys.readouterr().err
    assert not (tmp_path / "refused.sqlite").exists()


def test_replayed_family_searches_only_the_recorded_grid(tmp_path):
    recording = record_with_evaluator(StandInEvaluator(), [NAIVE], [P], max_configs=1000,
                                      grid={"naive": {"BX": (16, 32)}})
    family = ReplayEvaluator(recording).family(NAIVE)
    assert dict((p.name, p.values) for p in family.params)["BX"] == (16, 32)
    assert family.source_hash == NAIVE.source_hash and family.threads({"BX": 16, "BY": 4, "COALESCED": 1}) == 64
    assert family.reject_reasons({"BX": 64, "BY": 4, "COALESCED": 1}) == [
        "BX=64 is outside the recorded grid [16, 32]"]
