"""bench/refresh_pack.py end to end on the CPU stand-in: a pack entry measured with another
source version comes back re-measured with the same config under the installed source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernels import get_family

ROOT = Path(__file__).resolve().parents[1]
STANDIN = "Stand-in GPU (analytic model)"


def _pack(config: dict[str, int]) -> dict:
    gpu = {"name": STANDIN, "uuid": "GPU-old-board", "compute_capability": "9.0", "sm_count": 132,
           "memory_bytes": 1 << 30, "max_sm_clock_mhz": 1980, "driver_version": "580", "cuda_version": "13.0",
           "nvrtc_version": "13.0"}
    entry = {"gpu": STANDIN, "m": 96, "n": 80, "k": 72, "precision": "ffma", "family": "blocktile1d",
             "source_hash": "0" * 64, "config": config, "gflops": 1.0, "time_median_ms": 1.0,
             "cublas_gflops": 2.0, "fraction_of_cublas": 0.5, "run_id": 1, "trial_id": 1, "trial_number": 0,
             "gpu_uuid": gpu["uuid"]}
    return {"format": "gemmtune-pack", "version": 1, "created_at": "2026-11-24T00:00:00Z", "database": "x",
            "precision": "fp32", "entries": [entry], "gpus": {gpu["uuid"]: gpu}}


def test_an_entry_of_an_older_source_is_re_measured_with_its_own_config(tmp_path: Path) -> None:
    family = get_family("blocktile1d")
    config = family.sample_accepted(1, seed=11)[0]  # any accepted config, not the prior's first pick
    pack = tmp_path / "old.json"
    pack.write_text(json.dumps(_pack(config)))
    smi = tmp_path / "bin" / "nvidia-smi"  # the host's GPU model, as the GPU host's nvidia-smi says it
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho '{STANDIN}'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}",
           "GEMMTUNE_GPU_BACKEND": "tuner.testing", "GEMMTUNE_CACHE": str(tmp_path / "cubins")}
    out = tmp_path / "new.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "refresh_pack.py"), "--db",
                           f"sqlite:///{tmp_path / 'r.sqlite'}", "--pack", str(pack), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 entries to re-measure" in done.stdout and "same config" in done.stdout
    (entry,) = json.loads(out.read_text())["entries"]
    assert entry["config"] == config and entry["family"] == "blocktile1d"
    assert entry["source_hash"] == family.source_hash and entry["gflops"] != 1.0


def test_an_imported_pack_is_found_behind_more_than_a_page_of_runs(tmp_path: Path) -> None:
    """The H200 half of a refresh reuses the H100 half's database: the pack is not imported a
    second time however many tuner runs came after it (list_runs pages by 100)."""
    import db
    from bench_support import bench_module
    from gemmtune.pack import import_pack

    refresh = bench_module("refresh_pack")
    with db.open_database(f"sqlite:///{tmp_path / 'results.sqlite'}") as database:
        assert not refresh.pack_imported(database)
        pack = _pack(get_family("blocktile1d").sample_accepted(1, seed=11)[0])
        import_pack(pack, database, source="old.json")
        gpu_id = database.ensure_gpu(db.GpuInfo(**pack["gpus"]["GPU-old-board"]))
        problem_id = database.ensure_problem(96, 80, 72)
        family_id = database.ensure_family("blocktile1d", get_family("blocktile1d").source_hash)
        for _ in range(101):
            database.start_run(gpu_id=gpu_id, problem_id=problem_id, family_id=family_id,
                               sampler="default", seed=0, budget={}, host="test",
                               command="python -m tuner", study_name=None)
        assert all(r.sampler != "pack" for r in database.list_runs())  # the first page
        assert refresh.pack_imported(database)


def test_a_refresh_on_one_model_keeps_the_other_models_entries_as_they_were() -> None:
    """Only one model's host lent: its entries come back re-measured, the other model's stale
    entries stay in the written pack (awaiting their host), each key once."""
    from bench_support import bench_module

    refresh = bench_module("refresh_pack")
    config = {"BM": 32}
    old = _pack(config)
    other = {**old["gpus"]["GPU-old-board"], "name": "Other GPU", "uuid": "GPU-other"}
    stale = {**old["entries"][0], "gpu": "Other GPU", "gpu_uuid": "GPU-other"}
    also_rebuilt = {**stale, "m": 128}
    old["entries"] += [stale, also_rebuilt]
    old["gpus"]["GPU-other"] = other
    fresh = {**old["entries"][0], "source_hash": "1" * 64, "gflops": 3.0}
    new = {**old, "entries": [fresh, {**also_rebuilt, "source_hash": "1" * 64}],
           "gpus": {"GPU-old-board": old["gpus"]["GPU-old-board"]}}
    out = refresh.with_others_kept(old, new, STANDIN)
    assert out["entries"] == [stale, {**also_rebuilt, "source_hash": "1" * 64}, fresh]  # sorted by GPU, then shape
    assert set(out["gpus"]) == {"GPU-old-board", "GPU-other"}
    # refreshed on the other model instead: its own stale entries are not kept beside the new
    assert refresh.with_others_kept(old, new, "Other GPU")["entries"] == [new["entries"][1], fresh]
