"""The user side on a real GPU: gemmtune.matmul on transposed views, slices and batches, and the
PyTorch switch (forward and backward of real torch.nn modules, torch.compile, CUDA graph capture,
bad input left to torch, disabling), against float64.

The tuning source is a real SQLite database filled through db's write API with one config per
problem, faster than a planted cuBLAS baseline, so every call that can run a tuned kernel does.
Run on the GPU host: python -m pytest -m gpu tests/test_gemmtune_switch_gpu.py
"""
from __future__ import annotations

import pytest

import gemmtune
from kernels.reference import relative_error, tolerance
from results_support import CONFIGS, Row, fill

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of PyTorch and a GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


@pytest.fixture(scope="module")
def family(torch):
    """The fastest family there is on this GPU: wgmma on Hopper, else tf32x3."""
    major, _ = torch.cuda.get_device_capability()
    return "wgmma" if major == 9 else "tf32x3"


@pytest.fixture(autouse=True)
def fresh():
    gemmtune.clear_cache()
    yield
    gemmtune.disable()
    gemmtune.clear_cache()


def tuned_source(tmp_path, torch, family, problems) -> str:
    """A database with a tuned `family` config for each (m, n, k, layout, batch), beating cuBLAS."""
    gpu = torch.cuda.get_device_name()
    url = f"sqlite:///{tmp_path}/tuned.sqlite"
    rows = [Row(family, (m, n, k), 1e6, gpu=gpu, uuid="GPU-test", layout=layout, batch=batch,
                config=tuple(CONFIGS[family].items())) for m, n, k, layout, batch in set(problems)]
    fill(url, rows)
    return url


def f64(x):
    return x.detach().double()


STORED = {"n": lambda t: t, "t": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)}


def operand(torch, shape, letter, placement, batch):
    """A float32 operand of `shape` (rows, cols) as used, stored row-major ("n") or transposed
    ("t"), dense, as a slice of a wider matrix, or one float past 16-byte alignment."""
    rows, cols = shape
    full = (batch, rows, cols) if batch > 1 else (rows, cols)
    if placement == "dense":
        return STORED[letter](torch.rand(full, device="cuda") - 0.5)
    stored_rows, stored_cols = (rows, cols) if letter == "n" else (cols, rows)
    pad = 3 if placement == "misaligned" else 37
    start = 1 if placement == "misaligned" else 0
    wide = torch.rand((batch, stored_rows, stored_cols + pad) if batch > 1 else (stored_rows, stored_cols + pad),
                      device="cuda") - 0.5
    view = wide[..., start:start + stored_cols]
    return view if letter == "n" else view.transpose(-1, -2)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("placement", ["dense", "misaligned", "sliced"])
def test_matmul_takes_transposed_views_slices_and_batches(tmp_path, torch, family, layout, placement):
    shapes = [(1, 1, 1), (7, 13, 1), (131, 67, 97)]
    problems = [(m, n, k, layout, batch) for m, n, k in shapes for batch in (1, 3)]
    # a vector is row-major and column-major at once: tuned in every layout, so whichever is read
    source = tuned_source(tmp_path, torch, family, [(m, n, k, other, batch) for m, n, k, _, batch in problems
                                                    for other in ("nn", "nt", "tn", "tt")])
    for m, n, k, _, batch in problems:
        a = operand(torch, (m, k), layout[0], placement, batch)
        b = operand(torch, (k, n), layout[1], placement, batch)
        bias = torch.rand(n, device="cuda") - 0.5
        choice = gemmtune.explain(a, b, bias=bias, source=source)
        assert choice.kind == "kernel" and choice.batch == batch, choice
        if min(m, n, k) > 1:
            assert choice.layout == layout, choice
        got = gemmtune.matmul(a, b, bias=bias, alpha=0.5, source=source)
        want = 0.5 * (f64(a) @ f64(b)) + f64(bias)
        assert relative_error(got.cpu().numpy(), want.cpu().numpy()) < tolerance(k), (m, n, k, batch, choice)
        out = torch.full(got.shape, float("nan"), device="cuda")
        gemmtune.matmul(a, b, out, source=source)  # beta = 0: the NaNs must not leak
        assert relative_error(out.cpu().numpy(), (f64(a) @ f64(b)).cpu().numpy()) < tolerance(k)


def model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(67, 131), torch.nn.GELU(), torch.nn.Linear(131, 29)).cuda()


def attention(torch, x, w):
    """A batched GEMM pair as attention makes them: (x Wq)(x Wk)ᵀ, then times x."""
    q = x @ w
    scores = torch.matmul(q, q.transpose(1, 2))
    return torch.bmm(scores.softmax(-1), x)


def recorded_problems(torch, fn):
    with gemmtune.record_workload() as recorder:
        fn()
        torch.cuda.synchronize()
    return [(p["m"], p["n"], p["k"], p["layout"], p["batch"]) for p in recorder.workload()["problems"]]


def test_switch_runs_forward_and_backward_of_torch_modules_on_tuned_kernels(tmp_path, torch, family):
    net = model(torch)
    x = torch.randn(257, 67, device="cuda")
    xa = torch.randn(3, 33, 19, device="cuda", requires_grad=True)
    w = torch.randn(19, 19, device="cuda", requires_grad=True)

    def run():
        net.zero_grad(set_to_none=True)
        xa.grad = w.grad = None
        y = net(x)
        z = attention(torch, xa, w)
        (y.square().mean() + z.square().mean()).backward()
        return y, z

    problems = recorded_problems(torch, run)
    layouts = {p[3] for p in problems}
    assert {"nt", "nn", "tn"} <= layouts and any(p[4] == 3 for p in problems), problems  # linear fwd/bwd, bmm
    source = tuned_source(tmp_path, torch, family, problems)
    y0, z0 = (t.detach().clone() for t in run())
    torch_grads = [p.grad.clone() for p in net.parameters()] + [xa.grad.clone(), w.grad.clone()]
    with gemmtune.enabled(source=source) as counts:
        y, z = run()
        torch.cuda.synchronize()
    assert counts.torch == 0 and counts.routed >= len(problems), counts
    grads = [p.grad for p in net.parameters()] + [xa.grad, w.grad]
    # float64 reference of the same computation
    net64 = model(torch).double()
    net64.load_state_dict({k: v.double() for k, v in net.state_dict().items()})
    x64, xa64, w64 = f64(x), f64(xa).requires_grad_(), f64(w).requires_grad_()
    y64, z64 = net64(x64), attention(torch, xa64, w64)
    (y64.square().mean() + z64.square().mean()).backward()
    ref_grads = [p.grad for p in net64.parameters()] + [xa64.grad, w64.grad]
    names = ["y", "z", *(f"grad {n}" for n, _ in net.named_parameters()), "grad xa", "grad w"]
    report = []
    for name, (got, theirs, want) in zip(names, [(y, y0, y64), (z, z0, z64), *zip(grads, torch_grads, ref_grads)]):
        err = relative_error(got.detach().cpu().numpy(), want.detach().cpu().numpy())
        torch_err = relative_error(theirs.cpu().numpy(), want.detach().cpu().numpy())
        report.append(f"{name}: {err:.3g} (torch FP32 {torch_err:.3g})")
    print("\n".join(report))
    for line, (got, theirs, want) in zip(report, [(y, y0, y64), (z, z0, z64), *zip(grads, torch_grads, ref_grads)]):
        err = relative_error(got.detach().cpu().numpy(), want.detach().cpu().numpy())
        torch_err = relative_error(theirs.cpu().numpy(), want.detach().cpu().numpy())
        # FP32-accurate, not FP32's own rounding: 3xTF32's error per product (~2.4e-7 relative)
        # is 3-13x torch FP32's on this model's short-K GEMMs (docs/kernels.md, "Accuracy: FLUSH
        # and round-to-nearest splits"); a wrong layout, stride or batch errs by 1e-3 and more
        assert err < max(20 * torch_err, tolerance(512)), "\n".join(report)


def test_disable_restores_torch_exactly_and_bad_input_goes_to_torch(tmp_path, torch, family):
    a = torch.randn(64, 96, device="cuda")
    b = torch.randn(96, 80, device="cuda")
    source = tuned_source(tmp_path, torch, family, [(64, 80, 96, "nn", 1), (32, 40, 48, "nn", 1)])
    before = torch.mm(a, b)
    want = f64(a) @ f64(b)
    strided = a[::2, ::2], b[::2, ::2]  # no unit stride in either dimension
    torch_strided, torch_double = torch.mm(*strided), torch.mm(a.double(), b.double())
    with gemmtune.enabled(source=source) as counts:
        got = torch.mm(a, b)
        assert counts.routed == 1 and relative_error(got.cpu().numpy(), want.cpu().numpy()) < tolerance(96)
        # what the kernels cannot take goes to torch's own kernel, and gives torch's answer
        assert torch.equal(torch.mm(*strided), torch_strided)
        assert torch.equal(torch.mm(a.double(), b.double()), torch_double)
        overlapping = torch.randn(64, 96, device="cuda")
        torch.mm(overlapping, b, out=overlapping[:, :80])  # out overlaps an input: torch's business
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 asked for: torch's call, as asked
        try:
            torch.mm(a, b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        with pytest.raises(RuntimeError):  # what torch refuses, it still refuses
            torch.mm(a, b.T)
        assert counts.routed == 1 and counts.torch == 5, counts
    assert not gemmtune.is_enabled()
    assert torch.equal(torch.mm(a, b), before)  # bit for bit torch's own again


def test_switch_under_torch_compile_keeps_one_graph_and_routes(tmp_path, torch, family):
    import torch._dynamo

    net = model(torch)
    x = torch.randn(257, 67, device="cuda")
    problems = recorded_problems(torch, lambda: net(x))
    source = tuned_source(tmp_path, torch, family, problems)
    with gemmtune.enabled(source=source) as counts:
        report = torch._dynamo.explain(net)(x)
        assert report.graph_break_count == 0, report.break_reasons
        compiled = torch.compile(net)
        got = compiled(x)
        torch.cuda.synchronize()
        assert counts.routed > 0, counts
    with torch.no_grad():
        want = net.double()(f64(x))
    assert relative_error(got.detach().cpu().numpy(), want.cpu().numpy()) < tolerance(131)


def test_switch_inside_cuda_graph_capture(tmp_path, torch, family):
    a = torch.randn(129, 257, device="cuda")
    w = torch.randn(67, 257, device="cuda")
    bias = torch.randn(67, device="cuda")
    source = tuned_source(tmp_path, torch, family, [(129, 67, 257, "nt", 1)])
    with gemmtune.enabled(source=source) as counts:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up outside the capture: compile, load, plan
                torch.nn.functional.linear(a, w, bias)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = torch.nn.functional.linear(a, w, bias)
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        assert counts.routed >= 4
    want = f64(a) @ f64(w).T + f64(bias)
    assert relative_error(out.cpu().numpy(), want.cpu().numpy()) < tolerance(257)


def test_record_workload_counts_and_times_each_problem(torch):
    net = model(torch)
    x = torch.randn(257, 67, device="cuda")
    with gemmtune.record_workload() as recorder:
        for _ in range(3):
            net(x).sum().backward()
        torch.cuda.synchronize()
    workload = recorder.workload("test")
    rows = {(p["m"], p["n"], p["k"], p["layout"]): p for p in workload["problems"]}
    assert rows[(257, 131, 67, "nt")]["count"] == 3  # the first layer's forward: x @ W.T (addmm)
    assert rows[(131, 67, 257, "tn")]["count"] == 3  # its weight gradient: dYᵀ @ X
    assert abs(sum(p["share"] for p in workload["problems"]) - 1) < 1e-9
    assert workload["gpu"] == torch.cuda.get_device_name() and workload["gemm_ms"] > 0
