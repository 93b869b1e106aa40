"""Running a chosen kernel on described operands: the one launch path of `matmul` and of the
PyTorch switch (switch.py)."""

from __future__ import annotations

from typing import Any, Callable

from kernels.runtime import plan, workspace

from .arrays import Gemm, Operand
from .dispatch import Choice


def run_kernel(choice: Choice, problem: Gemm, device: int, a: Operand, b: Operand, c: Operand, alpha: float,
               beta: float, *, bias: int = 0, stream: int = 0,
               scratch: Callable[[int], tuple[int, Any]] | None = None) -> None:
    """C = alpha·op(A)·op(B) + beta·C (+ bias) with the choice's kernel, asynchronously on
    `stream`. Makes the device's context current (the caller restores its own).

    scratch(nbytes) → (address, owner): device memory for the kernel's workspace (split-K
    partials, wgmma's packed operands), e.g. from the array library's allocator, which is what
    CUDA graph capture needs; without it, one workspace per (device, stream) is kept
    (kernels.runtime.workspace). The owner is held until the launch is queued."""
    made = plan(choice.kernel_family, choice.config, problem.m, problem.n, problem.k, layout=problem.layout,
                batch=problem.batch, bias=bool(bias), device=device)
    need = made.workspace_bytes
    owner = None
    if not need:
        ws = 0
    elif scratch is not None:
        ws, owner = scratch(need)
    else:
        ws = workspace(device, stream, need)
    strides = (a.stride, b.stride, c.stride) if problem.batch > 1 else (0, 0, 0)
    made.run(a.ptr, a.ld, b.ptr, b.ld, c.ptr, c.ld, alpha, beta, bias=bias, strides=strides, workspace=ws,
             stream=stream)
    del owner
