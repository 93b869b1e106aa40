"""The Hopper families' epilogue (kernels/families/hopper.cuh, store_fragment) on a real GPU: C
read (beta != 0) and written, with and without a bias, in the layouts of C its paired stores
branch on -- rows 8-byte aligned with an odd N (the last column stored alone), C 4 bytes past
alignment, an odd leading dimension -- and split-K, whose partials take their own path.

Run on the GPU host: python -m pytest -m gpu tests/test_hopper_epilogue_gpu.py
"""
from __future__ import annotations

import numpy as np
import pytest

import kernels
from kernels.reference import relative_error, tolerance

pytestmark = pytest.mark.gpu
M, N, K = 131, 197, 77  # neither a multiple of any tile nor even

CONFIGS = [(name, dict(config)) for name in ("f16x3", "wgmma")
           for config in (kernels.get_family(name).starting_points[0],
                          next(c for c in kernels.get_family(name).starting_points if c["SPLITK"] > 1))]
# C's leading dimension and the offset of its first element, in floats, within a wider array
C_LAYOUTS = {"rows-aligned-odd-n": (N + 1, 0), "four-bytes-off": (N + 1, 1), "odd-ld": (N + 2, 0)}


@pytest.fixture(scope="module")
def cp(hopper_cupy):
    return hopper_cupy


@pytest.mark.parametrize("name,config", CONFIGS, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
@pytest.mark.parametrize("c_layout", list(C_LAYOUTS))
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_c_read_and_written_in_every_layout_of_c(cp, name, config, c_layout, with_bias):
    ldc, offset = C_LAYOUTS[c_layout]
    rng = np.random.default_rng(M + ldc + offset)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    # C inside a NaN-filled array: what lies beyond its N columns must stay untouched
    whole = cp.full(M * ldc + 8, cp.nan, cp.float32)
    c = whole[offset:offset + M * ldc].reshape(M, ldc)
    c[:, :N] = cp.asarray(c0)
    kernels.gemm(name, config, cp.asarray(a), cp.asarray(b), c[:, :N], M, N, K, alpha=0.5, beta=-1.5,
                 bias=cp.asarray(bias) if with_bias else None)  # the view's strides give ldc
    out = cp.asnumpy(c)
    ref = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 1.5 * c0 + (bias if with_bias else 0.0)
    assert relative_error(out[:, :N], ref) < tolerance(K)
    assert np.isnan(out[:, N:]).all()  # the padding of each row
    assert np.isnan(cp.asnumpy(whole[:offset])).all() and np.isnan(cp.asnumpy(whole[offset + M * ldc:])).all()
