"""Loading CUBINs and launching them through the CUDA driver API (cuda.bindings.driver)."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

from kernels.space import Config, Family, Launch, TensorMap

# Errors after which the context is unusable; the process must be replaced.
STICKY_ERRORS = {
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_ASSERT", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
}


class CudaError(RuntimeError):
    def __init__(self, what: str, code: Any):
        self.code_name = getattr(code, "name", str(code))
        super().__init__(f"{what}: {self.code_name}")

    @property
    def sticky(self) -> bool:
        return self.code_name in STICKY_ERRORS


def check(result: tuple, what: str):
    """Unpack a cuda.bindings result tuple, raising CudaError on failure."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(what, err)
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


_CONTEXTS: dict[int, Any] = {}


def use_device(device: int = 0):
    """Make the device's primary context current (created once per process); returns it."""
    from cuda.bindings import driver

    if device not in _CONTEXTS:
        check(driver.cuInit(0), "cuInit")
        dev = check(driver.cuDeviceGet(device), f"cuDeviceGet({device})")
        _CONTEXTS[device] = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(driver.cuCtxSetCurrent(_CONTEXTS[device]), "cuCtxSetCurrent")
    return _CONTEXTS[device]


_ARCHS: dict[int, str] = {}


def device_arch(device: int = 0) -> str:
    """The device's architecture ("sm_90"), read once per process: gemm() asks on every call."""
    from cuda.bindings import driver

    use_device(device)
    if device not in _ARCHS:
        attr = driver.CUdevice_attribute
        major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "attr")
        minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "attr")
        _ARCHS[device] = f"sm_{major}{minor}"
    return _ARCHS[device]


def tma_ready(address: int, row_elements: int) -> bool:
    """TMA reads FP32 rows only from 16-byte aligned addresses with 16-byte multiple strides."""
    return address % 16 == 0 and row_elements % 4 == 0


def encode_tensor_map(tm: TensorMap, operands: dict[str, tuple[int, int]], workspace: int) -> Any:
    """A CUtensorMap for one call: the view `tm` over the call's A or B (operands: name ->
    (address, leading dimension)) or its workspace (see TensorMap)."""
    from cuda.bindings import driver

    if tm.base in operands:
        address, ld = operands[tm.base]
        if not tma_ready(address, ld):
            if tm.fallback is None:
                raise ValueError(f"{tm.base.upper()} must be 16-byte aligned with a leading dimension "
                                 "that is a multiple of 4 for this kernel")
            return encode_tensor_map(tm.fallback, operands, workspace)
        strides = (4 * ld,)
    elif tm.base == "workspace":
        address, strides = workspace + tm.offset, tm.strides
    else:
        raise ValueError(f"unknown tensor map base {tm.base!r}; expected 'a', 'b' or 'workspace'")
    swizzle = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
               64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}[tm.swizzle]
    return check(driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, len(tm.dims), address,
        [driver.cuuint64_t(d) for d in tm.dims], [driver.cuuint64_t(s) for s in strides],
        [driver.cuuint32_t(x) for x in tm.box], [driver.cuuint32_t(1)] * len(tm.dims),
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, getattr(driver.CUtensorMapSwizzle, swizzle),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")


# Every family's kernel signature (kernels.space.KERNEL_SIGNATURE): m, n, k, alpha, A, lda, B, ldb,
# beta, C, ldc, workspace, then the launch's own splits and raster.
_PARAM_TYPES = (ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                ctypes.c_int, ctypes.c_int)


class LoadedKernel:
    """A family's CUBIN loaded into the current context, ready to run its launch sequence."""

    MAP_CACHE = 64  # encoded tensor maps kept per kernel (the tuner rotates up to 16 input sets)

    def __init__(self, cubin: bytes, launches: Sequence[Launch]):
        from cuda.bindings import driver

        self._maps: dict[tuple, Any] = {}
        self.launches = list(launches)
        self.module = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.functions = {}
        for launch in self.launches:
            if launch.kernel in self.functions:
                continue
            fn = check(driver.cuModuleGetFunction(self.module, launch.kernel.encode()),
                       f"cuModuleGetFunction({launch.kernel})")
            self.functions[launch.kernel] = fn
        for launch in self.launches:
            if launch.shared_bytes > 48 * 1024:  # past 48 KiB a kernel must opt in
                check(driver.cuFuncSetAttribute(
                    self.functions[launch.kernel],
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.shared_bytes), "cuFuncSetAttribute(max dynamic shared)")

    def launch(self, m: int, n: int, k: int, alpha: float, a: int, lda: int, b: int, ldb: int,
               beta: float, c: int, ldc: int, workspace: int = 0, stream: Any = 0,
               launches: Sequence[Launch] | None = None) -> None:
        """Run the launch sequence (``launches``: this shape's, else the one it was loaded with;
        passed in rather than stored, so threads running other shapes never see each other's)."""
        from cuda.bindings import driver

        args = (m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, workspace)
        types = _PARAM_TYPES
        for launch in self.launches if launches is None else launches:
            params = (args + (launch.splits, launch.raster), types)
            if launch.tensor_maps:
                operands = {"a": (a, lda), "b": (b, ldb)}
                maps = tuple(self._tensor_map(tm, operands, workspace) for tm in launch.tensor_maps)
                params = (params[0] + maps, types + (None,) * len(maps))  # None: passed by value via getPtr()
            check(driver.cuLaunchKernel(self.functions[launch.kernel], *launch.grid, *launch.block,
                                        launch.shared_bytes, stream, params, 0),
                  f"cuLaunchKernel({launch.kernel})")

    def _tensor_map(self, tm: TensorMap, operands: dict[str, tuple[int, int]], workspace: int) -> Any:
        key = (tm, operands.get(tm.base), workspace)
        found = self._maps.get(key)
        if found is None:
            if len(self._maps) >= self.MAP_CACHE:
                self._maps.clear()
            found = self._maps[key] = encode_tensor_map(tm, operands, workspace)
        return found

    def unload(self) -> None:
        from cuda.bindings import driver

        if self.module is not None:
            driver.cuModuleUnload(self.module)
            self.module = None


def device_pointer(x: Any, name: str) -> int:
    """A device address from a raw pointer or anything with __cuda_array_interface__."""
    if isinstance(x, int):
        return x
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{name} must be a device pointer (int) or have __cuda_array_interface__, got {type(x).__name__}")
    if cai.get("typestr") not in ("<f4", "=f4", "f4"):
        raise TypeError(f"{name} must hold float32 data, got typestr {cai.get('typestr')!r}")
    if cai.get("strides") not in (None,) and len(cai["shape"]) == 2 and cai["strides"][1] != 4:
        raise ValueError(f"{name} must be row-major (unit stride along columns)")
    return int(cai["data"][0])


def _leading_dim(x: Any, default: int) -> int:
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai and cai.get("strides") and len(cai["shape"]) == 2:
        return cai["strides"][0] // 4
    return default


def _stream_handle(stream: Any) -> int:
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream / cupy.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be an int handle or a CuPy/PyTorch stream, got {type(stream).__name__}")


_LOADED: dict[tuple, LoadedKernel] = {}
_WORKSPACE: dict[tuple[int, int], tuple[int, int]] = {}  # (device, stream) → (ptr, bytes)
# Per (device, family, config, shape): the loaded kernel, the launch sequence and the workspace
# bytes it needs. Working the geometry out is pure Python costing more than the launch itself
# (tens of µs for wgmma), so repeated calls of one shape take it from here.
_PLANS: dict[tuple, tuple[LoadedKernel, tuple[Launch, ...], int]] = {}
PLAN_CACHE = 4096  # entries before the plan cache starts over
_PLAN_LOCK = threading.Lock()


def _plan(fam: Family, config: Config, m: int, n: int, k: int, device: int, arch: str,
          key: tuple) -> tuple[LoadedKernel, tuple[Launch, ...], int]:
    from kernels.compiler import compile_config

    launches = tuple(fam.launches(config, m, n, k))
    need = fam.workspace_bytes(config, m, n, k)
    with _PLAN_LOCK:  # one compile and module load per config, however many threads ask
        loaded_key = (device, fam.name, tuple(sorted(config.items())), arch)
        kernel = _LOADED.get(loaded_key)
        if kernel is None:
            kernel = _LOADED[loaded_key] = LoadedKernel(compile_config(fam, config, arch).cubin, launches)
        if len(_PLANS) >= PLAN_CACHE:
            _PLANS.clear()
        plan = _PLANS[key] = (kernel, launches, need)
    return plan


def _workspace(device: int, stream: int, need: int) -> int:
    """The split-K/pack workspace of (device, stream), grown to ``need`` bytes. One per stream:
    calls on one stream run in order and can share it; calls on two streams may overlap."""
    from cuda.bindings import driver

    ptr, size = _WORKSPACE.get((device, stream), (0, 0))
    if size >= need:
        return ptr
    with _PLAN_LOCK:
        ptr, size = _WORKSPACE.get((device, stream), (0, 0))
        if size < need:
            if ptr:
                check(driver.cuCtxSynchronize(), "cuCtxSynchronize")  # no kernel is using it
                check(driver.cuMemFree(ptr), "cuMemFree")
            ptr = int(check(driver.cuMemAlloc(need), "cuMemAlloc(workspace)"))
            _WORKSPACE[(device, stream)] = (ptr, need)
    return ptr


def gemm(family: Family | str, config: Config, a: Any, b: Any, c: Any, m: int, n: int, k: int,
         alpha: float = 1.0, beta: float = 0.0, *, stream: Any = 0, device: int = 0) -> None:
    """C = alpha*A*B + beta*C on the GPU with one family and config (asynchronous on `stream`).

    a, b, c: row-major float32 device data (CuPy/PyTorch arrays, or raw pointers with
    lda=k, ldb=n, ldc=n). The CUBIN is compiled (or taken from the cache) on first use.
    """
    from kernels import get_family

    fam = get_family(family) if isinstance(family, str) else family
    pa, pb, pc = device_pointer(a, "a"), device_pointer(b, "b"), device_pointer(c, "c")
    arch = device_arch(device)  # also makes the device's context current
    # the config's items in the caller's order: cheaper than sorting, and an order seen twice
    # only costs a second entry
    key = (device, fam.name, tuple(config.items()), m, n, k)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(fam, config, m, n, k, device, arch, key)
    kernel, launches, need = plan
    handle = _stream_handle(stream)
    workspace = _workspace(device, handle, need) if need else 0
    kernel.launch(m, n, k, alpha, pa, _leading_dim(a, k), pb, _leading_dim(b, n), beta, pc,
                  _leading_dim(c, n), workspace, handle, launches)
