"""`python -m tuner.record --retime-fastest K`: each shape's K fastest configs are timed again
in shuffled rounds and keep their median timing, so one lucky timing no longer sets a
recording's optimum; the other configs keep their single timing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import kernels
from tuner.measure.evaluator import CRASHED, OK
from tuner.measure.record import (build_parser, median_result, record_with_evaluator,
                                  retime_fastest, time_in_rounds)
from tuner.measure.recording import RecordedResult
from tuner.measure.testing import StandInEvaluator
from tuner.problem import Problem

from stand_in_gpu import stand_in_gpu  # noqa: F401 (a fixture)

NAIVE = kernels.FAMILIES["naive"]
PROBLEM = Problem(67, 45, 33)


def _result(gflops: float) -> RecordedResult:
    return RecordedResult(state=OK, gflops=gflops, time_median_ms=1.0)


class Lucky(StandInEvaluator):
    """The stand-in, but each config's first timing is 10 % fast: a recording's single timings
    are then all lucky, and a re-timing sees the stand-in's true rates."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.timed: dict[tuple, int] = {}

    def evaluate(self, family, config, problem):
        m = super().evaluate(family, config, problem)
        key = (problem, tuple(sorted(config.items())))
        self.timed[key] = self.timed.get(key, 0) + 1
        return replace(m, gflops=m.gflops * 1.1) if self.timed[key] == 1 else m


def test_the_median_keeps_a_whole_measurement_and_counts_failures_as_zero():
    results = [_result(10.0), RecordedResult(state=CRASHED), _result(30.0), _result(20.0)]
    assert median_result(results) is results[0]  # 0, 10, 20, 30: the lower middle
    assert median_result(results[:3]) is results[0]
    assert median_result([_result(5.0)]).gflops == 5.0


def test_rounds_time_every_config_once_per_round_in_shuffled_orders():
    order: list[str] = []
    timed = time_in_rounds([{"c": 0}, {"c": 1}, {"c": 2}], 4,
                           lambda config: order.append(config["c"]) or _result(config["c"] + 1),
                           random.Random(3))
    assert [[r.gflops for r in round_] for round_ in timed] == [[1, 2, 3]] * 4
    rounds = [order[i:i + 3] for i in range(0, 12, 3)]
    assert all(sorted(r) == [0, 1, 2] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not one fixed order


def test_retiming_replaces_lucky_timings_of_the_fastest_only():
    evaluator = Lucky()
    recording = record_with_evaluator(evaluator, [NAIVE], [PROBLEM], max_configs=50)
    lucky = {tuple(sorted(c.items())): r.gflops for c, r in recording.results(NAIVE.name, PROBLEM)}
    fastest = [c for c, _ in recording.fastest(NAIVE.name, PROBLEM, 3)]
    assert retime_fastest(recording, NAIVE.name, PROBLEM, 3, 4,
                          lambda config: RecordedResult.from_mapping(
                              evaluator.evaluate(NAIVE, config, PROBLEM).fields()),
                          random.Random(0)) == 3
    for config, result in recording.results(NAIVE.name, PROBLEM):
        key = tuple(sorted(config.items()))
        if config in fastest:  # 4 true timings and 1 lucky one: the median is a true one
            assert result.gflops == pytest.approx(lucky[key] / 1.1)
            assert evaluator.timed[(PROBLEM, key)] == 5
        else:
            assert result.gflops == lucky[key] and evaluator.timed[(PROBLEM, key)] == 1


def test_a_recording_made_with_retiming_says_so():
    recording = record_with_evaluator(Lucky(), [NAIVE], [PROBLEM], max_configs=50, retime=2,
                                      rounds=3)
    assert "the 2 fastest configs of each (family, shape) were timed 3 more times" in \
        recording.note
    plain = record_with_evaluator(Lucky(), [NAIVE], [PROBLEM], max_configs=50)
    for config, result in plain.fastest(NAIVE.name, PROBLEM, 2):
        assert recording.result(NAIVE.name, PROBLEM, config).gflops == pytest.approx(
            result.gflops / 1.1)


def test_a_finished_recording_resumed_with_retiming_is_only_retimed(tmp_path):
    first = record_with_evaluator(StandInEvaluator(), [NAIVE], [PROBLEM], max_configs=50)
    count = sum(1 for _ in first.results(NAIVE.name, PROBLEM))
    evaluator = Lucky()
    again = record_with_evaluator(evaluator, [NAIVE], [PROBLEM], max_configs=50, resume=first,
                                  retime=2, rounds=3)
    assert sum(evaluator.timed.values()) == 2 * 3
    assert sum(1 for _ in again.results(NAIVE.name, PROBLEM)) == count


def test_the_command_line_refuses_a_negative_count():
    parser = build_parser()
    args = parser.parse_args(["--family", "naive", "--shape", "8x8x8", "--retime-fastest", "3"])
    assert (args.retime_fastest, args.retime_rounds) == (3, 4)
    with pytest.raises(SystemExit):
        parser.parse_args(["--family", "naive", "--shape", "8x8x8", "--retime-fastest", "-1"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--family", "naive", "--shape", "8x8x8", "--retime-rounds", "0"])


@pytest.mark.gpu
def test_a_gpu_sweep_with_retiming(tmp_path):
    from tuner.measure.record import sweep_gpu

    recording = sweep_gpu([NAIVE], [PROBLEM], max_configs=4, seed=0, grid={}, workers=2,
                          progress=False, retime=2, rounds=2)
    assert "the 2 fastest configs" in recording.note and "(2 configs)" in recording.note
    assert all(r.usable for _, r in recording.fastest(NAIVE.name, PROBLEM, 2))


SWEPT = Problem(33, 17, 65)


def test_the_gpu_sweep_retimes_the_fastest_on_the_stand_in_bench(stand_in_gpu):
    from tuner.measure.record import sweep_gpu

    recording = sweep_gpu([NAIVE], [SWEPT], max_configs=4, seed=0, grid={}, workers=1,
                          progress=False, retime=2, rounds=3)
    results = dict((tuple(sorted(c.items())), r) for c, r in recording.results(NAIVE.name,
                                                                                SWEPT))
    assert stand_in_gpu.timings == len(results) + 2 * 3
    assert "the 2 fastest configs" in recording.note and "(2 configs)" in recording.note
    # the two fastest lost their lucky 10 %; the others kept their single lucky timing
    unlucky = [r for r in results.values() if r.gflops not in stand_in_gpu.lucky]
    assert len(unlucky) == 2


def test_a_gpu_fault_while_retiming_counts_as_a_crash_and_the_sweep_goes_on(stand_in_gpu):
    from tuner.measure.record import sweep_gpu

    swept = 4  # configs the sweep measures (naive has more: a sample of 4)
    stand_in_gpu.fault_on = swept + 1  # the sweep's configs, then the first re-timing
    recording = sweep_gpu([NAIVE], [SWEPT], max_configs=swept, seed=0, grid={}, workers=1,
                          progress=False, retime=2, rounds=3)
    assert sum(1 for _ in recording.results(NAIVE.name, SWEPT)) == swept
    assert "1 crash(es)" in recording.note
    assert stand_in_gpu.timings == swept + 2 * 3
    assert all(r.usable for _, r in recording.fastest(NAIVE.name, SWEPT, 2))
