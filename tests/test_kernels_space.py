"""Parameter spaces, constraints and launch geometry of every family (CPU only)."""
import random
import re

import pytest

from kernels import FAMILIES, ConfigError, get_family
from kernels.space import enumerate_accepted


def test_ladder_order_and_names():
    assert [f.rung for f in FAMILIES.values()] == list(range(1, 13))
    assert list(FAMILIES) == ["naive", "smem", "blocktile1d", "blocktile2d", "vectorized", "warptile",
                              "pipelined", "splitk", "tf32x3", "skinny", "wgmma", "f16x3"]


def test_unknown_family_lists_known():
    with pytest.raises(ConfigError, match="known families: naive, smem"):
        get_family("cutlass")


def test_unknown_parameter_and_value_are_named():
    fam = get_family("smem")
    with pytest.raises(ConfigError, match=r"no parameter 'BM'.*parameters are TILE"):
        fam.reject_reasons({"TILE": 16, "BM": 3})
    with pytest.raises(ConfigError, match=r"TILE=12 is not allowed; allowed values are 8, 16, 32"):
        fam.reject_reasons({"TILE": 12})
    with pytest.raises(ConfigError, match="missing TILE"):
        fam.reject_reasons({})


@pytest.mark.parametrize("dims", [(0, 4, 4), (4, -1, 4), (4, 4, 0)])
def test_non_positive_dimension_is_a_value_error(dims):
    fam = get_family("naive")
    with pytest.raises(ValueError, match="must be a positive integer"):
        fam.launches({"BX": 32, "BY": 4, "COALESCED": 1}, *dims)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_rejected_config_carries_a_reason(name):
    fam = get_family(name)
    rng = random.Random(7)
    names = [p.name for p in fam.params]
    rejected = 0
    for _ in range(400):
        config = {p.name: rng.choice(p.values) for p in fam.params}
        reasons = fam.reject_reasons(config)
        assert all(isinstance(r, str) and r for r in reasons)
        rejected += bool(reasons)
        assert fam.accepts(config) == (not reasons)
    assert names  # every family is tunable
    if fam.constraints:
        assert rejected > 0


@pytest.mark.parametrize("name", list(FAMILIES))
def test_pruned_enumeration_matches_filtering(name):
    fam = get_family(name)
    accepted = fam.accepted_configs()
    assert accepted, f"{name} accepts nothing"
    rng = random.Random(1)
    accepted_set = {tuple(c.values()) for c in accepted}
    for _ in range(300):  # random full configs agree with the pruned enumeration
        config = {p.name: rng.choice(p.values) for p in fam.params}
        assert (tuple(config.values()) in accepted_set) == fam.accepts(config)


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.space_size() <= 20_000])
def test_pruned_enumeration_is_the_filtered_product_in_product_order(name):
    fam = get_family(name)
    product = [c for c in fam.all_configs() if fam.accepts(c)]
    assert list(enumerate_accepted(fam, "sm_90")) == product
    assert list(enumerate_accepted(fam, "sm_80")) == [c for c in fam.all_configs() if fam.accepts(c, "sm_80")]


def test_search_ranges_are_wide_enough_to_matter():
    warp = get_family("pipelined")
    values = {p.name: p.values for p in warp.params}
    assert min(values["BM"]) <= 32 and max(values["BM"]) >= 256
    assert values["STAGES"] == (2, 3, 4)
    assert {64, 512} <= set(values["THREADS"])
    assert max(dict((p.name, p.values) for p in get_family("splitk").params)["SPLITK"]) == 32


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("shape", [(1, 1, 1), (1023, 1025, 999), (16, 4096, 4096)])
def test_launch_grid_covers_the_output(name, shape):
    fam = get_family(name)
    m, n, k = shape
    for config in fam.sample_accepted(5, seed=2):
        launches = fam.launches(config, m, n, k)
        tm, tn = fam.tiles(config, m, n)
        main = fam.main_launch(config, m, n, k)
        assert main.grid[0] * tm * tn >= m * n
        assert main.grid[0] == -(-m // tm) * -(-n // tn)
        assert main.block[0] == fam.threads(config)
        assert main.grid[2] == fam.splits(config)
        if fam.splits(config) > 1:
            assert launches[-1].kernel == "gemm_splitk_reduce"
            # The partials come first in the workspace (a family may keep more after them).
            assert fam.workspace_bytes(config, m, n, k) >= 4 * m * n * fam.splits(config)


def test_shared_memory_limit_depends_on_arch():
    fam = get_family("pipelined")
    base = dict(BM=128, BN=128, BK=32, WM=64, WN=32, WNITER=2, TM=4, TN=4, THREADS=256, PADA=4, RASTER=1, STAGES=4)
    assert fam.shared_bytes(base) == 4 * 4 * 32 * (128 + 4 + 128)  # 130 KiB
    assert fam.reject_reasons(base, "sm_90") == []
    assert any("shared memory" in r and "sm_86 allows" in r for r in fam.reject_reasons(base, "sm_86"))
    assert fam.reject_reasons(dict(base, STAGES=2), "sm_86") == []  # 65 KiB fits in 99 KiB


def test_every_family_declares_its_arithmetic():
    # Each family must say what it computes with; gemmtune.matmul(precision="ffma") relies on it
    # to keep tensor-core emulation out, and a family that forgets is offered under no precision.
    from kernels import PRECISIONS

    classes = set(PRECISIONS["fp32"])
    assert set(PRECISIONS["ffma"]) == {"ffma"} and classes == {"ffma", "fp32-tc"}
    for name, fam in FAMILIES.items():
        assert "precision" in vars(type(fam)), f"{name} inherits its precision instead of declaring it"
        assert fam.precision in classes, f"{name}: precision {fam.precision!r} not in {sorted(classes)}"
    assert get_family("tf32x3").precision == get_family("wgmma").precision == get_family("f16x3").precision == "fp32-tc"
    assert {n for n, f in FAMILIES.items() if f.precision == "ffma"} == set(FAMILIES) - {"tf32x3", "wgmma", "f16x3"}


# ---- launch-time parameters (issue 19: configs differing only in them share one compile) ----

LAUNCH_TIME = {"RASTER", "SPLITK"}


def _code(text: str) -> str:
    """CUDA text without its comments."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_launch_time_parameters_share_a_program_and_reach_every_launch(name):
    fam = get_family(name)
    assert {p.name for p in fam.params if p.launch_time} == LAUNCH_TIME & {p.name for p in fam.params}
    moving = [p for p in fam.params if p.launch_time]
    for config in fam.sample_accepted(4, seed=7):
        for p in moving:
            for value in p.values:
                other = dict(config, **{p.name: value})
                if not fam.accepts(other):
                    continue
                # One program for every value, but for the one thing compiled in: whether K is sliced.
                same_split = (fam.splits(other) > 1) == (fam.splits(config) > 1)
                assert (fam.program(other) == fam.program(config)) == same_split, (config, p.name, value)
                want = (fam.splits(other), other.get("RASTER", 1))
                for launch in fam.launches(other, 1023, 1025, 999):  # pre-pass, GEMM and reduction alike
                    assert (launch.splits, launch.raster) == want, (launch.kernel, other)
        # Every compile-time parameter is in the program, and changes it.
        for p in fam.params:
            if p.launch_time:
                continue
            for value in p.values:
                other = dict(config, **{p.name: value})
                if value != config[p.name] and fam.accepts(other):
                    assert fam.program(other) != fam.program(config), (config, p.name, value)
                    break


@pytest.mark.parametrize("name", list(FAMILIES))
def test_no_launch_time_parameter_is_read_as_a_macro(name):
    # An undefined macro in `#if` reads as 0 without a word from the compiler: a source that still
    # tested SPLITK or RASTER would silently take one branch for every value.
    code = _code(get_family(name).source)
    for p in LAUNCH_TIME:
        assert not re.search(rf"\b{p}\b", code), f"{name}'s source still names {p}"


def test_kernel_signature_is_the_one_every_source_and_the_launcher_use():
    import ctypes

    from kernels.runtime import _PARAM_TYPES
    from kernels.space import FAMILY_DIR, KERNEL_SIGNATURE

    macro = re.search(r"#define GEMM_ARGS(.*?)\n\n", (FAMILY_DIR / "common.cuh").read_text(), re.S).group(1)
    assert " ".join(macro.replace("\\", " ").split()) == " ".join(KERNEL_SIGNATURE.split())
    params = KERNEL_SIGNATURE.split(", ")
    assert len(params) == len(_PARAM_TYPES)
    for param, ctype in zip(params, _PARAM_TYPES):
        assert (ctype is ctypes.c_void_p) == ("*" in param), param
    assert params[-2:] == ["int splits", "int raster"]


def test_every_slice_count_offered_has_its_own_reduction_loop():
    # gemm_splitk_reduce unrolls a constant-count loop per count it knows; any other count
    # would still be right, through the slower runtime-bounded loop.
    from kernels.space import FAMILY_DIR

    known = {int(v) for v in re.findall(r"case (\d+): sum = sum_slices<\1>", (FAMILY_DIR / "common.cuh").read_text())}
    for name, fam in FAMILIES.items():
        for p in fam.params:
            if p.name == "SPLITK":
                assert set(p.values) - {1} <= known, (name, p.values, known)


def test_a_family_source_is_read_again_when_it_or_an_include_changes(tmp_path, monkeypatch):
    """The source and its hash are kept between calls (a tuner asks for them per candidate),
    never past an edit: an edited kernel must not be compiled under its old hash."""
    import os

    from kernels import space

    monkeypatch.setattr(space, "FAMILY_DIR", tmp_path)
    monkeypatch.setattr(space, "_SOURCES", {})
    (tmp_path / "k.cu").write_text('#include "h.cuh"\n__global__ void k() {}\n')
    (tmp_path / "h.cuh").write_text("#define A 1\n")
    text, first = space.expanded_source("k.cu")
    assert text == "#define A 1\n\n__global__ void k() {}\n"
    assert space.expanded_source("k.cu") == (text, first)  # kept
    (tmp_path / "h.cuh").write_text("#define A 2\n")
    stat = (tmp_path / "h.cuh").stat()
    os.utime(tmp_path / "h.cuh", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    text2, second = space.expanded_source("k.cu")
    assert "#define A 2" in text2 and second != first
