"""`matmul` as a torch.library custom op, so torch.compile keeps it in one graph.

Under torch.compile, gemmtune.matmul on tensors calls `torch.ops.gemmtune.matmul` (or
`matmul_out` with out=): Dynamo records the op without tracing into our Python, and the fake
implementation gives the result's shape, dtype and device. At run time the op calls the eager
matmul (lookup, kernel launch on the current stream). The source is passed as a string (a
source object cannot cross the op boundary); None becomes "" (the default source).
Eager calls skip the op: its dispatch would cost more than the whole host-side lookup.
"""

from __future__ import annotations

from typing import Any

import torch

from .arrays import check_scalar
from .precision import check_precision


@torch.library.custom_op("gemmtune::matmul", mutates_args=())
def _matmul(a: torch.Tensor, b: torch.Tensor, alpha: float, beta: float, precision: str, source: str,
            strict: bool) -> torch.Tensor:
    from .call import matmul

    return matmul(a, b, alpha=alpha, beta=beta, precision=precision, source=source or None, strict=strict)


@_matmul.register_fake
def _matmul_fake(a: torch.Tensor, b: torch.Tensor, alpha: float, beta: float, precision: str, source: str,
                 strict: bool) -> torch.Tensor:
    _check_fake(a, b, None)
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("gemmtune::matmul_out", mutates_args=("out",))
def _matmul_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float, beta: float, precision: str,
                source: str, strict: bool) -> None:
    from .call import matmul

    matmul(a, b, out, alpha=alpha, beta=beta, precision=precision, source=source or None, strict=strict)


@_matmul_out.register_fake
def _matmul_out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float, beta: float,
                     precision: str, source: str, strict: bool) -> None:
    _check_fake(a, b, out)


def _check_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> None:
    """The checks that need no data, at trace time (the rest run when the op runs)."""
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is None:
            continue
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must hold float32 data, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got {t.dim()}-D shape {tuple(t.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {a.shape[0]}x{a.shape[1]}, b is {b.shape[0]}x{b.shape[1]}")
    if out is not None and tuple(out.shape) != (a.shape[0], b.shape[1]):
        raise ValueError(f"out must have shape ({a.shape[0]}, {b.shape[1]}), got {tuple(out.shape)}")


def compiled_matmul(a: Any, b: Any, out: Any, alpha: Any, beta: Any, precision: Any, source: Any,
                    strict: bool) -> Any:
    if source is not None and not isinstance(source, str):
        raise TypeError("under torch.compile, source must be a string (database URL, API URL or pack path) or None")
    alpha, beta = check_scalar("alpha", alpha), check_scalar("beta", beta)
    check_precision(precision)
    if out is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs out= (C = alpha*A*B + beta*C reads C)")
        return torch.ops.gemmtune.matmul(a, b, alpha, beta, precision, source or "", bool(strict))
    torch.ops.gemmtune.matmul_out(a, b, out, alpha, beta, precision, source or "", bool(strict))
    return out
