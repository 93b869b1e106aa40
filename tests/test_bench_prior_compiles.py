"""bench/prior_compiles.py runs end to end on a small family (real NVRTC compiles, no GPU) and
compares each bound's start-up with the 48-bound one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_prior_compiles_bench_compares_each_bound_with_the_shipped_one(tmp_path):
    out = tmp_path / "prior_compiles.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "prior_compiles.py"), "--family", "smem",
         "--family", "naive", "--shape", "256x256x256", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "GEMMTUNE_CACHE": str(tmp_path / "cubins")})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert [row["family"] for row in result["rows"]] == ["smem", "naive"]
    for row in result["rows"]:
        assert row["same_startup"]["48"] is True  # the shipped bound against itself
        assert row["kept_of_full"]["48"] == row["startup_size"] > 0
        assert all(0 <= kept <= row["startup_size"] for kept in row["kept_of_full"].values())
    assert "same start-up as 48 in" in done.stdout
