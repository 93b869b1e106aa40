"""bench/claim_pair.py's summary and its refusals (the runs themselves: tests/test_tuner_fleet.py
runs one seed on PostgreSQL)."""

from __future__ import annotations

import pytest

from bench_support import bench_module


def _row(seed: int, single: int, pair: int, distinct: int = 50, each=(30, 20)) -> dict:
    return {"seed": seed, "single": single, "pair": pair, "pair_measured": 50,
            "pair_distinct": distinct, "measured_by_worker": list(each)}


def test_the_summary_gives_medians_ratios_and_the_exact_checks():
    bench = bench_module("claim_pair")
    rows = [_row(0, 10, 5), _row(1, 20, 40), _row(2, 30, 30), _row(3, 40, 20)]
    summary = bench.summarize(rows, 50)
    assert summary["single_median"] == 25 and summary["pair_median"] == 25
    assert summary["ratio_median"] == pytest.approx(0.75)  # of 0.5, 2.0, 1.0, 0.5
    assert summary["pair_fewer_or_equal"] == 3
    assert summary["budget_once_no_config_twice"] and summary["both_measured"]
    assert 0 < summary["mann_whitney_p"] <= 1

    twice = bench.summarize([*rows, _row(4, 10, 10, distinct=49)], 50)
    assert twice["budget_once_no_config_twice"] is False, "a config measured twice is caught"
    idle = bench.summarize([*rows, _row(5, 10, 10, each=(50, 0))], 50)
    assert idle["both_measured"] is False


@pytest.mark.parametrize("args, named", [(["--trials", "1"], "--trials"),
                                         (["--seeds", "0"], "--seeds"),
                                         (["--recording", "/nonexistent.json.gz"], "--recording")])
def test_bad_arguments_are_refused_naming_what_was_wrong(args, named, capsys):
    bench = bench_module("claim_pair")
    with pytest.raises(SystemExit) as raised:
        bench.main(args)
    assert raised.value.code == 2 and named in capsys.readouterr().err
