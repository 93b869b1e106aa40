"""gemmtune.matmul on a real GPU (marker `gpu`; skipped where there is none): results against
float64 on odd shapes with PyTorch and CuPy, both precisions, alpha/beta, a non-default stream,
a second device when there is one, the library fallbacks, and torch.compile.

The tuning source is a SQLite file written here through db's API for this GPU's model, with
configs every architecture from sm_80 accepts, so which kernel runs is known in advance."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from results_support import Row, fill

import gemmtune
from kernels.reference import relative_error, tolerance

pytestmark = pytest.mark.gpu

ODD = [(1, 1, 1), (17, 3, 65), (1023, 1025, 999), (2048, 3, 100), (5, 4099, 33)]


@pytest.fixture(scope="module")
def gpu_name():
    from gemmtune.call import device_info

    return device_info(0)[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory, gpu_name):
    """blocktile2d (FFMA) and tf32x3 (FP32 emulation, faster) tuned on 1024³ for this GPU model:
    precision "ffma" runs blocktile2d, "fp32" runs tf32x3, at every shape (nearest)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu')}/r.sqlite"
    fill(url, [Row("blocktile2d", (1024, 1024, 1024), 10_000.0, gpu=gpu_name, uuid="GPU-test-0"),
               Row("tf32x3", (1024, 1024, 1024), 40_000.0, gpu=gpu_name, uuid="GPU-test-0")])
    return url


def check(out, a, b, alpha=1.0, beta=0.0, c0=None):
    a64, b64 = (np.asarray(x, dtype=np.float64) for x in (a, b))
    ref = alpha * a64 @ b64 + (beta * np.asarray(c0, dtype=np.float64) if c0 is not None else 0.0)
    err = relative_error(np.asarray(out), ref)
    assert err < tolerance(a64.shape[1]), err


@pytest.mark.parametrize("precision, family", [("ffma", "blocktile2d"), ("fp32", "tf32x3")])
@pytest.mark.parametrize("shape", ODD, ids=lambda s: "x".join(map(str, s)))
def test_torch_results_against_float64(source, shape, precision, family):
    torch = pytest.importorskip("torch")
    m, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    a = torch.rand(m, k, device="cuda", generator=g) - 0.5
    b = torch.rand(k, n, device="cuda", generator=g) - 0.5
    choice = gemmtune.explain(a, b, precision=precision, source=source)
    assert (choice.kind, choice.family) == ("kernel", family), str(choice)
    out = gemmtune.matmul(a, b, precision=precision, source=source)
    assert isinstance(out, torch.Tensor) and out.shape == (m, n) and out.device == a.device
    torch.cuda.synchronize()
    check(out.cpu(), a.cpu(), b.cpu())


def test_torch_alpha_beta_out_and_padded_rows(source):
    torch = pytest.importorskip("torch")
    a = torch.rand(300, 130, device="cuda")[:, :129]  # rows of a wider matrix: lda = 130
    b, c0 = torch.rand(129, 77, device="cuda"), torch.rand(300, 77, device="cuda")
    out = c0.clone()
    assert gemmtune.matmul(a, b, out, alpha=-1.5, beta=0.25, source=source) is out
    torch.cuda.synchronize()
    check(out.cpu(), a.cpu(), b.cpu(), -1.5, 0.25, c0.cpu())
    with pytest.raises(ValueError, match="unit stride along its rows or its columns"):
        gemmtune.matmul(a[::2, ::2], torch.rand(65, 5, device="cuda"), source=source)


def test_cupy_results_against_float64(source):
    cp = pytest.importorskip("cupy")
    for precision, family in (("ffma", "blocktile2d"), ("fp32", "tf32x3")):
        for m, n, k in ODD:
            rng = cp.random.default_rng(m + n)
            a = rng.random((m, k), dtype=cp.float32) - 0.5
            b = rng.random((k, n), dtype=cp.float32) - 0.5
            assert gemmtune.explain(a, b, precision=precision, source=source).family == family
            out = gemmtune.matmul(a, b, precision=precision, source=source)
            assert isinstance(out, cp.ndarray) and out.shape == (m, n)
            check(cp.asnumpy(out), cp.asnumpy(a), cp.asnumpy(b))
    with pytest.raises(TypeError, match="float32"):
        gemmtune.matmul(a.astype(cp.float64), b, source=source)


def test_runs_on_the_current_torch_stream(source):
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    x = torch.rand(2048, 2048, device="cuda")
    b = torch.rand(2048, 257, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        a = x @ x  # written on s; the tuned kernel must read it after, on the same stream
        out = gemmtune.matmul(a, b, source=source)
    s.synchronize()
    check(out.cpu(), a.cpu(), b.cpu())


def test_runs_on_the_current_cupy_stream(source):
    cp = pytest.importorskip("cupy")
    a = cp.random.random((513, 257), dtype=cp.float32)
    b = cp.random.random((257, 129), dtype=cp.float32)
    with cp.cuda.Stream(non_blocking=True) as s:
        out = gemmtune.matmul(a, b, source=source)
        s.synchronize()
    check(cp.asnumpy(out), cp.asnumpy(a), cp.asnumpy(b))


def test_second_device(source):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU only")
    from gemmtune.call import device_info

    a = torch.rand(333, 222, device="cuda:1")
    b = torch.rand(222, 111, device="cuda:1")
    if device_info(1)[0] == device_info(0)[0]:
        assert gemmtune.explain(a, b, source=source).kind == "kernel"
    torch.cuda.set_device(0)
    out = gemmtune.matmul(a, b, source=source)
    assert out.device == a.device
    assert torch.cuda.current_device() == 0  # the caller's current device is left as it was
    gemmtune.matmul(a, b, alpha=2, source=source)  # an int alpha takes the general path
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    check(out.cpu(), a.cpu(), b.cpu())
    with pytest.raises(ValueError, match="device"):
        gemmtune.matmul(a, torch.rand(222, 111, device="cuda:0"), source=source)


def test_library_fallbacks_give_the_same_results(tmp_path, gpu_name):
    torch = pytest.importorskip("torch")
    a, b = torch.rand(100, 50, device="cuda"), torch.rand(50, 70, device="cuda")
    url = f"sqlite:///{tmp_path}/slow.sqlite"
    fill(url, [Row("naive", (100, 70, 50), 1.0, gpu=gpu_name, uuid="GPU-test-1")], {(100, 70, 50): 1e6})
    choice = gemmtune.explain(a, b, source=url)
    assert choice.kind == "library" and "cuBLAS measured" in choice.reason
    torch.backends.cuda.matmul.allow_tf32 = True  # must not leak into our fallback, and is restored
    try:
        check(gemmtune.matmul(a, b, source=url).cpu(), a.cpu(), b.cpu())
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = gemmtune.matmul(a, b, source="http://127.0.0.1:9/")
    assert any("cannot reach" in str(w.message) for w in seen)
    check(out.cpu(), a.cpu(), b.cpu())
    with pytest.raises(gemmtune.SourceUnavailable):
        gemmtune.matmul(a, b, source="http://127.0.0.1:9/", strict=True)
    empty = gemmtune.matmul(torch.rand(4, 0, device="cuda"), torch.rand(0, 3, device="cuda"), source=url)
    assert empty.shape == (4, 3) and not empty.any()


def test_torch_compile_without_graph_breaks(source):
    torch = pytest.importorskip("torch")
    import torch._dynamo

    def f(a, b):
        return torch.relu(gemmtune.matmul(a, b, source=source)) * 2

    a, b = torch.rand(257, 129, device="cuda"), torch.rand(129, 65, device="cuda")
    report = torch._dynamo.explain(f)(a, b)
    assert report.graph_break_count == 0 and report.graph_count == 1, report.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    out = compiled(a, b)
    torch.cuda.synchronize()
    assert torch.allclose(out, f(a, b), rtol=1e-5, atol=1e-5)
    check((out / 2).cpu(), a.cpu(), b.cpu())  # inputs in [0, 1): relu changes nothing
