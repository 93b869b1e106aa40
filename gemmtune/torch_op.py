"""`matmul` as a torch.library custom op, so torch.compile keeps it in one graph.

Under torch.compile, gemmtune.matmul on tensors calls `torch.ops.gemmtune.matmul` (or
`matmul_out` with out=): Dynamo records the op without tracing into our Python, and the fake
implementation gives the result's shape, dtype and device. At run time the op calls the eager
matmul of call.py (lookup, kernel launch on the current stream). The source is passed as a string (a
source object cannot cross the op boundary); None becomes "" (the default source).
Eager calls skip the op: its dispatch would cost more than the whole host-side lookup.
"""

from __future__ import annotations

from typing import Any

import torch

from .arrays import check_scalar
from .call import matmul
from .precision import check_precision


@torch.library.custom_op("gemmtune::matmul", mutates_args=())
def _matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, alpha: float, beta: float, precision: str,
            source: str, strict: bool) -> torch.Tensor:
    return matmul(a, b, alpha=alpha, beta=beta, bias=bias, precision=precision, source=source or None, strict=strict)


@_matmul.register_fake
def _matmul_fake(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, alpha: float, beta: float,
                 precision: str, source: str, strict: bool) -> torch.Tensor:
    return a.new_empty(_result_shape(a, b, None))


@torch.library.custom_op("gemmtune::matmul_out", mutates_args=("out",))
def _matmul_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None, alpha: float,
                beta: float, precision: str, source: str, strict: bool) -> None:
    matmul(a, b, out, alpha=alpha, beta=beta, bias=bias, precision=precision, source=source or None, strict=strict)


@_matmul_out.register_fake
def _matmul_out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None, alpha: float,
                     beta: float, precision: str, source: str, strict: bool) -> None:
    _result_shape(a, b, out)


def _result_shape(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> tuple[int, ...]:
    """The checks that need no data, at trace time (the rest run when the op runs), and the
    result's shape."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is None:
            continue
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must hold float32 data, got {t.dtype}")
        if t.dim() not in (2, 3):
            raise ValueError(f"{name} must be a 2-D matrix or a 3-D batch of matrices, got {t.dim()}-D shape "
                             f"{tuple(t.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    shape = (a.shape[-2], b.shape[-1]) if max(a.dim(), b.dim()) == 2 else (batch, a.shape[-2], b.shape[-1])
    if out is not None and tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    return shape


def compiled_matmul(a: Any, b: Any, out: Any, alpha: Any, beta: Any, bias: Any, precision: Any, source: Any,
                    strict: bool) -> Any:
    if source is not None and not isinstance(source, str):
        raise TypeError("under torch.compile, source must be a string (database URL, API URL or pack path) or None")
    alpha, beta = check_scalar("alpha", alpha), check_scalar("beta", beta)
    check_precision(precision)
    if out is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs out= (C = alpha*A*B + beta*C reads C)")
        return torch.ops.gemmtune.matmul(a, b, bias, alpha, beta, precision, source or "", bool(strict))
    torch.ops.gemmtune.matmul_out(a, b, out, bias, alpha, beta, precision, source or "", bool(strict))
    return out
