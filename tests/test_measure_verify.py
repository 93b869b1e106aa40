"""Verification on the GPU (tuner/measure/verify.py) and timing without a host wait per launch.

CPU (CI): the reduction compiles with NVRTC, and its sums combine into exactly
``kernels.reference.relative_error``. GPU (marker ``gpu``, skipped without one): the device's
relative error equals the host path's (download + relative_error), poisoned and wrong outputs
are caught, back-to-back timing agrees with the old wait-per-launch timing, and a slow host
does not slow the timing down (tuner/measure/hold.py).
Run on the GPU host: python -m pytest -m gpu tests/test_measure_verify.py
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np
import pytest

from kernels import Launch, compile_config, get_family
from kernels.compiler import compile_program, parse_ptxas_report
from kernels.reference import relative_error, tolerance
from tuner.measure.testing import PLANTED_OK, PlantedFamily
from tuner.measure.verify import KERNEL, SOURCE, compile_verify, relative_from_sums


# ---- CPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_reduction_compiles(arch):
    assert len(compile_verify(arch)) > 0
    report = parse_ptxas_report(compile_program(SOURCE, arch, "verify.cu")[1])
    assert report[KERNEL].spill_store_bytes == 0 and report[KERNEL].stack_bytes == 0


def test_a_round_is_held_whole_only_where_the_host_queues_slower_than_half_the_gpus_pace():
    from tuner.measure.gpu import HEAD_START, HOLD_CHUNK, calls_ahead

    assert calls_ahead(30e-6, 150e-6) == HEAD_START  # 2048³: the host stays ahead by itself
    assert calls_ahead(30e-6, 40e-6) == HOLD_CHUNK    # 256x256x16384: it would not
    assert calls_ahead(30e-6, 60e-6) == HOLD_CHUNK    # the margin: under half, not at it


def test_the_problems_inputs_are_seeded_float32_uniform_in_minus_one_to_one():
    """The tuner's inputs (``GpuBench.set_problem``), drawn as float32 (as float64 then
    converted, a 4096³ problem's took 0.9 s of the GPU child while the GPU waited): random,
    never zeros, the same for a seed, spread over [-1, 1)."""
    from tuner.measure.gpu import _uniform

    first = _uniform(np.random.default_rng(0), (3, 257, 129))
    assert first.dtype == np.float32 and first.shape == (3, 257, 129)
    assert np.array_equal(first, _uniform(np.random.default_rng(0), (3, 257, 129)))
    assert not np.array_equal(first, _uniform(np.random.default_rng(1), (3, 257, 129)))
    assert first.min() >= -1.0 and first.max() < 1.0 and np.count_nonzero(first) > 0.99 * first.size
    assert abs(float(first.mean())) < 0.02 and first.min() < -0.99 and first.max() > 0.99


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_hold_compiles(arch):
    from tuner.measure import hold

    assert len(hold.compile_hold(arch)) > 0
    report = parse_ptxas_report(compile_program(hold.SOURCE, arch, "hold.cu")[1])
    assert report[hold.KERNEL].spill_store_bytes == 0


def _sums(out: np.ndarray, expect: np.ndarray) -> tuple[float, float, float]:
    """What the reduction kernel adds up, in NumPy."""
    out64 = out.astype(np.float64)
    finite = np.isfinite(out64)
    diff2 = float(np.sum((out64[finite] - expect[finite]) ** 2))
    return diff2, float(np.sum(expect ** 2)), float(np.count_nonzero(~finite))


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    ref = rng.uniform(-1, 1, (17, 23))
    close = (ref + rng.normal(0, 1e-6, ref.shape)).astype(np.float32)
    zero = np.zeros_like(ref)
    cases = {"close": (close, ref), "exact": (ref.astype(np.float32), ref.astype(np.float32).astype(np.float64)),
             "wrong": ((2 * ref).astype(np.float32), ref), "zero_ref": (close, zero),
             "zero_both": (zero.astype(np.float32), zero), "one_element": (close[:1, :1], ref[:1, :1])}
    for name, bad in (("nan", np.nan), ("inf", np.inf), ("minus_inf", -np.inf)):
        out = close.copy()
        out[5, 7] = bad
        cases[name] = (out, ref)
        cases[f"{name}_zero_ref"] = (out, zero)
    cases["all_nan"] = (np.full(ref.shape, np.nan, np.float32), ref)
    return cases


@pytest.mark.parametrize("case", sorted(_cases()))
def test_sums_combine_as_relative_error(case):
    out, expect = _cases()[case]
    ours, theirs = relative_from_sums(*_sums(out, expect)), relative_error(out, expect)
    if math.isinf(theirs):
        assert ours == math.inf
    else:
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-300)


# ---- GPU ------------------------------------------------------------------------------------
# Odd shapes; the last has more elements than one pass of the reduction's grid (1024 x 256).
SHAPES = [(127, 129, 65), (1, 1, 1), (1023, 1025, 33)]



@pytest.fixture(scope="module")
def bench():
    from tuner.measure.gpu import GpuBench

    return GpuBench(0)


@pytest.fixture(scope="module")
def family_kernels(bench, tmp_path_factory):
    """(family name, config, CUBIN) of one accepted config each of two families (one with a
    split-K workspace)."""
    arch, cache = bench.arch(), tmp_path_factory.mktemp("cubins")
    found = []
    for name in ("vectorized", "splitk"):
        fam = get_family(name)
        config = fam.sample_accepted(1, seed=0, arch=arch)[0]
        found.append((name, config, compile_config(fam, config, arch, cache_dir=cache).cubin))
    return found


def _toy_cubin(bench, ignore_beta: bool) -> bytes:
    """The planted family's correct GEMM, or (ignore_beta) one right only for beta = 0."""
    source = f"#define MODE {PLANTED_OK}\n#define IGNORE_BETA {int(ignore_beta)}\n{PlantedFamily().source}"
    return compile_program(source, bench.arch(), "toy.cu")[0]


def _toy_launch(kernel: str, m: int, n: int) -> list[Launch]:
    return [Launch(kernel, (-(-(m * n) // 128), 1, 1), (128, 1, 1), 0)]


def _host_error(bench, alpha: float, beta: float) -> float:
    """The host path: set 0's C, the reference and C0 downloaded, relative_error in NumPy."""
    m, n, _ = bench.problem
    out = bench.sets[0][2].download(np.empty((m, n), np.float32))
    expect = alpha * bench.ref.download(np.empty((m, n), np.float64))
    if beta != 0.0:
        expect = expect + beta * bench.c0.download(np.empty((m, n), np.float32)).astype(np.float64)
    return relative_error(out, expect)


class _Loaded:
    """A CUBIN loaded for the bench's problem, with its workspace."""

    def __init__(self, bench, cubin: bytes, launches: list[Launch], workspace_bytes: int):
        from kernels.runtime import LoadedKernel
        from tuner.measure.gpu import DeviceBuffer

        self.bench = bench
        self.kernel = LoadedKernel(cubin, launches)
        self.workspace = DeviceBuffer(workspace_bytes) if workspace_bytes else None

    def run(self, alpha: float, beta: float, s: Any = None) -> None:
        m, n, k = self.bench.problem
        a, b, c = s or self.bench.sets[0]
        self.kernel.launch(m, n, k, alpha, a.ptr, k, b.ptr, n, beta, c.ptr, n,
                           self.workspace.ptr if self.workspace else 0, self.bench.stream)

    def close(self) -> None:
        self.kernel.unload()
        if self.workspace:
            self.workspace.free()


def _load_family(bench, name: str, config: dict, cubin: bytes) -> _Loaded:
    m, n, k = bench.problem
    fam = get_family(name)
    return _Loaded(bench, cubin, fam.launches(config, m, n, k), fam.workspace_bytes(config, m, n, k))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_device_error_equals_host_error(bench, family_kernels, shape):
    from tuner.measure.gpu import VERIFY_ALPHA_BETA

    m, n, k = shape
    bench.set_problem(m, n, k, seed=7)
    for name, config, cubin in family_kernels:
        loaded = _load_family(bench, name, config, cubin)
        try:
            for alpha, beta in VERIFY_ALPHA_BETA:
                bench._reset_c(beta)
                loaded.run(alpha, beta)
                device = bench._device_error(alpha, beta)
                host = _host_error(bench, alpha, beta)
                assert abs(device - host) <= 1e-9, (name, config, alpha, beta, device, host)
                assert device <= tolerance(k), (name, config, device)
        finally:
            loaded.close()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_poisoned_and_wrong_outputs_are_caught(bench, family_kernels, shape):
    m, n, k = shape
    bench.set_problem(m, n, k, seed=8)
    # nothing written over the poison: NaN everywhere
    bench._reset_c(0.0)
    assert bench._device_error(1.25, 0.0) == math.inf == _host_error(bench, 1.25, 0.0)
    # C0 left as it is: no NaN, but not the product
    bench._reset_c(-0.5)
    assert bench._device_error(0.75, -0.5) == pytest.approx(_host_error(bench, 0.75, -0.5), rel=1e-9)
    assert bench._device_error(0.75, -0.5) > tolerance(k)

    name, config, cubin = family_kernels[0]
    loaded = _load_family(bench, name, config, cubin)
    try:
        # right product checked as if beta were -0.5 (C0 never added)
        bench._reset_c(0.0)
        loaded.run(0.75, 0.0)
        wrong = bench._device_error(0.75, -0.5)
        assert wrong == pytest.approx(_host_error(bench, 0.75, -0.5), rel=1e-9) and wrong > tolerance(k)
        # wrong scale: run with alpha 1.25, checked against 0.75: error |1.25 - 0.75| / 0.75
        bench._reset_c(0.0)
        loaded.run(1.25, 0.0)
        assert bench._device_error(0.75, 0.0) == pytest.approx(2 / 3, rel=1e-3)
    finally:
        loaded.close()


@pytest.mark.gpu
def test_evaluate_answers_wrong_result_for_wrong_kernels(bench):
    m, n, k = 127, 129, 65
    bench.set_problem(m, n, k, seed=9)
    flops = 2 * m * n * k
    writes_nothing = bench.evaluate(_toy_cubin(bench, False), _toy_launch("nothing", m, n), 0, flops)
    assert writes_nothing["state"] == "wrong_result" and writes_nothing["rel_error"] == math.inf
    assert writes_nothing["error"] == f"relative error inf exceeds {tolerance(k):.3g} (K={k})"
    ignores_beta = bench.evaluate(_toy_cubin(bench, True), _toy_launch("k", m, n), 0, flops)
    assert ignores_beta["state"] == "wrong_result" and 0.1 < ignores_beta["rel_error"] < math.inf
    correct = bench.evaluate(_toy_cubin(bench, False), _toy_launch("k", m, n), 0, flops)
    assert correct["state"] == "ok" and correct["rel_error"] <= tolerance(k), correct
    assert correct["phases"]["verify"] > 0 and correct["launches"] >= 15


def _old_timing(bench, run, reps: int) -> list[float]:
    """The timing before issue 19: the host waits for every launch's stop event."""
    from cuda.bindings import driver

    from kernels.runtime import check

    start, stop = bench.events[0]
    times = []
    for i in range(reps):
        check(driver.cuEventRecord(start, bench.stream), "cuEventRecord")
        run(bench.sets[i % len(bench.sets)])
        check(driver.cuEventRecord(stop, bench.stream), "cuEventRecord")
        check(driver.cuEventSynchronize(stop), "cuEventSynchronize")
        times.append(float(check(driver.cuEventElapsedTime(start, stop), "cuEventElapsedTime")))
    return times


@pytest.mark.gpu
def test_back_to_back_timing_agrees_with_waiting_per_launch(bench, family_kernels):
    # big enough that a launch's host overhead (which waiting per launch times) is noise: at
    # 2048³ cuBLAS's, ~0.1 ms a call, was 30 % of its 0.34 ms on an H200 (docs/measurement.md,
    # "Timing")
    m = n = k = 4096
    bench.set_problem(m, n, k, seed=10)
    name, config, cubin = family_kernels[0]
    loaded = _load_family(bench, name, config, cubin)
    try:
        def run(s):
            loaded.run(1.0, 0.0, s)

        old, new = [], []
        for _ in range(2):  # interleaved, so clock drift hits both alike
            timing = bench._time(run)
            assert len(timing.warm_ms) == 3 and len(timing.times_ms) == timing.summary(1)["launches"]
            new += timing.times_ms
            old += _old_timing(bench, run, len(timing.times_ms))
        assert statistics.median(new) == pytest.approx(statistics.median(old), rel=0.10)
    finally:
        loaded.close()

    cublas_new = bench.baseline()["time_median_ms"]
    cublas_old = statistics.median(_old_timing(
        bench, lambda s: bench.cublas.gemm(m, n, k, 1.0, s[0].ptr, s[1].ptr, 0.0, s[2].ptr), 100))
    assert cublas_new == pytest.approx(cublas_old, rel=0.10)


@pytest.mark.gpu
def test_timing_runs_at_the_gpus_pace_not_the_hosts(bench):
    """Each call queued 0.3 ms after the one before it (a host far slower than a ~10 µs GEMM):
    the round is held whole, no hold gives up, and a call measures the GEMM, not the host's gap.
    (Without the hold the driver's batching hides the gap only some of the time; the hold
    itself is tested below.)"""
    m = n = k = 128
    bench.set_problem(m, n, k, seed=11)

    def run(s, pause: float = 0.0):
        time.sleep(pause)
        bench.cublas.gemm(m, n, k, 1.0, s[0].ptr, s[1].ptr, 0.0, s[2].ptr)

    quick = bench._time(run).times_ms
    slow_host = bench._time(lambda s: run(s, 3e-4)).times_ms
    assert statistics.median(slow_host) < 0.1 and statistics.median(slow_host) == pytest.approx(
        statistics.median(quick), rel=0.25, abs=0.005)
    assert bench.holder.gave_up() == 0 and bench.holder.retries == 0  # no hold in this process timed out


@pytest.mark.gpu
def test_a_hold_keeps_what_follows_until_released(bench):
    """A call queued behind a hold, its work submitted (cuStreamQuery), runs only once the host
    releases it 50 ms later, and its own events time the call alone."""
    from cuda.bindings import driver

    from kernels.runtime import check

    m = n = k = 128
    bench.set_problem(m, n, k, seed=12)
    s = bench.sets[0]
    bench.cublas.gemm(m, n, k, 1.0, s[0].ptr, s[1].ptr, 0.0, s[2].ptr)  # loaded outside the hold
    check(driver.cuStreamSynchronize(bench.stream), "cuStreamSynchronize")
    before, start, stop = (check(driver.cuEventCreate(0), "cuEventCreate") for _ in range(3))
    check(driver.cuEventRecord(before, bench.stream), "cuEventRecord")
    bench.holder.hold(bench.stream)
    check(driver.cuEventRecord(start, bench.stream), "cuEventRecord")
    bench.cublas.gemm(m, n, k, 1.0, s[0].ptr, s[1].ptr, 0.0, s[2].ptr)
    check(driver.cuEventRecord(stop, bench.stream), "cuEventRecord")
    driver.cuStreamQuery(bench.stream)  # submits what is queued: an idle hold would let it run now
    time.sleep(0.05)
    bench.holder.release()
    check(driver.cuEventSynchronize(stop), "cuEventSynchronize")
    held_ms = float(check(driver.cuEventElapsedTime(before, stop), "cuEventElapsedTime"))
    call_ms = float(check(driver.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))
    assert held_ms >= 45 and call_ms < 1 and bench.holder.gave_up() == 0
