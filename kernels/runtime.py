"""Loading CUBINs and launching them through the CUDA driver API (cuda.bindings.driver)."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

from kernels.layout import check_batch, stored_shapes
from kernels.space import Config, Family, Launch, TensorMap, arch_of, div_up

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
        _ARCHS[device] = arch_of(f"{major}.{minor}")
    return _ARCHS[device]


def tma_ready(address: int, row_elements: int, batch_stride: int = 0, batch: int = 1) -> bool:
    """TMA reads FP32 rows only from 16-byte aligned addresses with 16-byte multiple strides (a
    batch stride of 0, a broadcast operand, it cannot express). The kernels' own tma_ready
    (wgmma.cu) applies the same rule."""
    return (address % 16 == 0 and row_elements % 4 == 0
            and (batch == 1 or (batch_stride != 0 and batch_stride % 4 == 0)))


# An operand as the launcher passes it: (address, leading dimension, batch stride) in elements.
Operand = tuple[int, int, int]


def operand_views(launches: Sequence[Launch]) -> tuple[tuple[str, int], ...]:
    """(operand, batch) of every tensor map in the sequence that views A or B in place."""
    return tuple(sorted({(tm.base, tm.dims[-1]) for launch in launches for tm in launch.tensor_maps
                         if tm.base in ("a", "b")}))


def skippable_views(launches: Sequence[Launch]) -> tuple[tuple[str, int], ...] | None:
    """``operand_views`` of a sequence with a launch ``only_for_fallbacks``, else None (nothing
    to check per call): worked out once per sequence, not per call."""
    return operand_views(launches) if any(launch.only_for_fallbacks for launch in launches) else None


def maps_read_in_place(views: Sequence[tuple[str, int]], operands: dict[str, Operand]) -> bool:
    """Whether every view of ``operand_views`` reads its operand in place for this call (none
    falls back to a pre-pass's copy): a launch ``only_for_fallbacks`` is then not needed."""
    return all(tma_ready(operands[name][0], operands[name][1], operands[name][2], batch) for name, batch in views)


def encode_tensor_map(tm: TensorMap, operands: dict[str, Operand], workspace: int) -> Any:
    """A CUtensorMap for one call: the view `tm` over the call's A or B as stored (operands: name
    -> (address, leading dimension, batch stride)) or its workspace (see TensorMap)."""
    from cuda.bindings import driver

    if tm.base in operands:
        address, ld, batch_stride = operands[tm.base]
        batch = tm.dims[-1]
        if not tma_ready(address, ld, batch_stride, batch):
            if tm.fallback is None:
                raise ValueError(f"{tm.base.upper()} must be 16-byte aligned with a leading dimension and batch "
                                 "stride that are multiples of 4 for this kernel")
            return encode_tensor_map(tm.fallback, operands, workspace)
        if batch == 1:  # any 16-byte multiple will do: the coordinate is always 0
            batch_stride = div_up(ld * tm.dims[1], 4) * 4
        strides = (4 * ld, 4 * batch_stride)
    elif tm.base == "workspace":
        address, strides = workspace + tm.offset, tm.strides
    else:
        raise ValueError(f"unknown tensor map base {tm.base!r}; expected 'a', 'b' or 'workspace'")
    swizzle = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
               64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}[tm.swizzle]
    data_type = {"f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"}[tm.element]
    return check(driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, data_type), len(tm.dims), address,
        [driver.cuuint64_t(d) for d in tm.dims], [driver.cuuint64_t(s) for s in strides],
        [driver.cuuint32_t(x) for x in tm.box], [driver.cuuint32_t(1)] * len(tm.dims),
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, getattr(driver.CUtensorMapSwizzle, swizzle),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")


# Every family's kernel signature (kernels.space.KERNEL_SIGNATURE): m, n, k, alpha, A, lda, B, ldb,
# beta, C, ldc, workspace, bias, the batch strides of A, B and C, then the launch's own splits and
# raster.
_PARAM_TYPES = (ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_int)


def _driver_config(launch: Launch, stream: Any) -> Any:
    """cuLaunchKernelEx's configuration of one launch (cuda.bindings' types)."""
    from cuda.bindings import driver

    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = launch.grid
    config.blockDimX, config.blockDimY, config.blockDimZ = launch.block
    config.sharedMemBytes = launch.shared_bytes
    config.hStream = stream if isinstance(stream, driver.CUstream) else driver.CUstream(int(stream))
    if launch.follows:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attribute]
        config.numAttrs = 1
    return config


class LoadedKernel:
    """A family's CUBIN loaded into the current context, ready to run its launch sequence."""

    MAP_CACHE = 64  # encoded tensor maps kept per kernel (the tuner rotates up to 16 input sets)

    def __init__(self, cubin: bytes, launches: Sequence[Launch]):
        from cuda.bindings import driver

        self._maps: dict[tuple, Any] = {}
        # cuLaunchKernelEx's configurations per (launch, stream): built once, as building one
        # costs more host time than the launch (the tuner queues timed launches back to back)
        # (keyed by identity, checked: hashing a Launch and its tensor maps costs microseconds too)
        self._configs: dict[tuple[int, int], tuple[Launch, Any]] = {}
        self.launches = list(launches)
        self._views = skippable_views(self.launches)
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
               launches: Sequence[Launch] | None = None, bias: int = 0,
               strides: tuple[int, int, int] = (0, 0, 0)) -> None:
        """Run the launch sequence (``launches``: this shape's, else the one it was loaded with;
        passed in rather than stored, so threads running other shapes never see each other's).
        a, b, c, bias: device addresses (bias 0: none); strides: batch strides of A, B, C in
        elements (the batch count is in the launches' grids)."""
        from cuda.bindings import driver

        args = (m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, workspace, bias, *strides)
        types = _PARAM_TYPES
        if launches is None:
            sequence, views = self.launches, self._views
        else:
            sequence, views = launches, skippable_views(launches)
        operands = {"a": (a, lda, strides[0]), "b": (b, ldb, strides[1])}
        in_place = views is not None and maps_read_in_place(views, operands)
        for launch in sequence:
            if launch.only_for_fallbacks and in_place:
                continue
            params = (args + (launch.splits, launch.raster), types)
            if launch.tensor_maps:
                maps = tuple(self._tensor_map(tm, operands, workspace) for tm in launch.tensor_maps)
                params = (params[0] + maps, types + (None,) * len(maps))  # None: passed by value via getPtr()
            key = (id(launch), int(stream))
            found = self._configs.get(key)
            if found is None or found[0] is not launch:
                if len(self._configs) >= self.MAP_CACHE:
                    self._configs.clear()
                found = self._configs[key] = (launch, _driver_config(launch, stream))
            config = found[1]
            check(driver.cuLaunchKernelEx(config, self.functions[launch.kernel], params, 0),
                  f"cuLaunchKernelEx({launch.kernel})")

    def name_of(self, handle: int) -> str:
        return next((name for name, fn in self.functions.items() if int(fn) == handle), "?")

    def _tensor_map(self, tm: TensorMap, operands: dict[str, Operand], workspace: int) -> Any:
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
    """A device address from a raw pointer or float32 data with __cuda_array_interface__."""
    if isinstance(x, int):
        return x
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{name} must be a device pointer (int) or have __cuda_array_interface__, got {type(x).__name__}")
    if cai.get("typestr") not in ("<f4", "=f4", "f4"):
        raise TypeError(f"{name} must hold float32 data, got typestr {cai.get('typestr')!r}")
    return int(cai["data"][0])


def _geometry(x: Any, name: str, rows: int, cols: int) -> tuple[int, int, int]:
    """(address, leading dimension, batch stride) of a float32 matrix or batch of matrices: a
    raw pointer is dense (ld = cols, stride = rows * cols); an array with
    __cuda_array_interface__ (2-D, or 3-D with the batch first) says its own strides, and must
    have unit stride along its rows."""
    if isinstance(x, int):
        return x, cols, rows * cols
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{name} must be a device pointer (int) or have __cuda_array_interface__, got {type(x).__name__}")
    if cai.get("typestr") not in ("<f4", "=f4", "f4"):
        raise TypeError(f"{name} must hold float32 data, got typestr {cai.get('typestr')!r}")
    shape = tuple(cai["shape"])
    if len(shape) not in (2, 3):
        raise ValueError(f"{name} must be 2-D (a matrix) or 3-D (a batch of matrices), got shape {shape}")
    strides = cai.get("strides")
    if strides is None:
        ld, stride = shape[-1], shape[-1] * shape[-2]
    else:
        if strides[-1] != 4:
            raise ValueError(f"{name} must have unit stride along its rows (got byte strides {tuple(strides)})")
        ld = strides[-2] // 4
        stride = strides[0] // 4 if len(shape) == 3 else ld * shape[-2]
    return int(cai["data"][0]), ld, stride


def _stream_handle(stream: Any) -> int:
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream / cupy.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be an int handle or a CuPy/PyTorch stream, got {type(stream).__name__}")


_LIBCUDA: Any = None
# cuda.h's CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: an id, padded to 8 bytes, then a 64-byte union of values (here
    the one int programmatic stream serialization reads)."""
    _fields_ = [("id", ctypes.c_int), ("_pad", ctypes.c_int), ("value", ctypes.c_int), ("_rest", ctypes.c_int),
                ("_union_rest", ctypes.c_longlong * 7)]


class _LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


def _ctypes_config(launch: Launch) -> _LaunchConfig:
    """A launch's CUlaunchConfig for the ctypes path (its stream is set per call)."""
    config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*launch.grid), block=(ctypes.c_uint * 3)(*launch.block),
                           shared_bytes=launch.shared_bytes)
    if launch.follows:
        config.attrs = ctypes.pointer(_LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1))
        config.num_attrs = 1
    return config


def _libcuda() -> Any:
    """libcuda's cuLaunchKernelEx through ctypes: the launch path of a Plan, where cuda-python's
    argument conversion would cost more than the launch itself."""
    global _LIBCUDA
    if _LIBCUDA is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernelEx
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuCtxSetCurrent.restype = ctypes.c_int
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        _LIBCUDA = lib
    return _LIBCUDA


class Plan:
    """One (family, config, layout, shape, batch) ready to run on a device: the loaded kernel, its
    launch sequence, the workspace it needs, and its kernel parameters in a ctypes block, so
    that a call writes only what changed (pointers, scalars) and launches."""

    def __init__(self, kernel: LoadedKernel, launches: Sequence[Launch], workspace_bytes: int,
                 dims: tuple[int, int, int], context: Any = None, bias: bool = False):
        self.kernel = kernel
        self.bias = bias  # compiled with the bias epilogue (a program without one ignores the pointer)
        self._context = int(context) if context is not None else None  # the device's primary context
        self.launches = tuple(launches)
        self.workspace_bytes = workspace_bytes
        self.dims = dims
        self._lock = threading.Lock()
        m, n, k = dims
        self._args = [t() for t in _PARAM_TYPES]
        self._args[0].value, self._args[1].value, self._args[2].value = m, n, k
        self._fixed: tuple | None = None
        most = max(len(launch.tensor_maps) for launch in self.launches)
        self._params = (ctypes.c_void_p * (len(_PARAM_TYPES) + most))(
            *[ctypes.addressof(x) for x in self._args], *([None] * most))
        # the configurations stay referenced here: a launch reads its attributes through a pointer
        self._calls = [(int(kernel.functions[launch.kernel]), _ctypes_config(launch), launch.splits, launch.raster,
                        launch.tensor_maps, launch.only_for_fallbacks) for launch in self.launches]
        self._views = skippable_views(self.launches)

    def run(self, a: int, lda: int, b: int, ldb: int, c: int, ldc: int, alpha: float = 1.0, beta: float = 0.0,
            *, bias: int = 0, strides: tuple[int, int, int] = (0, 0, 0), workspace: int = 0,
            stream: int = 0) -> None:
        """C = alpha*op(A)*op(B) + beta*C (+ bias) for device addresses, asynchronously on
        `stream`; workspace: at least ``workspace_bytes`` of device memory (when > 0). Makes the
        plan's device context current on the calling thread (whatever thread that is)."""
        lib = _libcuda()
        launch = lib.cuLaunchKernelEx
        args = self._args
        if self._context is not None:
            lib.cuCtxSetCurrent(self._context)
        with self._lock:
            args[3].value, args[4].value, args[6].value = alpha, a, b
            args[8].value, args[9].value, args[11].value = beta, c, workspace
            fixed = (lda, ldb, ldc, bias, strides)
            if fixed != self._fixed:  # a call's operand geometry mostly repeats: set it when it changes
                if bias and not self.bias:
                    raise ValueError("this plan has no bias epilogue: make it with plan(..., bias=True)")
                self._fixed = fixed
                for i, v in ((5, lda), (7, ldb), (10, ldc), (12, bias), (13, strides[0]), (14, strides[1]),
                             (15, strides[2])):
                    args[i].value = v
            operands = {"a": (a, lda, strides[0]), "b": (b, ldb, strides[1])}
            in_place = self._views is not None and maps_read_in_place(self._views, operands)
            for fn, config, splits, raster, maps, only_for_fallbacks in self._calls:
                if only_for_fallbacks and in_place:
                    continue
                args[16].value, args[17].value = splits, raster
                held = []  # the encoded maps stay referenced until the launch has copied them
                if maps:
                    for j, tm in enumerate(maps):
                        held.append(self.kernel._tensor_map(tm, operands, workspace))
                        self._params[len(_PARAM_TYPES) + j] = held[-1].getPtr()
                config.stream = stream
                err = launch(config, fn, self._params, None)
                if err:
                    from cuda.bindings import driver

                    raise CudaError(f"cuLaunchKernelEx({self.kernel.name_of(fn)})", driver.CUresult(err))


_LOADED: dict[tuple, LoadedKernel] = {}
_WORKSPACE: dict[tuple[int, int], tuple[int, int]] = {}  # (device, stream) → (ptr, bytes)
# Per (device, family, config, layout, shape, batch): the Plan. Working the geometry out is pure
# Python costing more than the launch itself (tens of µs for wgmma), so repeated calls of one
# shape take it from here.
_PLANS: dict[tuple, Plan] = {}
PLAN_CACHE = 4096  # entries before the plan cache starts over
_PLAN_LOCK = threading.Lock()


def plan(family: Family | str, config: Config, m: int, n: int, k: int, *, layout: str = "nn", batch: int = 1,
         bias: bool = False, device: int = 0) -> Plan:
    """The cached Plan of one config for one problem on `device` (compiled, or taken from the
    CUBIN cache, and loaded on first use); makes the device's context current. bias: the plan
    adds a bias vector (its calls must pass one)."""
    from kernels.families import get_family

    fam = get_family(family) if isinstance(family, str) else family
    arch = device_arch(device)  # also makes the device's context current
    # the config's items in the caller's order: cheaper than sorting, and an order seen twice
    # only costs a second entry
    key = (device, fam.name, tuple(config.items()), layout, m, n, k, batch, bias)
    found = _PLANS.get(key)
    if found is None:
        found = _new_plan(fam, config, m, n, k, layout, batch, bias, device, arch, key)
    return found


def _new_plan(fam: Family, config: Config, m: int, n: int, k: int, layout: str, batch: int, bias: bool,
              device: int, arch: str, key: tuple) -> Plan:
    from kernels.compiler import compile_config

    check_batch(batch)
    launches = tuple(fam.launches(config, m, n, k, layout, batch))
    need = fam.workspace_bytes(config, m, n, k, layout, batch)
    with _PLAN_LOCK:  # one compile and module load per program, however many threads ask
        loaded_key = (device, fam.name, tuple(sorted(config.items())), layout, batch > 1, bias, arch)
        kernel = _LOADED.get(loaded_key)
        if kernel is None:
            cubin = compile_config(fam, config, arch, layout=layout, batch=batch, bias=bias).cubin
            kernel = _LOADED[loaded_key] = LoadedKernel(cubin, launches)
        if len(_PLANS) >= PLAN_CACHE:
            _PLANS.clear()
        made = _PLANS[key] = Plan(kernel, launches, need, (m, n, k), _CONTEXTS[device], bias)
    return made


def workspace(device: int, stream: int, need: int) -> int:
    """The split-K/pack workspace of (device, stream), grown to ``need`` bytes. One per stream:
    calls on one stream run in order and can share it; calls on two streams may overlap.
    (Allocating is not allowed while a stream is captured into a CUDA graph: callers that may
    be captured pass workspace of their own, e.g. from PyTorch's allocator.)"""
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
         alpha: float = 1.0, beta: float = 0.0, *, layout: str = "nn", batch: int = 1,
         lda: int | None = None, ldb: int | None = None, ldc: int | None = None,
         strides: tuple[int, int, int] | None = None, bias: Any = None, stream: Any = 0, device: int = 0) -> None:
    """C = alpha*op(A)*op(B) + beta*C (+ bias along each row) on the GPU with one family and
    config, asynchronously on `stream`; a batch of `batch` such problems where batch > 1.

    a, b, c: float32 device data as stored for `layout` (kernels.layout: A is M×K, or K×M when
    transposed; B is K×N, or N×K), each a CuPy/PyTorch array (2-D, or 3-D with the batch first;
    unit stride along rows; its strides give the leading dimension and batch stride) or a raw
    pointer (dense). lda / ldb / ldc and strides (the batch strides of A, B, C in elements)
    override what the arrays say. bias: N floats (array or pointer) or None. The CUBIN is
    compiled (or taken from the cache) on first use.
    """
    (ra, ca), (rb, cb) = stored_shapes(layout, m, n, k)
    pa, la, sa = _geometry(a, "a", ra, ca)
    pb, lb, sb = _geometry(b, "b", rb, cb)
    pc, lc, sc = _geometry(c, "c", m, n)
    if strides is not None:
        sa, sb, sc = strides
    made = plan(family, config, m, n, k, layout=layout, batch=batch, bias=bias is not None, device=device)
    handle = _stream_handle(stream)
    ws = workspace(device, handle, made.workspace_bytes) if made.workspace_bytes else 0
    made.run(pa, la if lda is None else lda, pb, lb if ldb is None else ldb, pc, lc if ldc is None else ldc,
             alpha, beta, bias=0 if bias is None else device_pointer(bias, "bias"),
             strides=(sa, sb, sc) if batch > 1 else (0, 0, 0), workspace=ws, stream=handle)
