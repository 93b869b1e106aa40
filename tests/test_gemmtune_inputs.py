"""matmul's argument checks on CPU: plain-data stand-ins that carry only __cuda_array_interface__
(what CuPy, PyTorch and Numba hand over), host arrays, and PyTorch meta tensors under Dynamo."""

from __future__ import annotations

import numpy as np
import pytest

import gemmtune
from gemmtune.arrays import Gemm, Operand, check_gemm, from_cai


class DeviceArray:
    """Plain data in the __cuda_array_interface__ v3 layout; no memory behind the address."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=1 << 32, readonly=False, mask=None):
        self.__cuda_array_interface__ = {"version": 3, "shape": shape, "typestr": typestr, "data": (ptr, readonly),
                                         "strides": strides, "stream": 1, "mask": mask}


def gemm_shape(a, b, out=None, beta=0.0):
    ops = [from_cai(name, x)[0] if x is not None else None for name, x in (("a", a), ("b", b), ("out", out))]
    return check_gemm(*ops, beta)


def test_valid_operands_give_mnk_and_leading_dimensions():
    a, b = DeviceArray((7, 5)), DeviceArray((5, 3), ptr=2 << 32)
    assert gemm_shape(a, b) == Gemm(7, 3, 5, "nn", 1)
    padded = from_cai("a", DeviceArray((7, 5), strides=(8 * 4, 4)))[0]  # rows of a wider matrix
    assert (padded.ld, padded.transposed) == (8, False)
    assert from_cai("a", DeviceArray((7, 5), strides=(20, 4)))[0].ld == 5
    # Size-1 dimensions may carry any stride (PyTorch gives them odd ones).
    assert from_cai("a", DeviceArray((1, 5), strides=(4, 4)))[0].ld == 5
    assert from_cai("a", DeviceArray((5, 1), strides=(4, 999)))[0].ld == 1
    out = DeviceArray((7, 3), ptr=3 << 32)
    assert gemm_shape(a, b, out, beta=0.5) == Gemm(7, 3, 5, "nn", 1)


def test_transposed_views_and_slices_give_the_layout():
    """x @ W.T as nn.Linear calls it: W (N x K) row-major, so B = W.T is a column-major view."""
    x = DeviceArray((7, 5))
    w_t = DeviceArray((5, 3), strides=(4, 5 * 4), ptr=2 << 32)  # W.t() of a 3x5 W
    assert gemm_shape(x, w_t) == Gemm(7, 3, 5, "nt", 1)
    assert from_cai("b", w_t)[0] == Operand(2 << 32, 5, 3, 5, True)
    # a transposed slice of a wider matrix: ld is the stored row length, larger than the rows used
    a_t = from_cai("a", DeviceArray((7, 5), strides=(4, 64 * 4)))[0]
    assert (a_t.transposed, a_t.ld) == (True, 64)
    assert gemm_shape(DeviceArray((7, 5), strides=(4, 7 * 4)), DeviceArray((5, 3), strides=(4, 20), ptr=2 << 32)
                      ) == Gemm(7, 3, 5, "tt", 1)


def test_batches_and_broadcast():
    a = DeviceArray((4, 7, 5))
    b = DeviceArray((4, 5, 3), ptr=2 << 32)
    assert gemm_shape(a, b) == Gemm(7, 3, 5, "nn", 4)
    op = from_cai("a", DeviceArray((4, 7, 5), strides=(7 * 8 * 4, 8 * 4, 4)))[0]
    assert (op.batch, op.stride, op.ld) == (4, 56, 8)
    # one matrix broadcast over the other's batch (torch.matmul's (B, M, K) @ (K, N))
    assert gemm_shape(a, DeviceArray((5, 3), ptr=2 << 32)) == Gemm(7, 3, 5, "nn", 4)
    with pytest.raises(ValueError, match="batch sizes differ: a has 4 matrices, b has 3"):
        gemm_shape(a, DeviceArray((3, 5, 3), ptr=2 << 32))
    with pytest.raises(ValueError, match=r"out must have shape \(4, 7, 3\)"):
        gemm_shape(a, b, DeviceArray((7, 3), ptr=3 << 32))
    with pytest.raises(ValueError, match="out's batch entries overlap"):
        gemm_shape(a, b, DeviceArray((4, 7, 3), strides=(4, 12, 4), ptr=3 << 32))


def test_bias_and_out_layouts():
    a, b = DeviceArray((7, 5)), DeviceArray((5, 3), ptr=2 << 32)
    pa, pb = from_cai("a", a)[0], from_cai("b", b)[0]
    with pytest.raises(ValueError, match="bias must be a vector of n=3 floats"):
        check_gemm(pa, pb, None, 0.0, Operand(4 << 32, 1, 4, 4))
    assert check_gemm(pa, pb, None, 0.0, Operand(4 << 32, 1, 3, 3)) == Gemm(7, 3, 5, "nn", 1)
    with pytest.raises(ValueError, match="out must be row-major"):
        gemm_shape(a, b, DeviceArray((7, 3), strides=(4, 28), ptr=3 << 32))


@pytest.mark.parametrize("x, error, message", [
    (DeviceArray((4, 4), typestr="<f8"), TypeError, "a must hold float32 data, got typestr '<f8'"),
    (DeviceArray((4, 4), typestr="<f2"), TypeError, "float32"),
    (DeviceArray((2, 4, 4, 4)), ValueError, "a must be a 2-D matrix or a 3-D batch of matrices, got 4-D"),
    (DeviceArray((16,)), ValueError, "2-D"),
    (DeviceArray((4, 4), strides=(8, 16)), ValueError, "unit stride along its rows or its columns.*contiguous"),
    (DeviceArray((4, 4), strides=(8, 4)), ValueError, "unit stride along its rows or its columns"),  # rows overlap
    (DeviceArray((4, 4), mask=(0, False)), ValueError, "masked"),
    (np.zeros((4, 4), np.float32), TypeError, "a is a numpy.ndarray in host memory.*cupy.asarray"),
    ([[1.0, 2.0]], TypeError, "a must be a PyTorch tensor on a CUDA device, a CuPy array"),
])
def test_bad_operands_name_the_argument_and_what_is_allowed(x, error, message):
    with pytest.raises(error, match=message):
        from_cai("a", x)


def test_shapes_that_do_not_fit():
    a, b = DeviceArray((7, 5)), DeviceArray((6, 3), ptr=2 << 32)
    with pytest.raises(ValueError, match=r"inner dimensions differ: a is 7x5, b is 6x3"):
        gemm_shape(a, b)
    b = DeviceArray((5, 3), ptr=2 << 32)
    with pytest.raises(ValueError, match=r"out must have shape \(7, 3\).*got \(3, 7\)"):
        gemm_shape(a, b, DeviceArray((3, 7), ptr=3 << 32))
    with pytest.raises(ValueError, match="beta=0.5 needs out="):
        gemm_shape(a, b, beta=0.5)
    with pytest.raises(ValueError, match="out is read-only"):
        gemm_shape(a, b, DeviceArray((7, 3), ptr=3 << 32, readonly=True))
    with pytest.raises(ValueError, match="out overlaps a"):
        gemm_shape(a, b, DeviceArray((7, 3), ptr=(1 << 32) + 8))


def test_overlap_is_by_span_not_start():
    a = Operand(1000, 2, 2, 2)  # bytes [1000, 1016)
    assert check_gemm(a, Operand(5000, 2, 2, 2), Operand(1016, 2, 2, 2), 0.0) == Gemm(2, 2, 2, "nn", 1)
    with pytest.raises(ValueError, match="overlaps a"):
        check_gemm(a, Operand(5000, 2, 2, 2), Operand(1012, 2, 2, 2), 0.0)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(alpha=True), TypeError, "alpha must be a real number"),
    (dict(alpha="2"), TypeError, "alpha must be a real number"),
    (dict(beta=float("nan")), ValueError, "beta must be finite"),
    (dict(precision="tf32"), ValueError, "precision must be one of 'ffma', 'fp32'"),
])
def test_bad_scalars_and_precision(kwargs, error, message):
    # Checked before anything touches a GPU, so these stand-ins are enough.
    with pytest.raises(error, match=message):
        gemmtune.matmul(DeviceArray((4, 4)), DeviceArray((4, 4), ptr=2 << 32), **kwargs)


def test_mixed_array_libraries_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="same array library; got a: torch.Tensor, b: .*DeviceArray"):
        gemmtune.matmul(torch.zeros(2, 2), DeviceArray((2, 2)))


def test_host_arrays_and_bad_inputs_through_matmul():
    with pytest.raises(TypeError, match="host memory"):
        gemmtune.matmul(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        gemmtune.matmul(DeviceArray((2, 3)), DeviceArray((2, 2), ptr=2 << 32))


# --- PyTorch (CPU build is enough for these) ----------------------------------------------------------


def test_torch_cpu_tensors_are_refused_with_a_hint():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"a is a torch.Tensor in host memory \(device cpu\).*tensor.cuda\(\)"):
        gemmtune.matmul(torch.zeros(2, 2), torch.zeros(2, 2))


def test_torch_compile_traces_one_graph_with_the_custom_op():
    torch = pytest.importorskip("torch")
    import torch._dynamo

    def f(a, b, c):
        x = gemmtune.matmul(a, b, alpha=2.0) + 1
        gemmtune.matmul(x, b.t().contiguous(), c, beta=0.5)
        return c * 3

    # Meta tensors: Dynamo traces, the fake implementation answers shapes, nothing runs on a GPU.
    a, b, c = (torch.empty(s, device="meta") for s in ((8, 4), (4, 5), (8, 4)))
    report = torch._dynamo.explain(f)(a, b, c)
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons
    code = report.graphs[0].code
    assert "torch.ops.gemmtune.matmul(" in code and "torch.ops.gemmtune.matmul_out(" in code
    out = torch.compile(f, backend="eager", fullgraph=True)(a, b, c)
    assert out.shape == (8, 4) and out.device.type == "meta"
    with pytest.raises(Exception, match="inner dimensions differ"):
        torch.compile(f, backend="eager", fullgraph=True)(a, torch.empty(3, 5, device="meta"), c)


def test_layering_gemmtune_imports_no_tuner_api_torch_or_cupy():
    import subprocess
    import sys

    code = ("import sys, gemmtune, gemmtune.__main__, gemmtune.pack, gemmtune.sources, gemmtune.dispatch, "
            "gemmtune.switch, gemmtune.workload; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tuner', 'api', 'torch', 'cupy', 'optuna'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
