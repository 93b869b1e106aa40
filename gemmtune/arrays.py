"""Operands of `matmul` checked from their metadata alone (no GPU needed): dtype, rank, row-major
strides, shapes that fit, device memory. PyTorch tensors and CuPy arrays are read through their
own attributes (faster than building __cuda_array_interface__); anything else through
__cuda_array_interface__ (version 2 or 3)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

ITEMSIZE = 4  # float32
ALLOWED = ("a PyTorch tensor on a CUDA device, a CuPy array, or any object with __cuda_array_interface__; "
           "float32, 2-D, row-major (C order, or rows with a larger leading dimension)")


@dataclass(frozen=True, slots=True)
class Operand:
    """A row-major float32 matrix in device memory: rows x cols, leading dimension ld (elements)."""

    ptr: int
    rows: int
    cols: int
    ld: int
    readonly: bool = False

    @property
    def natural(self) -> bool:
        """Densely packed (ld == cols), so a raw pointer describes it."""
        return self.ld == self.cols or self.rows == 1

    def span(self) -> tuple[int, int]:
        """[first, last) byte addresses it touches."""
        if self.rows == 0 or self.cols == 0:
            return self.ptr, self.ptr
        return self.ptr, self.ptr + ((self.rows - 1) * self.ld + self.cols) * ITEMSIZE


def operand(name: str, *, dtype: str, float32: bool, shape: tuple[int, ...], strides: tuple[int, ...] | None,
            ptr: int, readonly: bool = False) -> Operand:
    """Check one matrix. strides in bytes (None: C-contiguous). dtype: how to name it in errors."""
    if not float32:
        raise TypeError(f"{name} must hold float32 data, got {dtype}; convert it first (e.g. .float() / .astype('float32'))")
    if len(shape) != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got {len(shape)}-D shape {tuple(shape)}")
    rows, cols = int(shape[0]), int(shape[1])
    if strides is None:
        return Operand(int(ptr), rows, cols, max(cols, 1), readonly)
    s_row, s_col = int(strides[0]), int(strides[1])
    col_ok = cols <= 1 or s_col == ITEMSIZE
    row_ok = rows <= 1 or (s_row % ITEMSIZE == 0 and s_row // ITEMSIZE >= cols)
    if not (col_ok and row_ok):
        raise ValueError(
            f"{name} must be row-major with unit stride along columns (C order, or a slice of rows of one); "
            f"got shape {(rows, cols)} with byte strides {(s_row, s_col)}. Transposed or strided views are not "
            f"supported: make a copy with .contiguous() (PyTorch) or cupy.ascontiguousarray")
    ld = s_row // ITEMSIZE if rows > 1 else max(cols, 1)
    return Operand(int(ptr), rows, cols, ld, readonly)


def host_or_foreign(name: str, x: Any) -> Exception:
    """The error for an object that is not a device array."""
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        where = "host memory"
        if type(x).__module__.startswith("torch"):
            where = f"host memory (device {getattr(x, 'device', 'cpu')})"
        return TypeError(f"{name} is a {type(x).__module__}.{type(x).__name__} in {where}; matmul needs {ALLOWED}. "
                         "Move it to the GPU first (tensor.cuda(), cupy.asarray(array))")
    return TypeError(f"{name} must be {ALLOWED}; got {type(x).__module__}.{type(x).__name__}")


def from_cai(name: str, x: Any) -> tuple[Operand, dict]:
    """An Operand from __cuda_array_interface__ (and the interface dict, for its stream)."""
    try:
        cai = x.__cuda_array_interface__
    except (AttributeError, RuntimeError):  # torch CPU tensors raise from the property
        raise host_or_foreign(name, x) from None
    if not isinstance(cai, dict) or "shape" not in cai or "typestr" not in cai or "data" not in cai:
        raise TypeError(f"{name}.__cuda_array_interface__ lacks shape/typestr/data; matmul needs {ALLOWED}")
    if cai.get("mask") is not None:
        raise ValueError(f"{name} is a masked array; matmul needs plain (unmasked) device memory")
    typestr = cai["typestr"]
    ptr, readonly = cai["data"]
    op = operand(name, dtype=f"typestr {typestr!r}", float32=typestr in ("<f4", "=f4", "|f4"),
                 shape=tuple(cai["shape"]), strides=None if cai.get("strides") is None else tuple(cai["strides"]),
                 ptr=int(ptr or 0), readonly=bool(readonly))
    return op, cai


def check_scalar(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (int or float), got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_gemm(a: Operand, b: Operand, out: Operand | None, beta: float) -> tuple[int, int, int]:
    """M, N, K of C = alpha*A*B + beta*C for these operands, or the error naming what does not fit."""
    m, k = a.rows, a.cols
    if b.rows != k:
        raise ValueError(f"inner dimensions differ: a is {a.rows}x{a.cols}, b is {b.rows}x{b.cols} "
                         f"(a's columns must equal b's rows)")
    n = b.cols
    if out is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs out= (C = alpha*A*B + beta*C reads C); pass out or use beta=0")
        return m, n, k
    if (out.rows, out.cols) != (m, n):
        raise ValueError(f"out must have shape ({m}, {n}) for a {a.rows}x{a.cols} times b {b.rows}x{b.cols}, "
                         f"got ({out.rows}, {out.cols})")
    if out.readonly:
        raise ValueError("out is read-only; matmul writes the result into it")
    lo, hi = out.span()
    for name, x in (("a", a), ("b", b)):
        xlo, xhi = x.span()
        if lo < xhi and xlo < hi:
            raise ValueError(f"out overlaps {name} in memory; the kernels read {name} while writing out, so pass a "
                             "separate output array")
    return m, n, k
