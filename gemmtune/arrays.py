"""Operands of `matmul` checked from their metadata alone (no GPU needed): dtype, rank, which of
their dimensions is contiguous (row-major, or column-major: a transposed view), leading
dimensions, batch strides, shapes that fit, device memory. PyTorch tensors and CuPy arrays are
read through their own attributes (faster than building __cuda_array_interface__); anything else
through __cuda_array_interface__ (version 2 or 3)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from kernels.layout import MAX_BATCH_GRID

ITEMSIZE = 4  # float32
ALLOWED = ("a PyTorch tensor on a CUDA device, a CuPy array, or any object with __cuda_array_interface__; "
           "float32, 2-D (a matrix) or 3-D (a batch of matrices), with unit stride along its rows or its columns "
           "(row-major, a transposed view, or slices of either)")


@dataclass(frozen=True, slots=True)
class Operand:
    """A float32 matrix (or a strided batch of them) in device memory, as used: rows x cols.

    Stored row-major with leading dimension ld, or, where ``transposed``, column-major (its
    transpose is row-major: element (r, c) at ptr + (c * ld + r) * 4). ``stride``: elements
    between batch entries (0: one matrix broadcast over the batch)."""

    ptr: int
    rows: int
    cols: int
    ld: int
    transposed: bool = False
    batch: int = 1
    stride: int = 0
    readonly: bool = False

    def span(self) -> tuple[int, int]:
        """[first, last) byte addresses it touches."""
        if self.rows == 0 or self.cols == 0 or self.batch == 0:
            return self.ptr, self.ptr
        inner, outer = (self.rows, self.cols) if self.transposed else (self.cols, self.rows)
        last = (outer - 1) * self.ld + inner - 1 + (self.batch - 1) * self.stride
        return self.ptr, self.ptr + (last + 1) * ITEMSIZE


def _layout_of(name: str, rows: int, cols: int, s_row: int, s_col: int) -> tuple[bool, int] | None:
    """(transposed, ld) for a matrix with these byte strides, or None when neither dimension is
    contiguous. The stride of a dimension of size 1 means nothing (PyTorch gives them odd ones);
    row-major wins where both would do (a single row or column)."""
    if cols <= 1 or s_col == ITEMSIZE:
        if rows <= 1:
            return False, max(cols, 1)
        if s_row % ITEMSIZE == 0 and s_row // ITEMSIZE >= max(cols, 1):
            return False, s_row // ITEMSIZE
    if rows <= 1 or s_row == ITEMSIZE:
        if cols <= 1:
            return True, max(rows, 1)
        if s_col % ITEMSIZE == 0 and s_col // ITEMSIZE >= max(rows, 1):
            return True, s_col // ITEMSIZE
    return None


def operand(name: str, *, dtype: str, float32: bool, shape: tuple[int, ...], strides: tuple[int, ...] | None,
            ptr: int, readonly: bool = False) -> Operand:
    """Check one operand. strides in bytes (None: C-contiguous). dtype: how to name it in errors."""
    if not float32:
        raise TypeError(f"{name} must hold float32 data, got {dtype}; convert it first (e.g. .float() / .astype('float32'))")
    if len(shape) not in (2, 3):
        raise ValueError(f"{name} must be a 2-D matrix or a 3-D batch of matrices, got {len(shape)}-D shape "
                         f"{tuple(shape)}; fold further batch dimensions into the first one first")
    if strides is None:
        strides = tuple(ITEMSIZE * math.prod(shape[i + 1:]) for i in range(len(shape)))
    batch, stride = (int(shape[0]), int(strides[0])) if len(shape) == 3 else (1, 0)
    rows, cols = int(shape[-2]), int(shape[-1])
    found = _layout_of(name, rows, cols, int(strides[-2]), int(strides[-1]))
    if found is None or stride % ITEMSIZE or stride < 0:
        raise ValueError(
            f"{name} must have unit stride along its rows or its columns (row-major, a transposed view, or slices of "
            f"either); got shape {tuple(shape)} with byte strides {tuple(strides)}. Make a copy with .contiguous() "
            f"(PyTorch) or cupy.ascontiguousarray")
    if batch > MAX_BATCH_GRID:
        raise ValueError(f"{name} has a batch of {batch}; at most {MAX_BATCH_GRID} matrices per call")
    transposed, ld = found
    return Operand(int(ptr), rows, cols, ld, transposed, batch, stride // ITEMSIZE if batch > 1 else 0, readonly)


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


@dataclass(frozen=True, slots=True)
class Gemm:
    """What a call computes: C (m×n, a batch of `batch`) = alpha·op(A)·op(B) + beta·C, A and B
    stored as `layout` says (kernels/layout.py)."""

    m: int
    n: int
    k: int
    layout: str
    batch: int


def check_gemm(a: Operand, b: Operand, out: Operand | None, beta: float, bias: Operand | None = None) -> Gemm:
    """The problem these operands pose, or the error naming what does not fit."""
    m, k = a.rows, a.cols
    if b.rows != k:
        raise ValueError(f"inner dimensions differ: a is {a.rows}x{a.cols}, b is {b.rows}x{b.cols} "
                         f"(a's columns must equal b's rows)")
    n = b.cols
    if 1 not in (a.batch, b.batch) and a.batch != b.batch:
        raise ValueError(f"batch sizes differ: a has {a.batch} matrices, b has {b.batch} (they must be equal, or "
                         "one operand a single matrix, broadcast over the other's batch)")
    batch = max(a.batch, b.batch)
    layout = ("t" if a.transposed else "n") + ("t" if b.transposed else "n")
    if bias is not None and (bias.rows, bias.cols) != (1, n):
        raise ValueError(f"bias must be a vector of n={n} floats (added to every row of the result), got "
                         f"{bias.rows}x{bias.cols}")
    if out is None:
        if beta != 0.0:
            raise ValueError(f"beta={beta} needs out= (C = alpha*A*B + beta*C reads C); pass out or use beta=0")
        return Gemm(m, n, k, layout, batch)
    want = (batch, m, n) if batch > 1 else (m, n)
    got = (out.batch, out.rows, out.cols) if out.batch > 1 else (out.rows, out.cols)
    if got != want:
        raise ValueError(f"out must have shape {want} for a {a.rows}x{a.cols} times b {b.rows}x{b.cols}"
                         f"{f' over a batch of {batch}' if batch > 1 else ''}, got {got}")
    if out.transposed and min(m, n) > 1:
        raise ValueError("out must be row-major (unit stride along its rows), not a transposed view; the kernels "
                         "write C by rows")
    if out.readonly:
        raise ValueError("out is read-only; matmul writes the result into it")
    if batch > 1 and out.stride < (m - 1) * out.ld + n:
        raise ValueError(f"out's batch entries overlap (batch stride {out.stride} elements for {m}x{n} matrices "
                         f"with leading dimension {out.ld}); pass a separate output per entry")
    lo, hi = out.span()
    for name, x in (("a", a), ("b", b), ("bias", bias)):
        if x is None:
            continue
        xlo, xhi = x.span()
        if lo < xhi and xlo < hi:
            raise ValueError(f"out overlaps {name} in memory; the kernels read {name} while writing out, so pass a "
                             "separate output array")
    return Gemm(m, n, k, layout, batch)
