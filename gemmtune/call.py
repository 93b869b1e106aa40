"""`matmul` and `explain` on arrays, eagerly: validate, choose (dispatch.py), then run the tuned
kernel (launch.py) on the array's device and its library's current stream, or the library's
GEMM. (Under torch.compile, gemmtune.matmul goes through the custom op of torch_op.py instead.)"""

from __future__ import annotations

import threading
from typing import Any

from . import arrays
from .arrays import Gemm, Operand
from .dispatch import DISPATCHER, Choice
from .launch import run_kernel
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


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


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
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        import torch

        return torch.empty(shape, dtype=torch.float32, device=like.device)

    @staticmethod
    def scratch(like: Any):
        import torch

        def allocate(nbytes: int) -> tuple[int, Any]:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
            return buffer.data_ptr(), buffer
        return allocate

    @staticmethod
    def current() -> Any:
        import torch

        return torch.cuda.current_device()

    @staticmethod
    def restore(token: Any) -> None:
        import torch

        torch.cuda.set_device(token)

    @staticmethod
    def library_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any = None) -> Any:
        """torch.matmul with TF32 off (strict FP32, as the kernels), restored afterwards; then
        alpha, beta and the bias as the kernels apply them (beta = 0 never reads out)."""
        import torch

        flags = torch.backends.cuda.matmul
        with _TF32_LOCK if flags.allow_tf32 else _NULL:
            old = flags.allow_tf32
            flags.allow_tf32 = False
            try:
                r = torch.matmul(a, b)
            finally:
                flags.allow_tf32 = old
        if alpha != 1.0:
            r.mul_(alpha)
        if bias is not None:
            r.add_(bias)
        if out is None:
            return r
        if beta == 0.0:
            return out.copy_(r)
        return out.mul_(beta).add_(r)


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
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        import cupy

        with like.device:
            return cupy.empty(shape, dtype=cupy.float32)

    @staticmethod
    def scratch(like: Any):
        import cupy

        def allocate(nbytes: int) -> tuple[int, Any]:
            with like.device:
                buffer = cupy.empty(nbytes, dtype=cupy.uint8)
            return buffer.data.ptr, buffer
        return allocate

    @staticmethod
    def current() -> Any:
        import cupy

        return cupy.cuda.runtime.getDevice()

    @staticmethod
    def restore(token: Any) -> None:
        import cupy

        cupy.cuda.runtime.setDevice(token)

    @staticmethod
    def library_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any = None) -> Any:
        import cupy

        with a.device:
            r = cupy.matmul(a, b)
            if alpha != 1.0:
                r *= alpha
            if bias is not None:
                r += bias
            if out is None:
                return r
            if beta == 0.0:
                out[...] = r  # never reads out
            else:
                out *= beta
                out += r
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
    def scratch(like: Any):
        return None  # kernels.runtime keeps a workspace per (device, stream)

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
    def empty(shape: tuple[int, ...], like: Any) -> Any:
        raise TypeError(f"a is a {type(like).__module__}.{type(like).__name__}: without out=, matmul returns a new "
                        "array only for PyTorch tensors and CuPy arrays; pass out=")

    @staticmethod
    def library_gemm(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any = None) -> Any:
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
        lib.library_gemm(wrap(a), wrap(b), wrap(out), alpha, beta, None if bias is None else wrap(bias))
        return out


def library_of(x: Any) -> type:
    module = type(x).__module__
    if module.startswith("torch"):
        return TorchLib
    if module.startswith("cupy"):
        return CupyLib
    return CaiLib


# --- the calls --------------------------------------------------------------------------------------


def _bias_operand(lib: type, bias: Any, n: int) -> Operand:
    op = lib.operand("bias", bias.reshape(1, -1) if hasattr(bias, "reshape") else bias)
    if op.batch != 1 or op.rows != 1 or op.transposed or (op.cols > 1 and op.ld < op.cols):
        raise ValueError(f"bias must be a contiguous vector of n={n} floats, got shape {getattr(bias, 'shape', '?')}")
    return op


def _prepare(a: Any, b: Any, out: Any, alpha: Any, beta: Any, precision: Any, bias: Any = None):
    lib = library_of(a)
    if any(library_of(x) is not lib for x in (b, out, bias) if x is not None):
        names = ", ".join(f"{n}: {type(x).__module__}.{type(x).__name__}"
                          for n, x in (("a", a), ("b", b), ("out", out), ("bias", bias)) if x is not None)
        raise TypeError(f"a, b, out and bias must come from the same array library; got {names}")
    alpha = arrays.check_scalar("alpha", alpha)
    beta = arrays.check_scalar("beta", beta)
    check_precision(precision)
    pa, pb = lib.operand("a", a), lib.operand("b", b)
    po = lib.operand("out", out) if out is not None else None
    pbias = _bias_operand(lib, bias, pb.cols) if bias is not None else None
    problem = arrays.check_gemm(pa, pb, po, beta, pbias)
    device = lib.device(a)
    for name, x in (("b", b), ("out", out), ("bias", bias)):
        if x is not None and lib.device(x) != device:
            raise ValueError(f"{name} is on device {lib.device(x)} but a is on device {device}; "
                             "all operands must be on one GPU")
    return lib, pa, pb, po, pbias, problem, alpha, beta, device


def explain(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
            precision: str = "fp32", source: str | Source | None = None, strict: bool = False) -> Choice:
    """What matmul(a, b, …) with these arguments runs, and why; computes nothing. `str(choice)`
    is one readable line (family, config, match kind, source, trial id)."""
    lib, pa, pb, po, pbias, p, alpha, beta, device = _prepare(a, b, out, alpha, beta, precision, bias)
    gpu, arch = device_info(device)
    if 0 in (p.m, p.n, p.k):
        return Choice("library", "an empty dimension (nothing to tune)", source="-", gpu=gpu,
                      requested=(p.m, p.n, p.k), precision=precision, layout=p.layout, batch=p.batch)
    return DISPATCHER.choose(device=device, gpu=gpu, arch=arch, m=p.m, n=p.n, k=p.k, precision=precision,
                             source=source, strict=strict, layout=p.layout, batch=p.batch)


def matmul(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
           precision: str = "fp32", source: str | Source | None = None, strict: bool = False) -> Any:
    """out = alpha * a @ b + beta * out (+ bias on every row) with the best tuned kernel known
    for this GPU and problem (see gemmtune.matmul)."""
    lib, pa, pb, po, pbias, p, alpha, beta, device = _prepare(a, b, out, alpha, beta, precision, bias)
    if 0 in (p.m, p.n, p.k):
        return lib.library_gemm(a, b, out, alpha, beta, bias)
    # the device's first look-up and the kernels make its context current; the caller's current
    # device stays as it was
    token = lib.current()
    try:
        gpu, arch = device_info(device)
        choice = DISPATCHER.choose(device=device, gpu=gpu, arch=arch, m=p.m, n=p.n, k=p.k,
                                   precision=precision, source=source, strict=strict,
                                   layout=p.layout, batch=p.batch)
        if choice.kind == "library":
            return lib.library_gemm(a, b, out, alpha, beta, bias)
        if out is None:
            out = lib.empty((p.batch, p.m, p.n) if p.batch > 1 else (p.m, p.n), a)
            po = lib.operand("out", out)
        run_kernel(choice, p, device, pa, pb, po, alpha, beta, bias=0 if pbias is None else pbias.ptr,
                   stream=lib.stream(device, a), scratch=lib.scratch(a))
    finally:
        if token != device or lib is CaiLib:
            lib.restore(token)
    return out


__all__ = ["Gemm", "explain", "matmul"]
