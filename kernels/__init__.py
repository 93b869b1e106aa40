"""Parameterized FP32 GEMM kernels (C = alpha*A*B + beta*C, row-major), compiled with NVRTC.

Imports none of the other layers.
"""
from kernels.compiler import CompiledKernel, CompileError, Resources, compile_config, nvrtc_version
from kernels.families import FAMILIES, LADDER, get_family
from kernels.layout import DEFAULT_LAYOUT, LAYOUTS, check_layout, stored_shapes
from kernels.occupancy import ARCH_LIMITS, Occupancy, max_registers, occupancy
from kernels.space import (PRECISIONS, BoundFamily, Config, ConfigError, Constraint, Family, Launch, Param, arch_of, bind,
                           bound_to)

def gemm(family, config, a, b, c, m, n, k, alpha=1.0, beta=0.0, **options):
    """Run C = alpha*op(A)*op(B) + beta*C with one family and config on device data; options:
    layout, batch, lda, ldb, ldc, strides, bias, stream, device (see kernels.runtime.gemm)."""
    from kernels.runtime import gemm as _gemm

    return _gemm(family, config, a, b, c, m, n, k, alpha, beta, **options)


__all__ = [
    "ARCH_LIMITS", "arch_of", "BoundFamily", "bind", "bound_to", "CompileError", "DEFAULT_LAYOUT", "LAYOUTS", "check_layout", "stored_shapes", "PRECISIONS", "CompiledKernel", "Config", "ConfigError", "Constraint", "FAMILIES",
    "Family", "Launch", "Occupancy", "Param", "Resources", "compile_config", "gemm", "get_family",
    "nvrtc_version", "occupancy", "max_registers",
]
