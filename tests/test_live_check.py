"""Issue 15 on CPU: bench/live_check.py runs end to end on the stand-in GPU child (real NVRTC
compiles, analytic "GFLOP/s"): long run, short runs in fresh databases, fractions read back from
the results database. Nothing about the search's quality is asserted: that is for the GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="the stand-in child compiles with NVRTC")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import live_check  # noqa: E402

CHECKPOINTS = [2, 4, 8]


def run_check(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "live_check.json"
    env = dict(os.environ, GEMMTUNE_GPU_BACKEND="tuner.testing",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "live_check.py"), "--shape", "64x48x32",
         "--checkpoints", ",".join(map(str, CHECKPOINTS)), "--short-trials", "8",
         "--short-timeout", "60", "--cache", str(tmp_path / "cubins"), "--out", str(out), *extra],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())


def test_live_check_runs_end_to_end_on_the_stand_in(tmp_path):
    # naive's whole accepted space is 48 configs, so the long run's best is the optimum and no
    # short run can beat it; smem has 3, so its runs stop before the last checkpoints
    done, result = run_check(tmp_path, "--family", "naive", "--family", "smem",
                             "--long-trials", "48", "--long-timeout", "60", "--seeds", "1,2")
    assert result["backend"] == "tuner.testing" and result["issue"] == 15
    assert result["device"]["name"] == result["gpu"] and result["device"]["uuid"]
    assert result["skipped"] == [] and not result["interrupted"]
    assert {(p["shape"], p["family"]) for p in result["pairs"]} == \
        {("64x48x32", "naive"), ("64x48x32", "smem")}
    for pair in result["pairs"]:
        reference = pair["reference"]["gflops"]
        assert reference > 0 and pair["reference"]["measured"] == len(pair["long"]["gflops"])
        assert max(g for g in pair["long"]["gflops"] if g) == reference
        assert [run["seed"] for run in pair["short"]] == [1, 2]
        for run in [pair["long"], *pair["short"]]:
            assert run["status"] == 0 and run["command"].startswith("python -m tuner ")
            # the raw sequence, in measurement order, one state per measured config
            assert len(run["gflops"]) == len(run["states"]) >= 1
            assert "rejected" not in run["states"]
            fractions = [run["fractions"][str(c)] for c in CHECKPOINTS]
            assert all(0 < f <= 1 + 1e-12 for f in fractions), fractions
            assert fractions == sorted(fractions)  # a best-so-far never falls
            curve = live_check.best_so_far(run["gflops"])
            assert fractions[-1] == curve[min(8, len(curve)) - 1] / reference
        for run in pair["short"]:
            assert len(run["gflops"]) <= 8 and "--seed " + str(run["seed"]) in run["command"]
            assert "--trials 8 " in run["command"] and "--patience 25 " in run["command"]
        assert pair["long"]["to_within"] is not None  # its own best is the reference
    smem = next(p for p in result["pairs"] if p["family"] == "smem")
    assert all(len(run["gflops"]) == 3 for run in smem["short"])  # the space ran out
    assert "at 2" in done.stdout and "to 3%" in done.stdout and "median over 4 short runs" \
        in done.stdout


def test_a_deadline_too_short_for_a_long_run_skips_it_and_says_so(tmp_path):
    done, result = run_check(tmp_path, "--family", "naive", "--deadline-s", "1")
    assert result["pairs"] == []
    assert result["skipped"] == ["64x48x32 naive: no time for the long run"]
    assert "skipped: 64x48x32 naive: no time for the long run" in done.stdout


def test_the_model_sampler_with_a_family_it_cannot_list_is_refused_before_any_run(capsys, monkeypatch):
    import tuner.search.study as study_module

    monkeypatch.setattr(study_module, "ENUMERABLE_SPACE", 1_000_000)  # split-K's 4.4M is over it
    with pytest.raises(SystemExit) as exit_:
        live_check.main(["--sampler", "model", "--family", "tf32x3", "--family", "splitk"])
    assert exit_.value.code == 2
    assert "splitk has more than 1,000,000" in capsys.readouterr().err


def test_a_recorded_shape_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        live_check.main(["--shape", "3000x3000x3000", "--family", "naive"])
    assert exit_.value.code == 2
    assert "h100-pipelined-3000x3000x3000.json.gz" in capsys.readouterr().err


def test_the_default_shapes_are_in_no_recording():
    recorded = live_check.recorded_shapes()
    assert recorded and not set(live_check.DEFAULT_SHAPES) & set(recorded)


def test_score_counts_measured_configs_and_keeps_a_stopped_runs_best():
    run = live_check.RunResult(kind="short", seed=1, command="", status=0, wall_s=0.0,
                               gflops=[None, 50.0, 40.0, 97.0, 99.0],
                               states=["wrong_result", "ok", "ok", "ok", "ok"])
    live_check.score(run, 100.0, [1, 2, 4, 10])
    assert run.fractions == {"1": 0.0, "2": 0.5, "4": 0.97, "10": 0.99}
    assert run.to_within == 4
