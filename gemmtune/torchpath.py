"""The lean PyTorch path shared by `gemmtune.matmul` on tensors and the switch (switch.py):
operands described from their sizes and strides, one cached choice and plan per problem, a
launch on the current stream. Anything it does not take returns None and goes the general way
(call.py, which words every error) or, in the switch, to torch's own kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels.runtime import plan as make_plan

from .arrays import Gemm, Operand, _layout_of, check_gemm
from .call import device_info
from .dispatch import DISPATCHER, Choice

MAX_DIM = 1 << 31  # int32 kernel arguments


class _Torch:
    """torch names the path needs, filled on first use (torch is imported only by callers that
    pass tensors)."""

    ready = False
    tensor: type = object
    f32: Any = None
    raw_stream: Any = None
    get_device: Any = None
    set_device: Any = None
    empty: Any = None
    uint8: Any = None


T = _Torch()


def init_torch() -> None:
    import torch

    T.tensor, T.f32, T.uint8, T.empty = torch.Tensor, torch.float32, torch.uint8, torch.empty
    T.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda d: torch.cuda.current_stream(d).cuda_stream)
    T.get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    T.set_device = torch.cuda.set_device
    T.ready = True


def describe(t: Any) -> Operand | None:
    """A float32 CUDA matrix (2-D) or batch of matrices (3-D) with a unit stride along its rows
    or columns, as an Operand; None for anything else."""
    if not isinstance(t, T.tensor) or t.dtype is not T.f32 or not t.is_cuda:
        return None
    shape, stride = t.shape, t.stride()
    dims = len(shape)
    if dims == 2:
        rows, cols = shape
        batch, bstride = 1, 0
    elif dims == 3:
        batch, rows, cols = shape
        bstride = stride[0] if batch > 1 else 0
        if bstride < 0:
            return None
    else:
        return None
    if max(rows, cols) >= MAX_DIM:
        return None
    found = _layout_of("", rows, cols, 4 * stride[-2], 4 * stride[-1])
    if found is None:
        return None
    return Operand(t.data_ptr(), rows, cols, found[1], found[0], batch, bstride)


def _choice(device: int, p: Gemm, precision: str, source: Any, exact_only: bool,
            bias: bool = False) -> tuple[Choice, Any]:
    """The choice for this problem, and its plan where it runs a kernel (cached with it)."""
    key = (device, p.m, p.n, p.k, p.layout, p.batch, precision, source, exact_only, bias)
    found = _PLANNED.get(key)
    if found is not None and found[0].expires is None:
        return found
    gpu, arch = device_info(device)
    choice = DISPATCHER.choose(device=device, gpu=gpu, arch=arch, m=p.m, n=p.n, k=p.k, precision=precision,
                               source=source, layout=p.layout, batch=p.batch, exact_only=exact_only)
    made = None
    if choice.kind == "kernel":
        made = make_plan(choice.kernel_family, choice.config, p.m, p.n, p.k, layout=p.layout, batch=p.batch,
                         bias=bias, device=device)
    found = _PLANNED[key] = (choice, made)
    return found


_PLANNED: dict[tuple, tuple[Choice, Any]] = {}


def forget() -> None:
    _PLANNED.clear()
    _READY.clear()


def _problem(a: Any, b: Any, out: Any, beta: float, bias: Any) -> tuple[Gemm, Operand, Operand, Operand | None,
                                                                      Operand | None] | None:
    """The problem and operands of a call this path takes, else None."""
    if not T.ready:
        init_torch()
    pa, pb = describe(a), describe(b)
    if pa is None or pb is None or a.device != b.device:
        return None
    po = pbias = None
    if out is not None:
        po = describe(out)
        if po is None or po.transposed or out.device != a.device:
            return None
    if bias is not None:
        if not isinstance(bias, T.tensor) or bias.dtype is not T.f32 or bias.dim() != 1 or bias.device != a.device \
                or bias.stride(0) != 1:
            return None
        pbias = Operand(bias.data_ptr(), 1, bias.shape[0], bias.shape[0])
    try:
        p = check_gemm(pa, pb, po, beta, pbias)
    except ValueError:
        return None
    if 0 in (p.m, p.n, p.k):
        return None
    return p, pa, pb, po, pbias


def result_shape(a: Any, b: Any) -> tuple[int, ...]:
    """The shape of a @ b for 2-D / 3-D tensors (a 2-D one broadcast over the other's batch)."""
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    return (a.shape[-2], b.shape[-1]) if max(a.dim(), b.dim()) == 2 else (batch, a.shape[-2], b.shape[-1])


def would_run(a: Any, b: Any, precision: str, source: Any, exact_only: bool = True) -> bool:
    """Whether `tuned` would run a tuned kernel for a @ b (a new, row-major output)."""
    found = _problem(a, b, None, 0.0, None)
    return found is not None and _choice(a.device.index, found[0], precision, source, exact_only)[1] is not None


@dataclass(frozen=True, slots=True)
class _Ready:
    """What a call with these operand geometries runs: everything but the addresses."""

    plan: Any
    out_shape: tuple[int, ...]
    lds: tuple[int, int, int]  # A, B, C
    strides: tuple[int, int, int]
    spans: tuple[int, int, int]  # bytes A, B and C touch from their first element
    device: int


_NOT_TAKEN = object()


def _span(op: Operand) -> int:
    lo, hi = op.span()
    return hi - lo


def _geometry_key(a: Any, b: Any, out: Any, bias: Any, beta: float, precision: str, source: Any,
                  exact_only: bool) -> tuple:
    return (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            beta == 0.0, precision, source, exact_only)


def _prepare(a: Any, b: Any, out: Any, beta: float, bias: Any, precision: str, source: Any,
             exact_only: bool) -> Any:
    """A _Ready for this call's geometry, or _NOT_TAKEN (both cached by the caller), or None
    (not to be cached: the source could not be read, and is asked again after a while)."""
    found = _problem(a, b, out, beta, bias)
    if found is None:
        return _NOT_TAKEN
    p, pa, pb, po, pbias = found
    device = a.device.index
    choice, made = _choice(device, p, precision, source, exact_only, pbias is not None)
    if made is None:
        return _NOT_TAKEN if choice.expires is None else None  # an unreachable source is asked again later
    if po is None:
        po = Operand(0, p.m, p.n, p.n, False, p.batch, p.m * p.n)
    strides = (pa.stride, pb.stride, po.stride) if p.batch > 1 else (0, 0, 0)
    return _Ready(made, (p.batch, p.m, p.n) if p.batch > 1 else (p.m, p.n), (pa.ld, pb.ld, po.ld), strides,
                  (_span(pa), _span(pb), _span(po)), device)


_READY: dict[tuple, Any] = {}
READY_MAX = 4096  # geometries remembered before the cache starts over


def tuned(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, precision: str, source: Any,
          exact_only: bool) -> Any:
    """out (or a new tensor) = alpha·a@b + beta·out (+ bias) with a tuned kernel; None where this
    path does not run it (not tensors it takes, no tuned kernel that beats the library's): the
    caller then does what it does otherwise. Tensors on one device; out, where given, row-major.

    What a call runs is worked out once per operand geometry (sizes, strides, dtypes, devices)
    and kept: a repeated call costs a dict lookup, the addresses, an output and a launch."""
    if not T.ready:
        init_torch()
    if not (isinstance(a, T.tensor) and isinstance(b, T.tensor)):
        return None
    try:
        key = _geometry_key(a, b, out, bias, beta, precision, source, exact_only)
    except AttributeError:  # out or bias not a tensor: the general path says what is wrong
        return None
    ready = _READY.get(key)
    if ready is None:
        before = T.get_device() if a.is_cuda else None  # making a plan makes its device current
        ready = _prepare(a, b, out, beta, bias, precision, source, exact_only)
        if before is not None and T.get_device() != before:
            T.set_device(before)
        if ready is None:
            return None
        if len(_READY) >= READY_MAX:
            _READY.clear()
        _READY[key] = ready
    if ready is _NOT_TAKEN:
        return None
    pa, pb = a.data_ptr(), b.data_ptr()
    if out is None:
        out = T.empty(ready.out_shape, dtype=T.f32, device=a.device)
        pc = out.data_ptr()
    else:
        pc = out.data_ptr()
        end = pc + ready.spans[2]
        if pc < pa + ready.spans[0] and pa < end or pc < pb + ready.spans[1] and pb < end:
            return None  # out overlaps an input: not ours to write
        if bias is not None and pc < bias.data_ptr() + 4 * bias.shape[0] and bias.data_ptr() < end:
            return None
    made = ready.plan
    keep = None
    workspace = 0
    if made.workspace_bytes:
        keep = T.empty(made.workspace_bytes, dtype=T.uint8, device=a.device)  # stream-ordered, graph-capturable
        workspace = keep.data_ptr()
    device = ready.device
    current = T.get_device()
    lda, ldb, ldc = ready.lds
    made.run(  # on the tensors' device: the plan makes its context current
        pa, lda, pb, ldb, pc, ldc, alpha, beta, bias=0 if bias is None else bias.data_ptr(),
        strides=ready.strides, workspace=workspace, stream=T.raw_stream(device))
    if current != device:  # give the caller their current device back
        T.set_device(current)
    del keep
    return out
