"""Kernel Tuner formats on CPU: T4 export of a run, cache → recording → cache round trips.

Recordings here are TEST FIXTURES from the analytic stand-in evaluator."""

from __future__ import annotations

import json

import db
import kernels
import pytest

from tuner.run.cli import main as tuner_main
from tuner.measure.kerneltuner import (
    INVALIDITY,
    KernelTunerFormatError,
    cache_from_recording,
    main,
    recording_from_cache,
)
from tuner.measure.record import record_with_evaluator
from tuner.measure.recording import load
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem

NAIVE = kernels.FAMILIES["naive"]
P = Problem(256, 512, 128)


def _fault(config: dict[str, int]) -> str | None:
    if config["BX"] == 128:
        return "compile_error"
    return "launch_error" if config["BY"] == 32 else None


@pytest.fixture(scope="module")
def recording():
    return record_with_evaluator(StandInEvaluator(fault=_fault), [NAIVE], [P], max_configs=1000)


def test_cache_round_trip_keeps_states_and_times(recording, tmp_path):
    cache = json.loads(json.dumps(cache_from_recording(recording, "naive", P)))
    assert cache["tune_params_keys"] == ["BX", "BY", "COALESCED"]
    assert all(key.count(",") == 2 for key in cache["cache"])
    back = recording_from_cache(cache, NAIVE, P, gpu=recording.gpu)
    original = dict((tuple(c.values()), r) for c, r in recording.results("naive", P))
    again = dict((tuple(c.values()), r) for c, r in back.results("naive", P))
    assert again.keys() == original.keys()
    for key, before in original.items():
        after = again[key]
        assert after.state == before.state  # this fixture has no wrong_result/timeout/crashed
        if before.usable:
            assert after.gflops == pytest.approx(before.gflops)
            assert after.time_median_ms == pytest.approx(before.time_median_ms)
            assert after.time_min_ms == pytest.approx(before.time_min_ms)
    assert back.families["naive"].selection.mode == "full"
    assert back.optimum("naive", P)[0] == recording.optimum("naive", P)[0]


def test_import_cli_of_a_kernel_tuner_cache(tmp_path, capsys):
    # a cache as Kernel Tuner writes it: time in ms (mean), error markers, restriction misses
    cache = {
        "schema_version": "1.0.0", "device_name": "NVIDIA H100 80GB HBM3", "kernel_name": "gemm",
        "problem_size": [256, 512, 128], "tune_params_keys": ["COALESCED", "BX", "BY"],
        "tune_params": {"COALESCED": [0, 1], "BX": [16, 32], "BY": [4, 8]}, "objective": "time",
        "cache": {
            "1,32,8": {"time": 0.05, "times": [0.049, 0.05, 0.052], "compile_time": 800.0},
            "1,16,8": {"time": 0.08, "times": [0.08], "compile_time": 700.0},
            "0,32,4": {"time": "CompilationFailedConfig", "compile_time": 10.0},
            "0,16,4": {"time": "RuntimeFailedConfig"},
            "0,16,8": {"time": "InvalidConfig"},
            "1,32,4": {"time": 1e20},
        },
    }
    path = tmp_path / "gemm_cache.json"
    # Kernel Tuner leaves the file open-ended while it is still tuning
    path.write_text(json.dumps(cache)[:-2] + ",")
    out = tmp_path / "imported.json.gz"
    assert main(["import", str(path), "--family", "naive", "--shape", "256x512x128",
                 "--out", str(out)]) == 0
    recording = load(out)
    results = {tuple(c.values()): r for c, r in recording.results("naive", P)}
    assert set(results) == {(32, 8, 1), (16, 8, 1), (32, 4, 0), (16, 4, 0), (32, 4, 1)}
    best = results[(32, 8, 1)]
    assert best.state == "ok" and best.gflops == pytest.approx(2 * 256 * 512 * 128 / 0.05e-3 / 1e9)
    assert best.time_min_ms == 0.049 and best.launches == 3 and best.compile_seconds == 0.8
    assert results[(32, 4, 0)].state == "compile_error"
    assert results[(16, 4, 0)].state == "launch_error" and results[(32, 4, 1)].state == "launch_error"
    header = recording.families["naive"]
    assert header.grid == {"BX": (16, 32), "BY": (4, 8), "COALESCED": (0, 1)}
    assert header.selection.mode == "imported" and "not a uniform sample" in header.selection.text
    assert recording.gpu["name"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("spoil, words", [
    (lambda c: c.pop("cache"), "not a Kernel Tuner cache"),
    (lambda c: c.update(tune_params_keys=["BX", "BY"]), "do not match the parameters"),
    (lambda c: c["cache"].update({"8,1": {"time": 1.0}}), "2 values for 3 parameters"),
    (lambda c: c["cache"].update({"7,1,1": {"time": 1.0}}), "BX=7 not allowed"),
    (lambda c: c["cache"].update({"8,1,1": {"time": "Exploded"}}), "not a number nor a known error"),
])
def test_bad_caches_are_refused(recording, spoil, words):
    cache = json.loads(json.dumps(cache_from_recording(recording, "naive", P)))
    spoil(cache)
    with pytest.raises(KernelTunerFormatError, match=words):
        recording_from_cache(cache, NAIVE, P)


def test_export_of_a_replayed_run_is_a_t4_results_file(recording, tmp_path):
    rec_path = recording.save(tmp_path / "rec.json.gz")
    url = f"sqlite:///{tmp_path / 'kt.sqlite'}"
    assert tuner_main(["--replay", str(rec_path), "--db", url, "--trials", "15",
                       "--patience", "0"]) == 0
    with db.open_database(url) as database:
        [run] = database.list_runs()
        trials = database.run_history(run.id)
    out = tmp_path / "t4.json"
    assert main(["export", "--run", str(run.id), "--db", url, "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["schema_version"] == "1.0.0"
    results = document["results"]
    assert [r["configuration"] for r in results] == [t.params for t in trials]
    for entry, trial in zip(results, trials):
        assert set(entry) >= {"configuration", "times", "invalidity", "correctness"}
        assert entry["invalidity"] == INVALIDITY[trial.state]
        measured = {m["name"]: m["value"] for m in entry["measurements"]}
        if trial.state == "ok":
            assert measured["time"] == trial.time_median_ms and measured["GFLOP/s"] == trial.gflops
            assert entry["times"]["compilation"] == trial.compile_seconds
    assert {r["invalidity"] for r in results} >= {"correct"}
    assert main(["export", "--run", "999", "--db", url, "--out", str(out)]) == 2
