"""bench/recording_noise.py: re-timing a recording's best configs says whether its optimum is a
real one or one lucky timing."""

from __future__ import annotations

import json

import pytest

import kernels
from bench.recording_noise import main, parse_pair, summarise
from tuner.measure.record import record_with_evaluator
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem

from stand_in_gpu import stand_in_gpu  # noqa: F401 (a fixture)

NAIVE = kernels.FAMILIES["naive"]
PROBLEM = Problem(67, 45, 33)


def _recording(tmp_path):
    recording = record_with_evaluator(StandInEvaluator(), [NAIVE], [PROBLEM], max_configs=50)
    return recording, recording.save(tmp_path / "naive.json.gz")


def _swept_then_retimed(tmp_path, workers: int):
    """A recording of 4 naive configs made by the sweep on this (or the stand-in) GPU, and the
    re-timing's row of its 3 fastest, 2 rounds each."""
    from tuner.measure.record import sweep_gpu

    recording = sweep_gpu([NAIVE], [PROBLEM], max_configs=4, seed=0, grid={}, workers=workers,
                          progress=False)
    path = recording.save(tmp_path / "swept.json.gz")
    out = tmp_path / "noise.json"
    assert main(["--pair", f"{path}:67x45x33", "--top", "3", "--rounds", "2",
                 "--out", str(out), "--workers", str(workers)]) == 0
    (row,) = json.loads(out.read_text())["pairs"]
    return recording, row


def test_a_lucky_recorded_optimum_shows_in_the_summary():
    # the recording put config 0 3 % above the rest; re-timed, config 2 is the fastest and
    # config 0 is 4 % below it, config 1 within 3 %
    summary = summarise([103.0, 100.0, 99.0], [[96.0, 98.0, 100.0], [96.0, 98.0, 100.0],
                                               [97.0, 97.0, 101.0]])
    assert summary.optimum_rank == 2
    assert summary.optimum_retimed == pytest.approx(96.0 / 100.0)
    assert summary.retimed == pytest.approx([0.96, 0.98, 1.0])
    assert summary.recorded == pytest.approx([1.0, 100 / 103, 99 / 103])
    assert (summary.near_recorded, summary.near_retimed, summary.near_both) == (2, 2, 1)
    assert summary.spread[0] == pytest.approx(1 / 96)


def test_a_stable_optimum_keeps_its_place():
    summary = summarise([100.0, 90.0], [[101.0, 89.0], [99.0, 91.0]])
    assert summary.optimum_rank == 0 and summary.optimum_retimed == 1.0
    assert (summary.near_recorded, summary.near_retimed, summary.near_both) == (1, 1, 1)


def test_rounds_must_match_the_configs():
    with pytest.raises(ValueError, match="one value per recorded config"):
        summarise([1.0, 2.0], [[1.0]])
    with pytest.raises(ValueError, match="no config ran"):
        summarise([1.0], [[0.0]])


def test_a_pair_is_a_recording_and_one_of_its_shapes(tmp_path):
    _, path = _recording(tmp_path)
    pair = parse_pair(f"{path}:67x45x33")
    assert (pair.family, pair.problem) == (NAIVE.name, PROBLEM)


def test_a_pair_names_a_recorded_shape(tmp_path):
    _, path = _recording(tmp_path)
    with pytest.raises(ValueError, match="0 families"):
        parse_pair(f"{path}:64x64x64")
    with pytest.raises(ValueError, match="expected RECORDING:MxNxK"):
        parse_pair("no-shape")


def test_lucky_recorded_timings_show_on_the_stand_in_bench(stand_in_gpu, tmp_path):
    # recorded by the sweep on the stand-in: every single timing 10 % lucky; re-timed, the
    # top configs keep their order and the fastest its place, each 1/1.1 of its recording
    recording, row = _swept_then_retimed(tmp_path, workers=1)
    assert row["optimum_rank"] == 0 and row["spread"] == [0.0, 0.0, 0.0]
    assert row["retimed"] == pytest.approx(row["recorded"])
    recorded = [r.gflops for _, r in recording.fastest(NAIVE.name, PROBLEM, 3)]
    assert [values[0] for values in zip(*row["rounds"])] == pytest.approx(
        [g / 1.1 for g in recorded])


@pytest.mark.gpu
def test_a_pair_of_another_gpu_model_is_skipped(tmp_path, capsys):
    # the stand-in recording is of no real GPU: it must be skipped, not timed
    _, path = _recording(tmp_path)
    out = tmp_path / "noise.json"
    assert main(["--pair", f"{path}:67x45x33", "--out", str(out), "--workers", "1"]) == 0
    assert json.loads(out.read_text())["pairs"] == []
    assert "skipped" in capsys.readouterr().err


@pytest.mark.gpu
def test_re_timing_a_recording_made_on_this_gpu(tmp_path):
    _, row = _swept_then_retimed(tmp_path, workers=2)
    assert len(row["configs"]) == 3 and len(row["rounds"]) == 2
    assert all(v > 0 for values in row["rounds"] for v in values)
    assert max(row["retimed"]) == 1.0 and 0 <= row["optimum_rank"] < 3
