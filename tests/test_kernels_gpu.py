"""Every family on a real GPU: random accepted configs on awkward shapes, against float64.

Run on the GPU host: python -m pytest -m gpu tests/test_kernels_gpu.py
"""
from __future__ import annotations

import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import kernels
from kernels import FAMILIES, compile_config, get_family, occupancy

pytestmark = pytest.mark.gpu

# 1x1x1, primes, K = 1, tall-skinny, non-multiples of 4 / 32 / any tile, one aligned shape, long K.
SHAPES = [(1, 1, 1), (7, 13, 5), (1, 97, 1), (33, 65, 1), (127, 131, 257), (2048, 3, 100),
          (3, 1000, 515), (1023, 1025, 999), (256, 256, 256),
          (67, 61, 8191)]  # long K: accumulation error that grows with K shows here
CONFIGS_PER_FAMILY = 6


@pytest.fixture(scope="module")
def bench():
    from tuner.measure.gpu import GpuBench

    return GpuBench(0)


def _compile(args):
    name, config, arch = args
    return compile_config(get_family(name), config, arch)


@pytest.fixture(scope="module")
def compiled(bench):
    arch = bench.arch()
    jobs = []
    for fam in FAMILIES.values():
        for config in fam.sample_accepted(CONFIGS_PER_FAMILY, seed=random.randrange(1 << 30), arch=arch):
            jobs.append((fam.name, config, arch))
    with ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(zip(jobs, pool.map(_compile, jobs)))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_family_matches_float64(bench, compiled, shape):
    m, n, k = shape
    bench.set_problem(m, n, k, seed=random.randrange(1 << 30))
    failures = []
    for (name, config, _), ck in compiled:
        fam = get_family(name)
        r = bench.evaluate(ck.cubin, fam.launches(config, m, n, k), fam.workspace_bytes(config, m, n, k),
                           fam.flops(m, n, k))
        if r["state"] != "ok":
            failures.append(f"{name} {config}: {r['state']} {r['error']}")
    assert not failures, "\n".join(failures)


def test_occupancy_matches_driver(bench, compiled):
    from cuda.bindings import driver

    from kernels.runtime import LoadedKernel, check

    arch = bench.arch()
    for (name, config, _), ck in compiled:
        fam = get_family(name)
        launch = fam.main_launch(config, 512, 512, 512)
        loaded = LoadedKernel(ck.cubin, [launch])
        try:
            ours = occupancy(arch, launch.block[0], ck.main.registers,
                             ck.main.shared_static_bytes + launch.shared_bytes)
            theirs = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                loaded.functions["gemm"], launch.block[0], launch.shared_bytes), "occupancy")
            assert ours.blocks_per_sm == theirs, (name, config, ck.main, ours)
        finally:
            loaded.unload()


def test_public_gemm_on_cupy_arrays():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(1)
    m, n, k = 300, 257, 129
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    fam = get_family("pipelined")
    config = fam.sample_accepted(1, seed=3)[0]
    da, db, dc = cp.asarray(a), cp.asarray(b), cp.asarray(c)
    stream = cp.cuda.Stream(non_blocking=True)
    kernels.gemm(fam, config, da, db, dc, m, n, k, alpha=0.5, beta=2.0, stream=stream)
    stream.synchronize()
    ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + 2.0 * c
    from kernels.reference import relative_error, tolerance

    assert relative_error(cp.asnumpy(dc), ref) < tolerance(k)


def test_public_gemm_from_threads_running_other_shapes_of_one_config():
    """kernels.gemm caches a plan per shape; threads calling one config with different shapes
    at once must each get their own shape's launches (they once shared a mutable list)."""
    cp = pytest.importorskip("cupy")
    from concurrent.futures import ThreadPoolExecutor

    from kernels.reference import relative_error, tolerance

    fam = get_family("splitk")  # a workspace and a second launch: the most state per call
    config = fam.sample_accepted(1, seed=5)[0]
    shapes = [(97, 131, 257), (1023, 65, 999), (5, 1000, 33), (256, 256, 256)]

    def run(shape: tuple[int, int, int]) -> float:
        m, n, k = shape
        rng = np.random.default_rng(m * n * k)
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        worst = 0.0
        with cp.cuda.Device(0), cp.cuda.Stream(non_blocking=True) as stream:
            da, db = cp.asarray(a), cp.asarray(b)
            for _ in range(20):
                dc = cp.full((m, n), cp.nan, dtype=cp.float32)
                kernels.gemm(fam, config, da, db, dc, m, n, k, stream=stream)
                stream.synchronize()
                worst = max(worst, relative_error(cp.asnumpy(dc), a.astype(np.float64) @ b) / tolerance(k))
        return worst

    with ThreadPoolExecutor(len(shapes)) as pool:
        assert max(pool.map(run, shapes)) < 1.0


LAUNCH_TIME_SHAPES = [(127, 131, 257), (1023, 1025, 999), (67, 61, 8191)]


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if any(p.launch_time for p in f.params)])
def test_one_program_runs_every_launch_time_value(bench, name):
    """RASTER and SPLITK arrive as kernel arguments: one CUBIN serves every value of them, so
    each value is checked against float64 through the CUBIN compiled for another."""
    import itertools

    fam, arch = get_family(name), bench.arch()
    moving = [p for p in fam.params if p.launch_time]
    config = fam.sample_accepted(1, seed=random.randrange(1 << 30), arch=arch)[0]
    variants = [v for values in itertools.product(*(p.values for p in moving))
                if fam.accepts(v := dict(config, **{p.name: x for p, x in zip(moving, values)}), arch)]
    cubins: dict[bool, bytes] = {}
    for v in variants:  # compiled for the first variant of each kind (sliced K or not) only
        sliced = fam.splits(v) > 1
        if sliced not in cubins:
            cubins[sliced] = compile_config(fam, v, arch).cubin
    failures = []
    for m, n, k in LAUNCH_TIME_SHAPES:
        bench.set_problem(m, n, k, seed=random.randrange(1 << 30))
        for v in variants:
            r = bench.evaluate(cubins[fam.splits(v) > 1], fam.launches(v, m, n, k),
                               fam.workspace_bytes(v, m, n, k), fam.flops(m, n, k))
            if r["state"] != "ok":
                failures.append(f"{(m, n, k)} {v}: {r['state']} {r['error']}")
    assert len(variants) > 1 and not failures, "\n".join(failures)
