"""The Hopper family on a real Hopper GPU: misaligned operands and the accuracy bar.

Odd shapes (1x1x1, primes, K=1, 1023x1025x999, K=8191) and occupancy against the driver are
covered for every family, this one included, by tests/test_kernels_gpu.py.
Run on the GPU host: python -m pytest -m gpu tests/test_wgmma_gpu.py
"""
from __future__ import annotations

import numpy as np
import pytest
from bench_support import bench_module

import kernels
from kernels.reference import relative_error, tolerance

pytestmark = pytest.mark.gpu
FAMILY = kernels.get_family("wgmma")


@pytest.fixture(scope="module")
def cp(hopper_cupy):
    return hopper_cupy


def _accuracy():
    return bench_module("accuracy")


# Each starting point with A split by the pre-pass and, where A is aligned, in shared memory.
CONFIGS = [dict(c, ASPLIT=a) for c in FAMILY.starting_points for a in (0, 1)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("shape", [(129, 67, 33), (200, 301, 77), (5, 3, 1)], ids=lambda s: "x".join(map(str, s)))
def test_operands_at_4_byte_aligned_addresses_with_odd_leading_dims(cp, config, shape):
    m, n, k = shape
    rng = np.random.default_rng(m * n * k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    # Views one float into arrays 3 floats wider: addresses 4 bytes past 16-byte alignment,
    # leading dimensions k+3 / n+3 (not multiples of 4), so no TMA view can read A or B in place
    # and every operand takes its fallback (the pre-pass's aligned copies).
    views = []
    for host in (a, b, c0):
        wide = cp.full((host.shape[0], host.shape[1] + 3), cp.nan, cp.float32)
        view = wide[:, 1:host.shape[1] + 1]
        view[...] = cp.asarray(host)
        views.append(view)
    da, db_, dc = views
    kernels.gemm(FAMILY, config, da, db_, dc, m, n, k, alpha=0.5, beta=-1.5)
    cp.cuda.runtime.deviceSynchronize()
    ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 1.5 * c0
    assert relative_error(cp.asnumpy(dc), ref) < tolerance(k)


# bench/accuracy.py's target: at or below cuBLAS FP32's error on every input kind, here at
# K = 4096, where cuBLAS splits K and the interleaved sum order measured 1.21x on uniform inputs
# (docs/kernels.md, "A model of the tensor core's accumulation"). Seed 7: not the bench's inputs.
@pytest.mark.parametrize("asplit", [0, 1])
@pytest.mark.parametrize("kind", ["uniform", "normal", "wide", "wide-elements", "cancellation", "tiny", "huge"])
def test_error_at_most_cublas_fp32s(cp, kind, asplit):
    accuracy = _accuracy()
    config = dict(FAMILY.starting_points[0], ASPLIT=asplit)
    row = accuracy.measure(kind, 1024, 1024, 4096, {"wgmma": config}, seed=7)
    r = accuracy.ratios(row, "wgmma")
    assert max(r.values()) <= accuracy.TARGET_RATIO, row
