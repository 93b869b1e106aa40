"""`matmul` and `explain`: validate, choose (dispatch.py), then run the tuned kernel through
`kernels.gemm` on the array's device and its library's current stream, or the library's GEMM."""

from __future__ import annotations

import sys
import threading
from typing import Any

import kernels

from . import arrays
from .arrays import Operand
from .dispatch import DISPATCHER, Choice
from .precision import check_precision
from .sources import Source

_DEVICE_INFO: dict[int, tuple[str, str]] = {}
_TF32_LOCK = threading.Lock()


def device_info(device: int) -> tuple[str, str]:
    """(GPU model name as the tuner records it, architecture such as "sm_90"), once per device."""
    info = _DEVICE_INFO.get(device)
    if info is None:
        from cuda.bindings import driver

        from kernels.runtime import check, device_arch

        arch = device_arch(device)  # also initialises the driver and the device's primary context
        dev = check(driver.cuDeviceGet(device), f"cuDeviceGet({device})")
        name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
        info = _DEVICE_INFO[device] = (name, arch)
    return info


class _View:
    """A row-major matrix with a leading dimension, handed to kernels.gemm (which reads lda from it)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, op: Operand) -> None:
        self.__cuda_array_interface__ = {"version": 3, "shape": (op.rows, op.cols), "typestr": "<f4",
                                         "data": (op.ptr, False), "strides": (op.ld * 4, 4), "stream": None}


def _arg(op: Operand) -> Any:
    return op.ptr if op.natural else _View(op)


# --- array libraries --------------------------------------------------------------------------------


class TorchLib:
    name = "torch"

    @staticmethod
    def operand(name: str, t: Any) -> Operand:
        import torch

        if not t.is_cuda:
            raise arrays.host_or_foreign(name, t)
        f32 = t.dtype == torch.float32
        strides = tuple(s * 4 for s in t.stride()) if f32 else None
        return arrays.operand(name, dtype=str(t.dtype), float32=f32, shape=tuple(t.shape), strides=strides,
                              ptr=t.data_ptr())

    @staticmethod
    def device(t: Any) -> int:
        return t.device.index

    @staticmethod
    def stream(device: int, x: Any) -> int:
        import torch

        get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: ~0.2 µs
        return get_raw(device) if get_raw is not None else torch.cuda.current_stream(device).cuda_stream

    @staticmethod
    def empty(m: int, n: int, like: Any) -> Any:
        import torch

        return torch.empty((m, n), dtype=torch.float32, device=like.device)

    @staticmethod
    def current() -> Any:
        import torch

        return torch.cuda.current_device()

    @staticmethod
    def restore(token: Any) -> None:
        import torch

        torch.cuda.set_device(token)

    @staticmethod
    def library_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float) -> Any:
        """torch.mm / addmm_ with TF32 off (strict FP32, as the kernels), restored afterwards."""
        import torch

        flags = torch.backends.cuda.matmul
        with _TF32_LOCK if flags.allow_tf32 else _NULL:
            old = flags.allow_tf32
            flags.allow_tf32 = False
            try:
                if out is None:
                    r = torch.mm(a, b)
                    return r.mul_(alpha) if alpha != 1.0 else r
                return out.addmm_(a, b, beta=beta, alpha=alpha)  # beta=0 never reads out
            finally:
                flags.allow_tf32 = old


class CupyLib:
    name = "cupy"

    @staticmethod
    def operand(name: str, x: Any) -> Operand:
        import numpy

        f32 = x.dtype == numpy.float32
        return arrays.operand(name, dtype=str(x.dtype), float32=f32, shape=tuple(x.shape),
                              strides=tuple(x.strides), ptr=x.data.ptr)

    @staticmethod
    def device(x: Any) -> int:
        return x.device.id

    @staticmethod
    def stream(device: int, x: Any) -> int:
        import cupy

        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream().ptr

    @staticmethod
    def empty(m: int, n: int, like: Any) -> Any:
        import cupy

        with like.device:
            return cupy.empty((m, n), dtype=cupy.float32)

    @staticmethod
    def current() -> Any:
        import cupy

        return cupy.cuda.runtime.getDevice()

    @staticmethod
    def restore(token: Any) -> None:
        import cupy

        cupy.cuda.runtime.setDevice(token)

    @staticmethod
    def library_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float) -> Any:
        import cupy

        with a.device:
            r = cupy.matmul(a, b)
            if out is None:
                return r * alpha if alpha != 1.0 else r
            if beta == 0.0:
                cupy.multiply(r, alpha, out=out)  # never reads out
            else:
                out *= beta
                out += r * alpha if alpha != 1.0 else r
            return out


class CaiLib:
    """Anything else with __cuda_array_interface__: the kernel path needs no library; the library
    GEMM goes through CuPy (zero-copy views), else PyTorch."""

    name = "cuda-array-interface"

    @staticmethod
    def operand(name: str, x: Any) -> Operand:
        return arrays.from_cai(name, x)[0]

    @staticmethod
    def device(x: Any) -> int:
        from cuda.bindings import driver

        from kernels.runtime import check

        ptr = x.__cuda_array_interface__["data"][0]
        attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(check(driver.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute(device ordinal)"))

    @staticmethod
    def stream(device: int, x: Any) -> int:
        s = x.__cuda_array_interface__.get("stream")  # v3: the producer's stream (1: legacy, 2: per-thread)
        return int(s) if s else 0

    @staticmethod
    def current() -> Any:
        from cuda.bindings import driver

        from kernels.runtime import check

        return check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")

    @staticmethod
    def restore(token: Any) -> None:
        from cuda.bindings import driver

        from kernels.runtime import check

        check(driver.cuCtxSetCurrent(token), "cuCtxSetCurrent")

    @staticmethod
    def empty(m: int, n: int, like: Any) -> Any:
        raise TypeError(f"a is a {type(like).__module__}.{type(like).__name__}: without out=, matmul returns a new "
                        "array only for PyTorch tensors and CuPy arrays; pass out=")

    @staticmethod
    def library_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float) -> Any:
        try:
            import cupy

            wrap = cupy.asarray
        except ImportError:
            try:
                import torch
            except ImportError:
                raise RuntimeError("the library GEMM for plain __cuda_array_interface__ objects needs CuPy or "
                                   "PyTorch; neither is installed") from None
            wrap = lambda x: torch.as_tensor(x, device="cuda")  # noqa: E731
        lib = CupyLib if wrap.__module__.startswith("cupy") else TorchLib
        lib.library_gemm(wrap(a), wrap(b), wrap(out), alpha, beta)
        return out


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def library_of(x: Any) -> type:
    module = type(x).__module__
    if module.startswith("torch"):
        return TorchLib
    if module.startswith("cupy"):
        return CupyLib
    return CaiLib


# --- the calls --------------------------------------------------------------------------------------


def _prepare(a: Any, b: Any, out: Any, alpha: Any, beta: Any, precision: Any):
    lib = library_of(a)
    if library_of(b) is not lib or (out is not None and library_of(out) is not lib):
        names = ", ".join(f"{n}: {type(x).__module__}.{type(x).__name__}" for n, x in (("a", a), ("b", b), ("out", out))
                          if x is not None)
        raise TypeError(f"a, b and out must come from the same array library; got {names}")
    alpha = arrays.check_scalar("alpha", alpha)
    beta = arrays.check_scalar("beta", beta)
    check_precision(precision)
    pa, pb = lib.operand("a", a), lib.operand("b", b)
    po = lib.operand("out", out) if out is not None else None
    m, n, k = arrays.check_gemm(pa, pb, po, beta)
    device = lib.device(a)
    for name, x in (("b", b), ("out", out)):
        if x is not None and lib.device(x) != device:
            raise ValueError(f"{name} is on device {lib.device(x)} but a is on device {device}; "
                             "all operands must be on one GPU")
    return lib, pa, pb, po, m, n, k, alpha, beta, device


def explain(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, precision: str = "fp32",
            source: str | Source | None = None, strict: bool = False) -> Choice:
    """What matmul(a, b, …) with these arguments runs, and why; computes nothing. `str(choice)`
    is one readable line (family, config, match kind, source, trial id)."""
    lib, pa, pb, po, m, n, k, alpha, beta, device = _prepare(a, b, out, alpha, beta, precision)
    gpu, arch = device_info(device)
    if 0 in (m, n, k):
        return Choice("library", "an empty dimension (nothing to tune)", source="-", gpu=gpu,
                      requested=(m, n, k), precision=precision)
    return DISPATCHER.choose(device=device, gpu=gpu, arch=arch, m=m, n=n, k=k, precision=precision, source=source,
                             strict=strict)


def matmul(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, precision: str = "fp32",
           source: str | Source | None = None, strict: bool = False) -> Any:
    """out = alpha * a @ b + beta * out with the best tuned kernel known for this GPU and shape.

    a (M×K), b (K×N), out (M×N): float32, 2-D, row-major, on one CUDA device; PyTorch tensors,
    CuPy arrays or anything with __cuda_array_interface__ (then out= is required). Returns out,
    or a new array of a's library when out is None (like torch.matmul / cupy.matmul).
    precision: "fp32" (FFMA kernels or FP32-accurate tensor-core emulation) or "ffma" (FFMA only).
    source: a results database URL, the API's http(s):// base URL or a .json pack; default
    $GEMMTUNE_SOURCE, then the tuner's database. When the source has nothing for this GPU (or
    only results of other family versions), or cuBLAS was measured faster, the library's own
    GEMM runs (PyTorch with TF32 off, or CuPy). An unreachable source warns once and falls back;
    strict=True raises gemmtune.SourceUnavailable instead. See explain() for the choice.
    """
    if _compiling(a):
        from .torch_op import compiled_matmul

        return compiled_matmul(a, b, out, alpha, beta, precision, source, strict)
    if type(a) is _TORCH.tensor:
        done = _torch_fast(a, b, out, alpha, beta, precision, source, strict)
        if done is not _SLOW:
            return done
    lib, pa, pb, po, m, n, k, alpha, beta, device = _prepare(a, b, out, alpha, beta, precision)
    if 0 in (m, n, k):
        return lib.library_gemm(a, b, out, alpha, beta)
    gpu, arch = device_info(device)
    choice = DISPATCHER.choose(device=device, gpu=gpu, arch=arch, m=m, n=n, k=k, precision=precision,
                               source=source, strict=strict)
    if choice.kind == "library":
        return lib.library_gemm(a, b, out, alpha, beta)
    if out is None:
        out = lib.empty(m, n, a)
        c_arg: Any = lib.operand("out", out).ptr  # dense: the raw pointer says it all
    else:
        c_arg = _arg(po)
    # kernels.gemm makes the device's context current; the caller's current device stays as it was.
    token = lib.current()
    try:
        kernels.gemm(choice.kernel_family, choice.config, _arg(pa), _arg(pb), c_arg, m, n, k, alpha, beta,
                     stream=lib.stream(device, a), device=device)
    finally:
        if token != device or lib is CaiLib:
            lib.restore(token)
    return out


class _TorchRefs:
    """torch names the fast path needs, filled on the first call with a torch tensor."""

    tensor: type | None = None
    f32: Any = None
    raw_stream: Any = None
    get_device: Any = None
    set_device: Any = None


_TORCH = _TorchRefs()
_SLOW = object()


def _torch_refs() -> None:
    import torch

    _TORCH.f32 = torch.float32
    _TORCH.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda d: torch.cuda.current_stream(d).cuda_stream)
    _TORCH.get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    _TORCH.set_device = torch.cuda.set_device
    _TORCH.tensor = torch.Tensor


def _torch_fast(a: Any, b: Any, out: Any, alpha: Any, beta: Any, precision: Any, source: Any, strict: bool) -> Any:
    """The common case on PyTorch with few attribute reads and no intermediate objects: dense
    float32 CUDA matrices on one device, float alpha/beta, a cached choice. Anything else returns
    _SLOW and goes the general way (which also words every error)."""
    f32 = _TORCH.f32
    if (type(b) is not type(a) or type(alpha) is not float or type(beta) is not float or a.dtype is not f32
            or b.dtype is not f32 or a.dim() != 2 or b.dim() != 2 or not a.is_cuda or not a.is_contiguous()
            or not b.is_contiguous() or type(precision) is not str or not (source is None or type(source) is str)):
        return _SLOW
    m, k = a.shape
    k2, n = b.shape
    device = a.get_device()
    if k != k2 or not (m and n and k) or b.get_device() != device:
        return _SLOW
    pa, pb = a.data_ptr(), b.data_ptr()
    if out is None:
        if beta != 0.0:
            return _SLOW
    else:
        if (type(out) is not type(a) or out.dtype is not f32 or out.shape != (m, n) or not out.is_contiguous()
                or out.get_device() != device):
            return _SLOW
        po = out.data_ptr()
        end = po + 4 * m * n
        if po < pa + 4 * m * k and pa < end or po < pb + 4 * k * n and pb < end:
            return _SLOW  # overlapping: the general path says so
    choice = DISPATCHER.cached((device, m, n, k, precision, source))
    if choice is None or (strict and choice.unavailable):
        gpu, arch = device_info(device)
        choice = DISPATCHER.choose(device=device, gpu=gpu, arch=arch, m=m, n=n, k=k, precision=precision,
                                   source=source, strict=strict)
    if choice.kind != "kernel":
        return TorchLib.library_gemm(a, b, out, alpha, beta)
    if out is None:
        out = a.new_empty((m, n))
    current = _TORCH.get_device()
    kernels.gemm(choice.kernel_family, choice.config, pa, pb, out.data_ptr(), m, n, k, alpha, beta,
                 stream=_TORCH.raw_stream(device), device=device)
    if current != device:  # kernels.gemm made the tensor's device current: give the caller theirs back
        _TORCH.set_device(current)
    return out


def _compiling(a: Any) -> bool:
    """True while torch.compile traces a call (then the custom op stands in for the whole call).
    Also fills the fast path's torch names the first time a torch tensor comes by."""
    torch = sys.modules.get("torch")
    if torch is None or not type(a).__module__.startswith("torch"):
        return False
    if _TORCH.tensor is None and not torch.compiler.is_compiling():
        _torch_refs()
    return torch.compiler.is_compiling()
