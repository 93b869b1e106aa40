"""Every family in every layout on a real GPU: transposed operands, leading dimensions wider than
the rows, 4-byte-misaligned addresses, batches (strided and broadcast) and a bias vector, on odd
shapes, against float64.

Run on the GPU host: python -m pytest -m gpu tests/test_layouts_gpu.py
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import kernels
from kernels import FAMILIES, LAYOUTS, compile_config, get_family, stored_shapes
from kernels.reference import relative_error, tolerance

pytestmark = pytest.mark.gpu

# 1x1x1, K = 1, primes, sizes that are multiples of nothing, one with K past a few tiles.
SHAPES = [(1, 1, 1), (7, 13, 1), (37, 131, 67), (130, 67, 259)]
PLACEMENTS = ("dense", "misaligned", "sliced")


def _configs(name: str) -> list[dict[str, int]]:
    """One or two configs per family: its first starting point (or a fixed sample), and for the
    families that slice K or split A in the kernel, the other variant too."""
    fam = get_family(name)
    first = fam.first_config(seed=3)
    configs = [first]
    if "SPLITK" in first:
        sliced = [dict(c) for c in fam.starting_points if c["SPLITK"] > 1]
        configs.append(sliced[0] if sliced else dict(first, SPLITK=4))
    if "ASPLIT" in first:
        configs.append(dict(first, ASPLIT=1 - first["ASPLIT"]))
    return [c for c in configs if fam.accepts(c)]


JOBS = [(name, config, layout) for name in FAMILIES for config in _configs(name) for layout in LAYOUTS]
# A batch and the bias are compiled in (BATCHED, BIAS): each kind of problem is its own program.
PROBLEMS = (dict(batch=1, bias=False), dict(batch=1, bias=True), dict(batch=3, bias=True), dict(batch=4, bias=False))


def _compile(job):
    name, config, layout, arch = job
    for problem in PROBLEMS:
        compile_config(get_family(name), config, arch, layout=layout, **problem)


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.Device(0).compute_capability
    except Exception as e:  # no driver or device
        pytest.skip(f"no usable GPU: {e}")
    return cupy


@pytest.fixture(scope="module")
def arch(cp):
    from kernels.runtime import device_arch

    arch = device_arch(0)
    jobs = [(name, config, layout, arch) for name, config, layout in JOBS if get_family(name).offered_on(arch)]
    with ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, jobs))  # into the CUBIN cache, in parallel
    return arch


def _place(cp, host: np.ndarray, how: str):
    """Device copy of a (batch, rows, cols) array: dense; one float past 16-byte alignment with
    a leading dimension of cols + 3; or a slice of a wider, aligned array (ld = cols rounded to 4,
    plus 32)."""
    batch, rows, cols = host.shape
    if how == "dense":
        return cp.asarray(host)
    if how == "misaligned":
        wide = cp.full((batch, rows, cols + 3), cp.nan, cp.float32)
        view = wide[:, :, 1:cols + 1]
    else:
        wide = cp.full((batch, rows + 2, (cols + 3) // 4 * 4 + 32), cp.nan, cp.float32)
        view = wide[:, 1:rows + 1, :cols]
    view[...] = cp.asarray(host)
    return view


def _check(cp, name, config, layout, shape, how, batch, bias, broadcast_b=False):
    m, n, k = shape
    (ra, ca), (rb, cb) = stored_shapes(layout, m, n, k)
    rng = np.random.default_rng(m * 7 + n * 5 + k * 3 + batch)
    a = rng.uniform(-1, 1, (batch, ra, ca)).astype(np.float32)
    b = rng.uniform(-1, 1, (1 if broadcast_b else batch, rb, cb)).astype(np.float32)
    c0 = rng.uniform(-1, 1, (batch, m, n)).astype(np.float32)
    vec = rng.uniform(-1, 1, n).astype(np.float32) if bias else None
    op_a = a.transpose(0, 2, 1) if layout[0] == "t" else a
    op_b = b.transpose(0, 2, 1) if layout[1] == "t" else b
    product = np.matmul(op_a.astype(np.float64), op_b.astype(np.float64))
    da, db_ = _place(cp, a, how), _place(cp, b, how)
    strides = None
    if broadcast_b:
        strides = (da.strides[0] // 4, 0, None)
    errors = []
    for alpha, beta in ((1.25, 0.0), (0.5, -1.5)):
        dc = _place(cp, c0, how)
        if beta == 0.0:
            dc[...] = cp.nan  # poison: an unwritten output, or one read with beta = 0, shows
        args = (da, db_, dc) if batch > 1 else (da[0], db_[0], dc[0])
        opts = dict(layout=layout, batch=batch)
        if strides is not None:
            opts["strides"] = (strides[0], 0, dc.strides[0] // 4)
        if vec is not None:
            opts["bias"] = cp.asarray(vec)
        kernels.gemm(get_family(name), config, *args, m, n, k, alpha=alpha, beta=beta, **opts)
        cp.cuda.runtime.deviceSynchronize()
        ref = alpha * product + beta * c0.astype(np.float64)
        if vec is not None:
            ref = ref + vec.astype(np.float64)
        err = relative_error(cp.asnumpy(dc), ref)
        if not err < tolerance(k):
            errors.append(f"alpha={alpha} beta={beta}: relative error {err:.3g}")
    return errors


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("how", PLACEMENTS)
def test_every_family_in_every_layout_matches_float64(cp, arch, layout, how):
    failures = []
    for name, config, lay in JOBS:
        if lay != layout or not get_family(name).offered_on(arch):
            continue
        for shape in SHAPES:
            for problem in PROBLEMS[:3]:
                for e in _check(cp, name, config, layout, shape, how, **problem):
                    failures.append(f"{name} {config} {shape} {problem}: {e}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_broadcast_b_with_batch_stride_zero(cp, arch, layout):
    """(batch, M, K) @ (K, N) as torch.matmul broadcasts it: B's batch stride is 0 (TMA cannot
    express that, so wgmma reads the pre-pass's copy)."""
    failures = []
    for name, config, lay in JOBS:
        if lay != layout or not get_family(name).offered_on(arch):
            continue
        for e in _check(cp, name, config, layout, (37, 131, 67), "dense", **PROBLEMS[3], broadcast_b=True):
            failures.append(f"{name} {config}: {e}")
    assert not failures, "\n".join(failures)
