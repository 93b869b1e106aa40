"""`python -m tuner.record --resume`: a recording cut short (e.g. by --time-limit) is finished
by measuring only what it lacks; a file of another command or GPU is refused."""

from __future__ import annotations

import pytest

import kernels
from tuner.measure.record import ResumeError, parse_grid, record_with_evaluator
from tuner.measure.recording import load
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem

NAIVE = kernels.FAMILIES["naive"]
PROBLEMS = [Problem(64, 96, 32), Problem(33, 17, 129)]


class Counting(StandInEvaluator):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.evaluated: list[tuple[Problem, tuple]] = []

    def evaluate(self, family, config, problem):
        self.evaluated.append((problem, tuple(sorted(config.items()))))
        return super().evaluate(family, config, problem)


def _cut_short(recording, keep_on_last: int):
    """As --time-limit leaves it: the first problem whole, the last one's first configs only."""
    last = recording.problems[-1].results[NAIVE.name]
    for values in list(last)[keep_on_last:]:
        del last[values]
    return recording


def test_resume_measures_only_what_is_missing_and_ends_as_a_full_recording(tmp_path):
    full = record_with_evaluator(StandInEvaluator(), [NAIVE], PROBLEMS, max_configs=1000)
    per_problem = len(full.problems[0].results[NAIVE.name])
    assert per_problem > 3
    partial = _cut_short(record_with_evaluator(StandInEvaluator(), [NAIVE], PROBLEMS,
                                               max_configs=1000), keep_on_last=3)
    path = partial.save(tmp_path / "partial.json.gz")

    counting = Counting()
    resumed = record_with_evaluator(counting, [NAIVE], PROBLEMS, max_configs=1000,
                                    resume=load(path))
    assert len(counting.evaluated) == per_problem - 3
    assert {p for p, _ in counting.evaluated} == {PROBLEMS[-1]}
    for entry in full.problems:
        got = resumed.problem(entry.problem)
        assert got is not None and got.baseline_result() == entry.baseline_result()
        assert got.results[NAIVE.name].keys() == entry.results[NAIVE.name].keys()
        for values, result in entry.results[NAIVE.name].items():
            assert got.results[NAIVE.name][values].gflops == result.gflops

    again = Counting()
    record_with_evaluator(again, [NAIVE], PROBLEMS, max_configs=1000, resume=resumed)
    assert again.evaluated == []  # nothing left


def test_a_recording_of_another_grid_or_gpu_is_refused_naming_what_differs(tmp_path):
    partial = _cut_short(record_with_evaluator(StandInEvaluator(), [NAIVE], PROBLEMS,
                                               max_configs=1000), keep_on_last=1)
    other_grid = parse_grid([f"naive:{NAIVE.params[0].name}={NAIVE.params[0].values[0]}"],
                            [NAIVE])
    with pytest.raises(ResumeError, match="naive's grid"):
        record_with_evaluator(StandInEvaluator(), [NAIVE], PROBLEMS, max_configs=1000,
                              grid=other_grid, resume=partial)
    partial.gpu = {**partial.gpu, "name": "Some Other GPU"}
    with pytest.raises(ResumeError, match="recorded on Some Other GPU"):
        record_with_evaluator(StandInEvaluator(), [NAIVE], PROBLEMS, max_configs=1000,
                              resume=partial)
