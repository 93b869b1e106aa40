"""Operand layouts: how A and B of C = op(A)·op(B) are stored.

A layout is two letters, A's then B's: ``n`` means the operand is stored as it is used, row-major
(A as M×K, B as K×N); ``t`` means it is stored transposed (A as K×M, B as N×K: a column-major
operand). ``nt`` is PyTorch's ``x @ W.T`` (``nn.Linear``), ``tn`` its weight gradient. C is
always row-major (M×N, leading dimension ldc). The kernels take the layout as the TA / TB macros
of their program (kernels/families/common.cuh).
"""
from __future__ import annotations

LAYOUTS: tuple[str, ...] = ("nn", "nt", "tn", "tt")
DEFAULT_LAYOUT = "nn"
MEANING = {"nn": "A·B", "nt": "A·Bᵀ", "tn": "Aᵀ·B", "tt": "Aᵀ·Bᵀ"}
MAX_BATCH_GRID = 65535  # a launch's gridDim.z: batch entries × split-K slices


def check_layout(layout: object) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (A's letter, then B's: 'n' stored as used, "
                         f"row-major; 't' stored transposed), got {layout!r}")
    return layout  # type: ignore[return-value]


def transposed(layout: str) -> tuple[bool, bool]:
    """(A stored transposed, B stored transposed)."""
    check_layout(layout)
    return layout[0] == "t", layout[1] == "t"


def stored_shapes(layout: str, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (rows, cols) of A and B as stored in memory for C (m×n) = op(A)·op(B) over k."""
    ta, tb = transposed(layout)
    return ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))


def check_batch(batch: object) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    return batch


def shape_text(m: int, n: int, k: int, batch: int = 1) -> str:
    """``MxNxK``, or ``BxMxNxK`` for a batch of B: the batch leads, as in a tensor's shape."""
    return f"{batch}x{m}x{n}x{k}" if batch > 1 else f"{m}x{n}x{k}"


def problem_label(m: int, n: int, k: int, layout: str = DEFAULT_LAYOUT, batch: int = 1) -> str:
    """How a problem is written on the command line and shown: ``shape_text``, then ``:layout``
    where it is not "nn" (e.g. ``4096x3072x1024:nt``, ``128x512x512x64:nt``)."""
    return shape_text(m, n, k, batch) + ("" if layout == DEFAULT_LAYOUT else f":{layout}")
