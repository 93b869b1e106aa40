"""The FP16 rung (rung 12) without a GPU: sm_90a compiles, resources, SASS, launch plan, workspace."""
import multiprocessing
import re
import shutil
import subprocess
from concurrent.futures import ProcessPoolExecutor

import pytest

from kernels import compile_config, get_family
from kernels.families import f16x3 as layout
from kernels.space import TensorMap

FAMILY = get_family("f16x3")


def _compile(job):
    config, cache = job
    ck = compile_config(FAMILY, config, "sm_90", cache_dir=cache)
    return ck.resources, ck.log, ck.cubin


def test_starting_points_compile_for_sm90a_without_spills(tmp_path):
    jobs = [(c, str(tmp_path)) for c in FAMILY.starting_points]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for (config, _), (resources, log, _cubin) in zip(jobs, pool.map(_compile, jobs)):
            assert "sm_90a" in log, "wgmma and setmaxnreg need the arch-specific target"
            for name in ("gemm", "gemm_scale", "gemm_pack"):
                r = resources[name]
                assert (r.spill_store_bytes, r.spill_load_bytes, r.stack_bytes) == (0, 0, 0), (name, config, log)
            assert ("gemm_splitk_reduce" in resources) == (config["SPLITK"] > 1)
            assert resources["gemm"].registers <= 65536 // FAMILY.threads(config)
            assert "setmaxnreg ignored" not in log.lower(), log


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump (CUDA toolkit) not installed here")
def test_main_loop_issues_fp16_and_tf32_hgmma(tmp_path):
    """SASS evidence: the FP16 path's HGMMA with F16 inputs and the TF32 path's, no local memory."""
    _, _, cubin = _compile((FAMILY.starting_points[0], str(tmp_path)))
    path = tmp_path / "f16x3.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"HGMMA\.64x128x16\.F32 ", sass)  # FP16 inputs carry no type suffix
    assert re.search(r"HGMMA\.64x128x8\.F32\.TF32", sass)
    assert "LDL" not in sass and "STL" not in sass


def test_offered_only_on_hopper_with_a_reason():
    config = dict(FAMILY.starting_points[0])
    assert FAMILY.accepts(config, "sm_90")
    reasons = FAMILY.reject_reasons(config, "sm_80")
    assert len(reasons) == 1 and "sm_90" in reasons[0]
    assert FAMILY.target("sm_90") == "sm_90a" and FAMILY.precision == "fp32-tc"


def test_constraints_name_registers_box_rows_and_shared_memory():
    base = dict(WGS=2, MW=1, BN=128, ATOMS=1, STAGES=3, FLUSH=4, SPLITK=1, RASTER=1)
    assert FAMILY.accepts(base)
    assert any("register budget" in r for r in FAMILY.reject_reasons(dict(base, MW=2)))  # 3*2*64 + 32 > 232
    assert any("TMA box" in r for r in FAMILY.reject_reasons(dict(base, WGS=3, MW=2, BN=64)))
    assert any("shared memory" in r for r in FAMILY.reject_reasons(dict(base, STAGES=4)))  # 4 x 64 KiB
    assert FAMILY.shared_bytes(base) == 3 * 2 * (128 + 128) * 128 + 1024 + 16 * 3


@pytest.mark.parametrize("shape", [(1, 1, 1), (1023, 1025, 999), (4096, 4096, 4096), (67, 61, 8191)])
@pytest.mark.parametrize("splitk", [1, 4])
@pytest.mark.parametrize("batch", [1, 3])
def test_launch_plan_and_workspace_layout(shape, splitk, batch):
    m, n, k = shape
    config = dict(FAMILY.starting_points[0], SPLITK=splitk)
    launches = FAMILY.launches(config, m, n, k, "nt", batch)
    assert [l.kernel for l in launches] == (["gemm_scale", "gemm_pack", "gemm"]
                                            + (["gemm_splitk_reduce"] if splitk > 1 else []))
    scale, pack, main = launches[:3]
    assert scale.grid == (-(-m // 32) - (-n // 32), 1, batch)
    # the blocks the source's kernels are written for (a launch with more threads than
    # __launch_bounds__ fails; with fewer, the scale leaves rows out)
    source = FAMILY.source
    assert scale.block == (int(re.search(r"#define SCALE_THREADS (\d+)", source).group(1)), 1, 1)
    assert pack.block == (256, 1, 1) and "__launch_bounds__(256) gemm_pack" in source
    assert layout.PACK_K == int(re.search(r"#define PACK_K (\d+)", source).group(1))
    assert pack.grid[1:] == (2, batch) and main.grid[2] == batch * splitk
    ws = layout.workspace_layout(config, m, n, k, batch)
    k16, k32 = -(-k // 8) * 8, -(-k // 4) * 4
    a16, b16, a32, b32 = main.tensor_maps
    assert a16 == TensorMap("workspace", dims=(k16, m, 2 * batch), box=(64, 128, 1), strides=(2 * k16, 4 * m * k32),
                            offset=ws.apack, element="f16")
    assert a32 == TensorMap("workspace", dims=(k32, m, 2 * batch), box=(32, 128, 1), strides=(4 * k32, 4 * m * k32),
                            offset=ws.apack)
    assert b16.offset == b32.offset == ws.bpack and b16.box == (64, 128, 1) and b32.dims == (k32, n, 2 * batch)
    # The regions follow one another without overlap, 256-byte aligned; the packed parts have
    # room for the TF32 path (8 bytes per element and part pair), which covers the FP16 one.
    offsets = [ws.flags, ws.amax, ws.bmax, ws.fits, ws.apack, ws.bpack, ws.end]
    assert all(o % 256 == 0 for o in offsets) and offsets == sorted(offsets)
    assert ws.flags >= (4 * batch * splitk * m * n if splitk > 1 else 0)
    assert ws.bpack - ws.apack >= 8 * batch * m * k32 >= 4 * batch * m * k16
    assert ws.end - ws.bpack >= 8 * batch * n * k32
    assert FAMILY.workspace_bytes(config, m, n, k, "nt", batch) == ws.end
    for tm in main.tensor_maps:
        assert all(s % 16 == 0 for s in tm.strides) and tm.offset % 16 == 0
        assert all(1 <= x <= 256 for x in tm.box) and tm.box[0] * (2 if tm.element == "f16" else 4) == 128



def test_a_tensor_map_element_is_fp32_or_a_workspace_fp16():
    with pytest.raises(ValueError, match="'f32' or 'f16'"):
        TensorMap("workspace", dims=(8, 8, 1), box=(8, 8, 1), element="bf16")
    with pytest.raises(ValueError, match="FP16 TensorMap views the workspace"):
        TensorMap("a", dims=(8, 8, 1), box=(8, 8, 1), element="f16")
