"""The FP16 rung on a real Hopper GPU: misaligned, transposed and batched operands, the path the
device chooses (FP16, or TF32 where a row's range does not fit FP16) and the accuracy bar.

Odd shapes (1x1x1, primes, K=1, 1023x1025x999, K=8191) and occupancy against the driver are
covered for every family, this one included, by tests/test_kernels_gpu.py.
Run on the GPU host: python -m pytest -m gpu tests/test_f16x3_gpu.py
"""
from __future__ import annotations

import numpy as np
import pytest
from bench_support import bench_module

import kernels
from kernels import runtime
from kernels.families.f16x3 import workspace_layout
from kernels.reference import relative_error, tolerance

pytestmark = pytest.mark.gpu
FAMILY = kernels.get_family("f16x3")
CONFIG = dict(FAMILY.starting_points[0])


@pytest.fixture(scope="module")
def cp(hopper_cupy):
    return hopper_cupy


def _accuracy():
    return bench_module("accuracy")


def _run(cp, config, a, b, c0, m, n, k, layout="nn", batch=1, misaligned=False):
    """C = 0.5 op(A) op(B) - 1.5 C0 with the family; returns (C, the path flags per batch entry)."""
    def device(host):
        if not misaligned:
            return cp.asarray(host)
        # a view one float into an array 3 floats wider: 4 bytes past 16-byte alignment, leading
        # dimension not a multiple of 4
        wide = cp.full(host.shape[:-1] + (host.shape[-1] + 3,), cp.nan, cp.float32)
        view = wide[..., 1:host.shape[-1] + 1]
        view[...] = cp.asarray(host)
        return view

    da, db_, dc = device(a), device(b), device(c0)
    stream = cp.cuda.get_current_stream()
    kernels.gemm(FAMILY, config, da, db_, dc, m, n, k, alpha=0.5, beta=-1.5, layout=layout, batch=batch,
                 stream=stream.ptr)
    made = runtime.plan(FAMILY, config, m, n, k, layout=layout, batch=batch)
    ws = runtime.workspace(0, stream.ptr, made.workspace_bytes)
    flags = np.zeros(batch, np.int32)
    stream.synchronize()
    cp.cuda.runtime.memcpy(flags.ctypes.data, ws + workspace_layout(config, m, n, k, batch).flags, 4 * batch,
                           cp.cuda.runtime.memcpyDeviceToHost)
    return cp.asnumpy(dc), flags.tolist()


def _reference(a, b, c0, layout):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if layout[0] == "t":
        a64 = np.swapaxes(a64, -1, -2)
    if layout[1] == "t":
        b64 = np.swapaxes(b64, -1, -2)
    return 0.5 * (a64 @ b64) - 1.5 * c0


@pytest.mark.parametrize("config", FAMILY.starting_points, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("shape", [(129, 67, 33), (5, 3, 1), (200, 301, 1000)], ids=lambda s: "x".join(map(str, s)))
def test_misaligned_operands_in_every_layout_take_the_fp16_path(cp, config, layout, shape):
    m, n, k = shape
    rng = np.random.default_rng(m * n * k)
    a = rng.standard_normal((k, m) if layout[0] == "t" else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if layout[1] == "t" else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    out, flags = _run(cp, config, a, b, c0, m, n, k, layout, misaligned=True)
    assert flags == [0]
    assert relative_error(out, _reference(a, b, c0, layout)) < tolerance(k)


def test_batch_entries_choose_their_path_each(cp):
    """Entry 1 holds a row whose elements span 2^40: it alone takes the TF32 path, and every entry
    is right (a batch with SPLITK 4, so the partials and the reduction see both paths)."""
    m, n, k, batch = 129, 67, 333, 3
    rng = np.random.default_rng(5)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    a[1, 7, :] *= np.exp2(rng.uniform(-20, 20, k)).astype(np.float32)
    c0 = rng.standard_normal((batch, m, n)).astype(np.float32)
    config = dict(CONFIG, SPLITK=4)
    out, flags = _run(cp, config, a, b, c0, m, n, k, batch=batch)
    assert flags == [0, 1, 0]
    ref = _reference(a, b, c0, "nn")
    for entry in range(batch):
        assert relative_error(out[entry], ref[entry]) < tolerance(k)


@pytest.mark.parametrize("what", ["wide row of A", "wide column of B", "inf in B"])
def test_rows_fp16_cannot_hold_take_the_tf32_path_with_a_right_answer(cp, what):
    """An element 2^-30 of its row's largest would lose bits of its low part in FP16: the TF32
    path runs, and the answer is as right as wgmma's; an Inf goes through as FP32 would carry it."""
    m, n, k = 200, 301, 77
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    if what == "wide row of A":
        a[3, 5] = np.float32(2.0 ** 31)  # the row's largest; its ~1-sized others are 2^-31 of it
    elif what == "wide column of B":
        b[7, 9] = np.float32(2.0 ** -31)
    else:
        b[0, 4] = np.inf
    out, flags = _run(cp, CONFIG, a, b, c0, m, n, k)
    assert flags == [1]
    ref = _reference(a, b, c0, "nn")
    if what == "inf in B":
        finite = np.isfinite(ref)
        assert not finite[:, 4].any() and np.isfinite(out[finite]).all()
        assert relative_error(out[finite], ref[finite]) < tolerance(k)
    else:
        assert relative_error(out, ref) < tolerance(k)


def test_a_row_of_fp16_range_just_inside_the_limit_stays_fp16_and_exact_to_22_bits(cp):
    """A row spanning exactly 28 binades keeps the FP16 path, and its smallest element, 2^-28 of
    the largest, still counts: its product with a column of B that is zero elsewhere comes out
    to FP32 accuracy."""
    m, n, k = 64, 64, 64
    a = np.ones((m, k), np.float32)
    a[:, 0] = np.float32(2.0 ** 28)
    a[:, 1] = np.float32(1.2345678)  # needs both hi and lo: 1.2345678 is not an FP16 value
    b = np.zeros((k, n), np.float32)
    b[1, :] = np.float32(1.0)
    b[0, 0] = np.float32(1.0)
    c0 = np.zeros((m, n), np.float32)
    out, flags = _run(cp, CONFIG, a, b, c0, m, n, k)
    assert flags == [0]
    ref = _reference(a, b, c0, "nn")
    assert np.max(np.abs(out[:, 1:] - ref[:, 1:]) / np.abs(ref[:, 1:])) < 2.0 ** -21


@pytest.mark.parametrize("kind", ["uniform", "normal", "wide", "cancellation", "tiny", "huge"])
def test_fp16_path_error_at_most_cublas_fp32s(cp, kind):
    """Issue 60's bar on every input kind of bench/accuracy.py that the FP16 path takes, at one
    shape: at most cuBLAS FP32's error on the same inputs, relative and component-wise."""
    accuracy = _accuracy()
    row = accuracy.measure(kind, 1024, 1024, 4096, {"f16x3": CONFIG}, seed=7)
    ratios = accuracy.ratios(row, "f16x3")
    assert ratios["relative"] <= 1.0 and ratios["componentwise"] <= 1.0, (kind, ratios, row)


@pytest.mark.parametrize("flush", [2, 4])
@pytest.mark.parametrize("k", [4096, 16384])
def test_tf32_path_error_at_most_cublas_fp32s(cp, k, flush):
    """The TF32 path (elements spanning 2^40 within rows) sums as wgmma does, cross terms first,
    with its flushes summed in blocks: at most cuBLAS FP32's error whatever FLUSH says (with the
    cross terms over all of K, FLUSH = 2 and one running sum it measured 1.15-1.29x, FLUSH = 4
    up to 1.20x component-wise; docs/kernels.md, "The range check and the TF32 path")."""
    accuracy = _accuracy()
    row = accuracy.measure("wide-elements", 1024, 1024, k, {"f16x3": dict(CONFIG, FLUSH=flush)}, seed=7)
    ratios = accuracy.ratios(row, "f16x3")
    assert ratios["relative"] <= 1.0 and ratios["componentwise"] <= 1.0, (ratios, row)
