"""bench/issue_command.py on the CPU: the tuner command runs in the named tree on the stand-in GPU
child (tuner.measure.testing), and what it stored is read back from its own fresh database. No
speed is asserted."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from bench_support import bench_module

from tuner.measure.live import BACKEND_ENV

ROOT = Path(__file__).resolve().parents[1]
issue_command = bench_module("issue_command")


def test_two_runs_of_one_tree_report_what_their_databases_hold(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(BACKEND_ENV, "tuner.testing")
    out = tmp_path / "runs.json"
    issue_command.main(["--tree", f"here={ROOT}", "--order", "here,here", "--out", str(out), "--",
                        "--gpu", "0", "--shape", "64x48x32", "--timeout", "20", "--trials", "6",
                        "--kernel", "naive", "--kernel", "smem", "--workers", "1"])
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == ["here", "here"]
    for run in runs:
        # smem has 3 accepted configs, naive more than 6: the trial budget caps naive
        assert run["ok_configs"] == {"naive": 6, "smem": 3}
        assert run["measured"] == 9 and run["configs_per_min"] > 0
        assert set(run["best_gflops"]) == {"naive", "smem"}
        assert all(g > 0 for g in run["best_gflops"].values())
    assert "here" in capsys.readouterr().out


def test_read_results_counts_only_verified_trials(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE gt_families (id INTEGER PRIMARY KEY, name TEXT);
            CREATE TABLE gt_runs (id INTEGER PRIMARY KEY, family_id INTEGER);
            CREATE TABLE gt_trials (id INTEGER PRIMARY KEY, run_id INTEGER, state TEXT,
                                    gflops REAL, sm_clock_mhz INTEGER);
            INSERT INTO gt_families VALUES (1, 'naive');
            INSERT INTO gt_runs VALUES (1, 1);
            INSERT INTO gt_trials VALUES (1, 1, 'ok', 10.0, 1980), (2, 1, 'ok', 30.0, 1970),
                                         (3, 1, 'rejected', NULL, NULL),
                                         (4, 1, 'wrong_result', 99.0, 1980);
        """)
    results = issue_command.read_results(path)
    assert results["ok_configs"] == {"naive": 2}
    assert results["best_gflops"] == {"naive": 30.0}
    assert results["median_sm_clock_mhz"] == 1975


@pytest.mark.parametrize("argv, says", [
    (["--tree", "old"], "LABEL=PATH"),
    (["--tree", "old=/nonexistent"], "no tuner/__main__.py"),
    (["--tree", f"a={ROOT}", "--order", "a,b"], "the trees are ['a']"),
])
def test_bad_trees_and_orders_are_refused_by_name(argv, says):
    with pytest.raises(SystemExit, match=re.escape(says)):
        issue_command.main(argv)
