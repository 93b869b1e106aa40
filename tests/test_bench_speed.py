"""bench/speed.py end to end on CPU: the real tuner subprocess, real NVRTC compiles and a real
SQLite file, measured by the stand-in GPU bench (GEMMTUNE_GPU_BACKEND=tuner.testing), whose
figures are deterministic per CUBIN; plus one run on a real GPU (marked gpu)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import db
import kernels
import pytest

from tuner.measure.testing import STANDIN_CUBLAS_GFLOPS, GpuBench as StandInBench
from tuner.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
SPEED = ROOT / "bench" / "speed.py"
SHAPES = ("64x64x64", "96x32x48")
STANDIN_GPU = "Stand-in GPU (analytic model)"


def load_speed() -> ModuleType:
    """bench/ is no package: load the script as a module (registered first, as dataclasses need)."""
    if "bench_speed" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_speed", SPEED)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_speed"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench_speed"]


def env_for(tmp: Path, backend: str | None = "tuner.testing") -> dict[str, str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp / "data"), "XDG_CACHE_HOME": str(tmp / "cache"),
           "GEMMTUNE_DB": "", "GEMMTUNE_STORAGE": "", "GEMMTUNE_CACHE": "", "PYTHONUNBUFFERED": "1"}
    env.pop("GEMMTUNE_GPU_BACKEND", None)
    if backend:
        env["GEMMTUNE_GPU_BACKEND"] = backend
    return env


def run_speed(tmp: Path, *args: str, backend: str | None = "tuner.testing",
              timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SPEED), *args], cwd=ROOT, env=env_for(tmp, backend),
                          capture_output=True, text=True, timeout=timeout)


def small_suite(url: str, out: Path, *extra: str) -> list[str]:
    return [*(a for s in SHAPES for a in ("--shape", s)), "--family", "naive", "--family", "smem",
            "--trials", "3", "--timeout", "30", "--db", url, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One bench run on an empty database: it has to tune both problems, then measure."""
    tmp = tmp_path_factory.mktemp("speed")
    url, out = f"sqlite:///{tmp / 'results.sqlite'}", tmp / "speed.json"
    result = run_speed(tmp, *small_suite(url, out))
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp, url, out, result


def test_an_empty_database_is_tuned_first_then_read_and_remeasured(tuned):
    tmp, url, out, result = tuned
    assert "tuning 2 problem(s): python -m tuner --gpu 0 --db" in result.stdout
    assert "Best kernel per shape" in result.stdout  # the tuner's own output reached the user
    report = json.loads(out.read_text())
    assert report["tuned"] == list(SHAPES) and report["tuner_exit"] == 0 and report["complete"]
    with db.open_database(url) as database:
        runs = database.list_runs()
        assert {(r.problem.m, r.problem.n, r.problem.k, r.family) for r in runs} == {
            (*map(int, s.split("x")), f) for s in SHAPES for f in ("naive", "smem")}
        for row in report["rows"]:
            stored = database.top_k(STANDIN_GPU, row["m"], row["n"], row["k"], limit=50)
            best_stored = max(stored, key=lambda r: r.gflops)
            # the three fastest stored, both families among them, each re-measured now
            fastest = sorted((r.gflops for r in stored), reverse=True)[:3]
            assert sorted((c["stored_gflops"] for c in row["candidates"]), reverse=True) == fastest
            assert {c["family"] for c in row["candidates"]} == {"naive", "smem"}
            assert all(c["state"] == "ok" for c in row["candidates"])
            # the same method for both sides: two interleaved passes, the faster one counting
            assert len(row["cublas_runs"]) == 2
            for c in row["candidates"]:
                assert len(c["passes"]) == 2
                assert c["gflops"] == max(p["gflops"] for p in c["passes"])
            # the stand-in's figures depend only on the CUBIN: re-measuring the same config,
            # compiled again here, must give the stored figure back
            for c in row["candidates"]:
                assert c["gflops"] == pytest.approx(c["stored_gflops"])
            assert row["gflops"] == pytest.approx(best_stored.gflops)
            assert (row["family"], row["config"]) == (best_stored.family, best_stored.params)


def test_ratios_geomean_bandwidth_and_the_printed_table(tuned):
    _, _, out, result = tuned
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [f"{r['m']}x{r['n']}x{r['k']}" for r in rows] == list(SHAPES)
    for row in rows:
        assert row["cublas_gflops"] == STANDIN_CUBLAS_GFLOPS
        assert row["ratio"] == pytest.approx(row["gflops"] / STANDIN_CUBLAS_GFLOPS)
        m, n, k = row["m"], row["n"], row["k"]
        assert row["min_dram_bytes"] == 4 * (m * k + k * n + m * n)
        assert row["gbps"] == pytest.approx(row["min_dram_bytes"] / row["time_median_ms"] / 1e6)
        assert row["sm_clock_mhz"] == 1980
    expected = math.exp(sum(math.log(r["gflops"] / STANDIN_CUBLAS_GFLOPS) for r in rows) / len(rows))
    assert report["geomean_ratio"] == pytest.approx(expected)
    assert f"geomean of the ratios: {expected:.3f}x over 2 of 2 problem(s)" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("M "))
    for column in ("cuBLAS TFLOP/s", "ours TFLOP/s", "ratio", "family", "config", "SM MHz",
                   "GB/s", "% DRAM peak"):
        assert column in header
    for row in rows:
        line = next(x for x in result.stdout.splitlines()
                    if x.split()[:3] == [str(row["m"]), str(row["n"]), str(row["k"])])
        assert f"{row['ratio']:.3f}" in line and row["family"] in line
    assert "target 4096x4096x4096 >= 3x cuBLAS: NOT MEASURED" in result.stdout
    assert "target geomean >= 2.50x and none < 1.50x: NOT MET" in result.stdout
    device = report["device"]
    assert device["name"] == STANDIN_GPU and device["sm_count"] == 132
    assert {"uuid", "driver_version", "dram"} <= device.keys()
    assert "CUBLAS_COMPUTE_32F" in report["method"] and report["command"].startswith("python bench/speed.py")


def test_a_stored_problem_is_not_tuned_again_unless_asked(tuned):
    tmp, url, out, _ = tuned
    first = json.loads(out.read_text())
    again = tmp / "again.json"
    with db.open_database(url) as database:
        runs_before = len(database.list_runs())
    result = run_speed(tmp, *small_suite(url, again))
    assert result.returncode == 0, result.stderr
    assert "tuning" not in result.stdout
    report = json.loads(again.read_text())
    assert report["tuned"] == [] and report["tuner_exit"] is None
    assert [r["ratio"] for r in report["rows"]] == pytest.approx([r["ratio"] for r in first["rows"]])
    with db.open_database(url) as database:
        assert len(database.list_runs()) == runs_before
    forced = run_speed(tmp, *small_suite(url, again, "--tune"))
    assert forced.returncode == 0 and "tuning 2 problem(s)" in forced.stdout
    # a family asked for that has nothing stored for the problems: they are tuned for it
    widened = run_speed(tmp, *small_suite(url, again, "--family", "blocktile1d"))
    assert widened.returncode == 0 and "tuning 2 problem(s)" in widened.stdout
    with db.open_database(url) as database:
        assert all(database.best(STANDIN_GPU, *map(int, s.split("x")), family="blocktile1d",
                                 nearest=False) is not None for s in SHAPES)


def test_no_tune_on_an_empty_database_reports_every_problem_as_not_tuned(tmp_path):
    url, out = f"sqlite:///{tmp_path / 'empty.sqlite'}", tmp_path / "speed.json"
    result = run_speed(tmp_path, *small_suite(url, out, "--no-tune"))
    assert result.returncode == 1, result.stderr
    assert "tuning" not in result.stdout and "(not tuned: no stored config)" in result.stdout
    report = json.loads(out.read_text())
    assert [r["ratio"] for r in report["rows"]] == [None, None]
    assert all(r["cublas_gflops"] == STANDIN_CUBLAS_GFLOPS for r in report["rows"])
    with db.open_database(url) as database:
        assert database.list_runs() == []


@pytest.mark.parametrize(("argv", "wanted"), [
    (["--shape", "12x12"], ["'12x12'", "MxNxK"]),
    (["--shape", "0x4x4"], ["M=0", "positive integer"]),
    (["--family", "fastest"], ["'fastest'", *kernels.FAMILIES]),
    (["--trials", "0"], ["--trials", "positive"]),
])
def test_bad_input_is_refused_before_anything_is_stored(tmp_path, argv, wanted):
    out, path = tmp_path / "speed.json", tmp_path / "results.sqlite"
    result = run_speed(tmp_path, *argv, "--db", str(path), "--out", str(out), timeout=60)
    assert result.returncode == 2
    for text in wanted:
        assert text in result.stderr
    assert not out.exists() and not path.exists()


def test_without_a_usable_gpu_it_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "speed.json"
    env = env_for(tmp_path) | {"GEMMTUNE_STANDIN_NO_GPU": "the stand-in was told there is no GPU"}
    result = subprocess.run([sys.executable, str(SPEED), "--shape", "64x64x64", "--db",
                             str(tmp_path / "r.sqlite"), "--out", str(out)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "no usable GPU 0: the stand-in was told there is no GPU" in result.stderr
    assert not out.exists()


def test_a_candidate_that_now_fails_verification_is_reported_not_dropped():
    speed = load_speed()
    naive = kernels.FAMILIES["naive"]
    good, bad = ({"BX": 16, "BY": 8, "COALESCED": 1}, {"BX": 32, "BY": 4, "COALESCED": 1})
    bogus = {"BX": 3, "BY": 8, "COALESCED": 1}
    candidates = [speed.Candidate("naive", bad, 1900.0, 1, 1), speed.Candidate("naive", good, 1500.0, 1, 2),
                  speed.Candidate("naive", bogus, 1400.0, 1, 3)]
    compiled = speed.compile_all(candidates, "sm_90")
    assert isinstance(compiled[2], kernels.ConfigError)
    bench = StandInBench(0, faults={hashlib.sha256(compiled[0]).hexdigest(): "wrong"})
    row = speed.measure_problem(bench, Problem(64, 48, 32), candidates, compiled, peak=3.0e12)
    states = [c["state"] for c in row["candidates"]]
    assert states == ["wrong_result", "ok", "rejected"]
    assert (row["family"], row["config"]) == ("naive", good)
    assert row["dram_fraction"] == pytest.approx(row["gbps"] * 1e9 / 3.0e12)
    text = speed.report_text([row], speed.targets([row]))
    assert "FAILED NOW 64x48x32 naive BX=32 BY=4 COALESCED=1: wrong_result" in text
    assert "FAILED NOW 64x48x32 naive BX=3 BY=8 COALESCED=1: rejected" in text
    assert naive.accepts(good) and naive.accepts(bad)


def test_traffic_peak_and_targets_arithmetic():
    speed = load_speed()
    assert speed.min_dram_bytes(16, 4096, 4096) == 4 * (16 * 4096 + 4096 * 4096 + 16 * 4096)
    assert speed.min_dram_bytes(2, 3, 5, beta=0.5) == 4 * (2 * 5 + 5 * 3 + 2 * 2 * 3)
    # H100 SXM: HBM3 at 2619 MHz over a 5120-bit bus is the advertised 3.35 TB/s
    assert speed.peak_dram_bytes_per_s(2_619_000, 5120) == pytest.approx(3.352e12, rel=1e-3)

    def row(shape: str, ratio: float | None) -> dict:
        m, n, k = map(int, shape.split("x"))
        return {"m": m, "n": n, "k": k, "ratio": ratio, "dram_fraction": 0.5 if ratio else None}

    good = [row(p.shape, 2.6) for p in speed.SUITE]
    for problem in speed.LARGE:
        good[speed.SUITE.index(problem)]["ratio"] = 3.1
    assert [t["status"] for t in speed.targets(good)] == ["met"] * 4
    low = [dict(r) for r in good]
    low[0]["ratio"] = 1.49  # one problem under the 1.5x floor fails the suite target
    assert [t["status"] for t in speed.targets(low)] == ["met", "met", "not met", "met"]
    slow = [dict(r) for r in good]
    slow[speed.SUITE.index(speed.LARGE[1])]["ratio"] = 2.99  # 8192^3 under 3x
    assert [t["status"] for t in speed.targets(slow)] == ["met", "not met", "met", "met"]
    poor = [dict(r) for r in good]
    for r in poor:
        r["ratio"] = 2.3 if r["ratio"] == 2.6 else r["ratio"]  # geometric mean under 2.5x
    assert [t["status"] for t in speed.targets(poor)] == ["met", "met", "not met", "met"]
    broken = [dict(r) for r in good]
    broken[speed.SUITE.index(speed.SQUARE_4096)]["ratio"] = None
    checks = speed.targets(broken)
    assert [t["status"] for t in checks] == ["not met", "met", "not met", "met"]
    assert "1 problem(s) without a working kernel" in checks[2]["detail"]
    assert "50% of DRAM peak" in checks[3]["detail"]


@pytest.mark.gpu
def test_on_a_real_gpu_one_small_problem_end_to_end(tmp_path):
    url, out = f"sqlite:///{tmp_path / 'results.sqlite'}", tmp_path / "speed.json"
    result = run_speed(tmp_path, "--shape", "512x512x512", "--family", "smem", "--trials", "3",
                       "--timeout", "60", "--db", url, "--out", str(out), backend=None, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"]["backend"] == "tuner.gpu" and report["device"]["uuid"].startswith("GPU-")
    assert report["device"]["dram"]["peak_bytes_per_s"] > 1e11
    [row] = report["rows"]
    assert row["cublas_gflops"] > 0 and row["gflops"] > 0 and row["family"] == "smem"
    assert all(c["state"] == "ok" and c["rel_error"] is not None for c in row["candidates"])
    assert row["ratio"] == pytest.approx(row["gflops"] / row["cublas_gflops"])
    assert 0 < row["dram_fraction"] == pytest.approx(
        row["gbps"] * 1e9 / report["device"]["dram"]["peak_bytes_per_s"])


def test_a_failing_problem_becomes_a_noted_row_and_a_gpu_fault_stops_the_run():
    """A bench that runs out of memory on one shape and loses its context on another (planted,
    as tuner.measure.testing plants faults)."""
    speed = load_speed()
    from tuner.measure.testing import GpuFault

    class PlantedBench(StandInBench):
        def set_problem(self, m: int, n: int, k: int) -> None:
            if m == 2:
                raise RuntimeError("cuMemAlloc(8) failed: CUDA_ERROR_OUT_OF_MEMORY")
            if m == 3:
                raise GpuFault("CUDA_ERROR_ILLEGAL_ADDRESS")
            super().set_problem(m, n, k)

    problems = [Problem(1, 8, 8), Problem(2, 8, 8), Problem(3, 8, 8), Problem(4, 8, 8)]
    rows, stopped = speed.measure_all(PlantedBench(0), GpuFault, problems,
                                      {p: [] for p in problems}, iter([]), None)
    assert [r["m"] for r in rows] == [1, 2]
    assert rows[0]["cublas_gflops"] == STANDIN_CUBLAS_GFLOPS and rows[0]["note"].startswith("not tuned")
    assert rows[1]["cublas_gflops"] is None and "CUDA_ERROR_OUT_OF_MEMORY" in rows[1]["note"]
    assert stopped == "GPU fault at 3x8x8: CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "(error: cuMemAlloc(8) failed: CUDA_ERROR_OUT_OF_MEMORY)" in speed.table(rows)


def test_every_bench_names_its_results_by_the_gpu_model_as_the_committed_ones_are():
    """One rule (bench.throughput.gpu_slug) for every bench's default result file: the two
    models' committed results are found under the names a bench on those GPUs writes."""
    from bench.throughput import gpu_slug

    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100" and gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA H100 PCIe") == "h100-pcie" and gpu_slug("") == "gpu"
    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    for bench in ("speed", "accuracy", "recording_noise", "live_check", "models"):
        for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
            assert (results / f"{bench}-{gpu_slug(gpu)}.json").is_file(), (bench, gpu)
