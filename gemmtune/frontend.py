"""`gemmtune.matmul`, as user code calls it: under torch.compile the custom op of torch_op.py
stands in for the whole call (one graph); PyTorch tensors take the lean path (torchpath.py)
where it applies; everything else, and every error, goes the general way (call.py)."""

from __future__ import annotations

import sys
from typing import Any

from .call import explain as _explain
from .call import matmul as _matmul
from .torchpath import tuned as _tuned
from .sources import Source


def matmul(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
           precision: str = "fp32", source: str | Source | None = None, strict: bool = False) -> Any:
    """out = alpha * op(a) @ op(b) + beta * out (+ bias on every row) with the best tuned kernel
    known for this GPU and problem.

    a (M×K), b (K×N), out (M×N): float32 on one CUDA device, each 2-D or 3-D (a batch of
    matrices, the batch first; a 2-D operand beside a 3-D one is broadcast over its batch), with
    unit stride along rows or columns: row-major arrays, transposed views (x.T, W.t()) and slices
    of either, whatever the leading dimension; out row-major. PyTorch tensors, CuPy arrays or
    anything with __cuda_array_interface__ (then out= is required). bias: N floats added to every
    row. Returns out, or a new array of a's library when out is None (like torch.matmul).
    precision: "fp32" (FFMA kernels or FP32-accurate tensor-core emulation) or "ffma" (FFMA only).
    source: a results database URL, the API's http(s):// base URL or a .json pack; default
    $GEMMTUNE_SOURCE, then the tuner's database. When the source has nothing for this GPU and
    problem (shape, layout, batch), or cuBLAS was measured faster, the library's own GEMM runs
    (PyTorch with TF32 off, or CuPy). An unreachable source warns once and falls back;
    strict=True raises gemmtune.SourceUnavailable instead. See explain() for the choice.
    """
    if _compiling(a):
        from .torch_op import compiled_matmul

        return compiled_matmul(a, b, out, alpha, beta, bias, precision, source, strict)
    if (type(a).__module__.startswith("torch") and type(alpha) is float and type(beta) is float
            and type(precision) is str and (source is None or type(source) is str) and not strict):
        done = _tuned(a, b, out, alpha, beta, bias, precision, source, exact_only=False)
        if done is not None:
            return done
    return _matmul(a, b, out, alpha=alpha, beta=beta, bias=bias, precision=precision, source=source,
                   strict=strict)


explain = _explain


def _compiling(a: Any) -> bool:
    """True while torch.compile traces a call (then the custom op stands in for the whole call)."""
    torch = sys.modules.get("torch")
    return torch is not None and type(a).__module__.startswith("torch") and torch.compiler.is_compiling()
