"""bench/source_ab.py's summary of several configs per family and shape (CPU)."""
from __future__ import annotations

import json

import pytest

from bench_support import bench_module


def _row(family, shape, before, after):
    side = lambda g: {"state": "ok", "gflops": g} if g else {"state": "rejected", "gflops": None}  # noqa: E731
    return {"family": family, "shape": shape, "before": side(before), "after": side(after)}


def test_each_side_keeps_its_best_and_counts_what_it_rejected():
    rows = [_row("pipelined", [2048, 2048, 2048], 42.0, None),  # the optimum, rejected after
            _row("pipelined", [2048, 2048, 2048], 41.0, 37.0),
            _row("pipelined", [2048, 2048, 2048], 40.0, 38.0),
            _row("naive", [2048, 2048, 2048], 1.0, 1.0)]  # alone at its shape: no summary
    (best,) = bench_module("source_ab").best_per_shape(rows)
    assert best["family"] == "pipelined" and best["shape"] == "2048x2048x2048" and best["configs"] == 3
    assert best["before_gflops"] == 42.0 and best["after_gflops"] == 38.0
    assert abs(best["ratio"] - 38.0 / 42.0) < 1e-12
    assert (best["rejected_before"], best["rejected_after"]) == (0, 1)


def test_a_side_that_measured_nothing_has_no_ratio():
    rows = [_row("warptile", [64, 64, 64], 5.0, None), _row("warptile", [64, 64, 64], 4.0, None)]
    (best,) = bench_module("source_ab").best_per_shape(rows)
    assert best["after_gflops"] is None and best["ratio"] is None and best["rejected_after"] == 2


def _pack(tmp_path, key, rows):
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({key: rows}))
    return path


ENTRIES = [
    {"family": "wgmma", "config": {"BM": 128}, "m": 4096, "n": 4096, "k": 4096, "gpu": "NVIDIA H100 80GB HBM3"},
    {"family": "wgmma", "config": {"BM": 128}, "m": 4096, "n": 4096, "k": 4096, "gpu": "NVIDIA H200"},  # same item
    {"family": "skinny", "config": {"TM": 4}, "m": 16, "n": 4096, "k": 4096, "gpu": "NVIDIA H200"},
]


def test_a_pack_or_a_speed_result_gives_its_distinct_configs_of_the_families_asked(tmp_path):
    source_ab = bench_module("source_ab")
    for key in ("entries", "rows"):  # a pack; bench/speed.py's JSON
        path = _pack(tmp_path, key, ENTRIES)
        assert [(i["family"], i["shape"]) for i in source_ab.items(path)] == [
            ("skinny", [16, 4096, 4096]), ("wgmma", [4096, 4096, 4096])]
        assert [i["family"] for i in source_ab.items(path, ["wgmma"])] == ["wgmma"]


def test_a_file_without_configs_or_a_family_without_entries_is_refused(tmp_path, capsys):
    source_ab = bench_module("source_ab")
    with pytest.raises(SystemExit):
        source_ab.main(["--before", str(tmp_path), "--pack", str(_pack(tmp_path, "results", ENTRIES))])
    assert "neither a pack (entries) nor a speed-suite result (rows)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        source_ab.main(["--before", str(tmp_path), "--pack", str(_pack(tmp_path, "entries", ENTRIES)),
                        "--family", "f16x3"])
    assert "has no entries of f16x3" in capsys.readouterr().err
