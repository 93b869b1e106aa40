"""bench/launches.py without a GPU: its table, and what it refuses before touching a device."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench_support import bench_module

ROOT = Path(__file__).resolve().parents[1]


def _result(scale_us: float, pack_us: float, gemm_us: float, whole_us: float) -> dict:
    launch = lambda name, us: {"kernel": name, "grid": [8, 2, 1], "block": [256, 1, 1],  # noqa: E731
                               "us_median": us, "us_min": us, "sm_clock_mhz": 1980}
    return {"shape": [4096, 4096, 4096], "layout": "nn", "relative_error": 2e-7, "correct": True,
            "launches": [launch("gemm_scale", scale_us), launch("gemm_pack", pack_us), launch("gemm", gemm_us)],
            "whole": {"us_median": whole_us, "us_min": whole_us, "sm_clock_mhz": None},
            "tflops": 2 * 4096 ** 3 / (whole_us * 1e-6) / 1e12}


def test_the_table_gives_each_launch_its_share_of_the_sequence() -> None:
    lines = bench_module("launches").table([_result(50.0, 150.0, 800.0, 1000.0)])
    assert len(lines) == 5  # header, three launches, the sequence
    assert "gemm_scale" in lines[1] and "5.0%" in lines[1]
    assert "gemm_pack" in lines[2] and "15.0%" in lines[2]
    assert "80.0%" in lines[3]
    assert "(sequence)" in lines[4] and "137.4 TFLOP/s" in lines[4] and "?" in lines[4]  # no clock read
    assert "WRONG" not in "".join(lines)


def test_a_result_past_the_float64_checks_tolerance_is_marked_wrong() -> None:
    wrong = dict(_result(50.0, 150.0, 800.0, 1000.0), relative_error=3e-3, correct=False, layout="nt")
    last = bench_module("launches").table([wrong])[-1]
    assert "4096x4096x4096:nt" in last and "WRONG" in last


def test_a_bad_shape_or_family_is_refused_with_what_is_allowed() -> None:
    for args, said in ((["--family", "f16x3", "--shape", "4096x0x4096"], "positive integer"),
                       (["--family", "nosuch"], "known families"), (["--family", "f16x3", "--shape", "2x64x64x64"], "not a batch"), (["--family", "f16x3", "--config", "{WGS"], "is not a JSON object")):
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "launches.py"), *args],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0
        assert said in run.stderr, run.stderr[-2000:]
