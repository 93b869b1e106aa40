"""Launches that start while the kernel before them still runs (Launch.follows, programmatic
dependent launch): only kernels that wait for their predecessor in-kernel are launched so, the
launch configuration handed to libcuda is the one cuda.h defines, and calls back to back on one
workspace never see each other's data (docs/kernels.md, "Launches that overlap their predecessor");
wgmma's pre-pass is skipped exactly where it would copy nothing."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import kernels
from kernels import runtime
from kernels.reference import relative_error, tolerance
from kernels.space import Launch, enumerate_accepted, expanded_source

SHAPES = [(256, 256, 4096), (1023, 1025, 999), (5, 3, 1)]


def _kernel_body_start(source: str, kernel: str) -> str:
    """The text of `kernel`'s body from its opening brace on (its first statements)."""
    found = re.search(r'extern "C" __global__ void[^{;]*?\b' + kernel + r"\s*\([^{]*\{", source)
    assert found, f"kernel {kernel} not found in the source"
    return source[found.end():found.end() + 200]


@pytest.mark.parametrize("name", list(kernels.FAMILIES))
def test_only_kernels_that_wait_for_their_predecessor_follow_it(name):
    fam = kernels.get_family(name)
    config = dict(fam.starting_points[0]) if fam.starting_points else next(enumerate_accepted(fam))
    for param in fam.params:  # with a split-K reduction where the family has one
        if param.name == "SPLITK":
            config["SPLITK"] = max(param.values)
    launches = fam.launches(config, *SHAPES[1])
    assert {launch.follows for launch in launches} == {fam.follows_previous}
    if fam.follows_previous:
        source = expanded_source(fam.source_file)[0]
        for launch in launches:
            first = _kernel_body_start(source, launch.kernel).split(";")[0]
            assert "follow_previous_grid()" in first, f"{launch.kernel} does not wait for its predecessor first"


def test_launch_configuration_has_cuda_h_layout():
    """The ctypes structures of the Plan's launch path against cuda.bindings' own (compiled from
    cuda.h), byte for byte but for the attribute pointer."""
    from cuda.bindings import driver

    for follows in (False, True):
        launch = Launch("gemm", (3, 2, 7), (384, 1, 1), 100_000, follows=follows)
        theirs = runtime._driver_config(launch, 0xABC)
        ours = runtime._ctypes_config(launch)
        ours.stream = 0xABC
        size = runtime._LaunchConfig.attrs.offset
        assert ctypes.sizeof(runtime._LaunchConfig) == 56 and ctypes.sizeof(runtime._LaunchAttribute) == 72
        assert bytes(ours)[:size] == ctypes.string_at(theirs.getPtr(), size)
        assert ours.num_attrs == theirs.numAttrs == int(follows)
        if follows:
            assert bytes(ours.attrs[0]) == ctypes.string_at(theirs.attrs[0].getPtr(), 72)
            ids = driver.CUlaunchAttributeID
            assert theirs.attrs[0].id == ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("asplit", [0, 1])
def test_wgmma_skips_its_pre_pass_exactly_where_it_would_copy_nothing(layout, asplit):
    """The pre-pass (wgmma.cu's gemm_pack) splits A unless A is split in the kernel (ASPLIT, A
    not transposed, A TMA-ready) and copies B unless B is TMA-ready; the launcher skips it only
    where neither happens."""
    fam = kernels.get_family("wgmma")
    config = dict(fam.starting_points[0], ASPLIT=asplit)
    m, n, k = 256, 512, 1024
    launches = fam.launches(config, m, n, k, layout)
    pack = launches[0]
    assert pack.kernel == "gemm_pack"
    views = runtime.operand_views(launches)
    (_, a_cols), (_, b_cols) = kernels.stored_shapes(layout, m, n, k)
    for a_shift in (0, 1):  # floats past a 16-byte boundary
        for b_shift in (0, 1):
            for a_ld in (a_cols, a_cols + 1):
                for b_ld in (b_cols, b_cols + 3):
                    a, b = (1 << 20) + 4 * a_shift, (1 << 24) + 4 * b_shift
                    a_ready, b_ready = runtime.tma_ready(a, a_ld), runtime.tma_ready(b, b_ld)
                    copies_nothing = asplit and layout[0] == "n" and a_ready and b_ready
                    skipped = pack.only_for_fallbacks and runtime.maps_read_in_place(
                        views, {"a": (a, a_ld, 0), "b": (b, b_ld, 0)})
                    assert skipped == copies_nothing, (a_shift, b_shift, a_ld, b_ld)


@pytest.mark.gpu
@pytest.mark.parametrize("family,config", [
    ("wgmma", {"BM": 64, "BK": 64, "WGS": 2, "MW": 1, "STAGES": 3, "FLUSH": 4, "SPLITK": 16, "RASTER": 8, "ASPLIT": 1}),
    ("wgmma", {"BM": 64, "BK": 32, "WGS": 2, "MW": 1, "STAGES": 4, "FLUSH": 4, "SPLITK": 16, "RASTER": 8, "ASPLIT": 0}),
    ("f16x3", {"WGS": 2, "MW": 1, "BN": 128, "ATOMS": 1, "STAGES": 3, "FLUSH": 4, "SPLITK": 4, "RASTER": 8}),
])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_calls_back_to_back_on_one_workspace_keep_their_own_inputs(hopper_cupy, family, config, shape):
    """Two problems alternated without a synchronization between calls: each call's pre-pass
    rewrites the workspace the call before it read, so a kernel that started touching memory
    before its predecessor ended would mix the two problems' operands."""
    cp = hopper_cupy
    m, n, k = shape
    rng = np.random.default_rng(m + n + k)
    hosts = [(rng.standard_normal((m, k)).astype(np.float32), rng.uniform(-1, 3, (k, n)).astype(np.float32))
             for _ in range(2)]
    operands = [(cp.asarray(a), cp.asarray(b)) for a, b in hosts]
    outputs = [[cp.full((m, n), cp.nan, cp.float32) for _ in range(8)] for _ in range(2)]
    for call in range(8):
        for (a, b), out in zip(operands, outputs):
            kernels.gemm(family, config, a, b, out[call], m, n, k)
    cp.cuda.runtime.deviceSynchronize()
    for (a, b), out in zip(hosts, outputs):
        ref = a.astype(np.float64) @ b.astype(np.float64)
        for c in out:
            assert relative_error(cp.asnumpy(c), ref) < tolerance(k)
