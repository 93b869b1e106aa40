"""The Hopper family (rung 11) without a GPU: sm_90a compiles, resources, launch plan, gating."""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from kernels import compile_config, get_family
from kernels.families import wgmma as layout
from kernels.space import TensorMap

FAMILY = get_family("wgmma")


def _compile(job):
    config, cache = job
    ck = compile_config(FAMILY, config, "sm_90", cache_dir=cache)
    return ck.resources, ck.log


def test_starting_points_compile_for_sm90a_without_spills(tmp_path):
    jobs = [(dict(c, ASPLIT=a), str(tmp_path)) for c in FAMILY.starting_points[:4] for a in (0, 1)]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for (config, _), (resources, log) in zip(jobs, pool.map(_compile, jobs)):
            assert "sm_90a" in log, "wgmma and setmaxnreg need the arch-specific target"
            main = resources["gemm"]
            assert (main.spill_store_bytes, main.spill_load_bytes, main.stack_bytes) == (0, 0, 0), (config, log)
            assert "gemm_pack" in resources
            assert ("gemm_splitk_reduce" in resources) == (config["SPLITK"] > 1)
            # A cap at entry (launch bounds with min 1 block) is what lets setmaxnreg take effect.
            assert main.registers <= 65536 // FAMILY.threads(config)
            assert "C7508" not in log and "setmaxnreg ignored" not in log.lower(), log


def test_offered_only_on_hopper_with_a_reason():
    config = dict(FAMILY.starting_points[0])
    assert FAMILY.accepts(config, "sm_90")
    reasons = FAMILY.reject_reasons(config, "sm_80")
    assert len(reasons) == 1 and "sm_90" in reasons[0] and "sm_80" in reasons[0]
    assert FAMILY.accepted_configs("sm_80") == [] and len(FAMILY.accepted_configs("sm_90")) > 500
    assert FAMILY.target("sm_90") == "sm_90a"


def test_register_budget_constraint_rejects_oversized_tiles():
    config = dict(BM=128, BK=32, WGS=2, MW=2, STAGES=2, FLUSH=4, SPLITK=1, RASTER=1, ASPLIT=0)
    assert any("register budget" in r for r in FAMILY.reject_reasons(config))
    config = dict(BM=128, BK=64, WGS=2, MW=1, STAGES=4, FLUSH=4, SPLITK=1, RASTER=1, ASPLIT=0)  # 4 x 96 KiB stages
    assert any("shared memory" in r for r in FAMILY.reject_reasons(config))


@pytest.mark.parametrize("shape", [(1, 1, 1), (1023, 1025, 999), (4096, 4096, 4096), (67, 61, 8191)])
@pytest.mark.parametrize("splitk", [1, 4])
def test_launch_plan_and_workspace_layout(shape, splitk):
    m, n, k = shape
    config = dict(FAMILY.starting_points[0], SPLITK=splitk)
    launches = FAMILY.launches(config, m, n, k)
    assert [l.kernel for l in launches] == ["gemm_pack", "gemm"] + (["gemm_splitk_reduce"] if splitk > 1 else [])
    main = FAMILY.main_launch(config, m, n, k)
    assert main.grid[2] == splitk and main.block[0] == 384
    a_map, b_map = main.tensor_maps
    kp, np_ = -(-k // 4) * 4, -(-n // 4) * 4
    # A's packed parts sit after the split-K partials, 256-byte aligned; B's copy after them.
    a_off = layout.ws_a_offset(config, m, n)
    assert a_map == TensorMap("workspace", dims=(kp, m, 2), box=(32, config["BM"], 1),
                              strides=(4 * kp, 4 * m * kp), offset=4 * a_off)
    assert a_off >= (splitk * m * n if splitk > 1 else 0) and a_off % 64 == 0
    assert b_map.base == "b" and b_map.dims == (n, k, 1) and b_map.fallback.base == "workspace"
    b_off = b_map.fallback.offset // 4
    assert b_off >= a_off + 2 * m * kp and b_off % 64 == 0 and b_map.fallback.strides == (4 * np_, 4 * k * np_)
    assert FAMILY.workspace_bytes(config, m, n, k) == 4 * (b_off + k * np_)
    # Every TMA stride is a multiple of 16 bytes, every box within the engine's 256-element limit.
    for tm in (a_map, b_map.fallback):
        assert all(s % 16 == 0 for s in tm.strides) and tm.offset % 16 == 0
        assert all(1 <= x <= 256 for x in tm.box)


def test_shared_memory_fits_stages_barriers_and_alignment_slack():
    config = dict(BM=128, BK=32, WGS=2, MW=1, STAGES=4, FLUSH=4, SPLITK=1, RASTER=1, ASPLIT=0)
    stage = 2 * 128 * 32 * 4 + 32 * 128 * 4
    assert FAMILY.shared_bytes(config) == 4 * stage + 1024 + 16 * 4  # two mbarriers per stage
    assert FAMILY.shared_bytes(dict(config, ASPLIT=1)) == 4 * stage + 1024 + 24 * 4  # and one for the split


def test_asplit_reads_a_in_place_with_the_packed_view_as_fallback():
    m, n, k = 256, 256, 16384
    packed = dict(FAMILY.starting_points[0], ASPLIT=0)
    in_kernel = dict(packed, ASPLIT=1)
    a_packed = FAMILY.main_launch(packed, m, n, k).tensor_maps[0]
    a_view = FAMILY.main_launch(in_kernel, m, n, k).tensor_maps[0]
    assert a_packed.base == "workspace"
    assert a_view == TensorMap("a", dims=(k, m, 1), box=(32, packed["BM"], 1), fallback=a_packed)
    # The workspace keeps room for the packed A: an unaligned A falls back to it at run time.
    assert FAMILY.workspace_bytes(in_kernel, m, n, k) == FAMILY.workspace_bytes(packed, m, n, k)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_layouts_and_batches_in_the_maps_and_the_workspace(layout):
    """Every map is 3-D, its last coordinate the batch entry; a transposed A is always packed (not
    K-major), a transposed B is read as boxes of BN rows by 32 k; the workspace holds a batch of
    everything."""
    m, n, k, batch = 1023, 1025, 999, 3
    config = dict(FAMILY.starting_points[0], ASPLIT=1)
    main = FAMILY.main_launch(config, m, n, k, layout, batch)
    a_map, b_map = main.tensor_maps
    kp, np_ = -(-k // 4) * 4, -(-n // 4) * 4
    bn = 64 * config["MW"] * config["WGS"]
    if layout[0] == "t":
        assert a_map.base == "workspace" and a_map.dims == (kp, m, 2 * batch)
    else:
        assert a_map.base == "a" and a_map.dims == (k, m, batch) and a_map.fallback.dims == (kp, m, 2 * batch)
    if layout[1] == "t":
        assert b_map.dims == (k, n, batch) and b_map.box == (32, bn, 1)
        assert b_map.fallback.strides == (4 * kp, 4 * n * kp)
    else:
        assert b_map.dims == (n, k, batch) and b_map.box == (32, config["BK"], 1)
    assert main.grid[2] == batch
    pack = FAMILY.launches(config, m, n, k, layout, batch)[0]
    assert pack.kernel == "gemm_pack" and pack.grid[1] == batch
    copy = n * kp if layout[1] == "t" else k * np_
    assert FAMILY.workspace_bytes(config, m, n, k, layout, batch) == 4 * (b_map.fallback.offset // 4 + batch * copy)
    assert FAMILY.workspace_bytes(config, m, n, k, layout, batch) > FAMILY.workspace_bytes(config, m, n, k, layout)
