"""NVRTC compiles of every family (no GPU needed), the ptxas report and the CUBIN cache."""
import multiprocessing
import random
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from kernels import FAMILIES, CompileError, ConfigError, compile_config, get_family
from kernels.compiler import compile_program, parse_ptxas_report
from kernels.families.smem import SharedMemory

# A fresh random sample each run (the seed is new every time), so CI covers the spaces over its
# runs; 6 per family and architecture keeps this file near a minute on a 2-core CI machine.
SAMPLES_PER_FAMILY = 6


def _compile(job):
    name, config, arch, cache = job
    ck = compile_config(get_family(name), config, arch, cache_dir=cache)
    return ck.main, ck.arch, len(ck.cubin)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_family_compiles_a_random_sample(arch, tmp_path):
    seed = random.randrange(1 << 30)
    jobs = [(name, c, arch, str(tmp_path)) for name, fam in FAMILIES.items()
            for c in fam.sample_accepted(SAMPLES_PER_FAMILY, seed=seed, arch=arch)]
    offered = [f for f in FAMILIES.values() if f.offered_on(arch)]
    assert len(jobs) >= SAMPLES_PER_FAMILY * len(offered) - (SAMPLES_PER_FAMILY - 3)  # smem has only 3 configs
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for (name, config, _, _), (main, got_arch, size) in zip(jobs, pool.map(_compile, jobs)):
            assert got_arch == arch and size > 0
            assert main.registers > 0, (name, config)


def test_ptxas_report_is_parsed():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_90'
ptxas info    : Function properties for gemm
ptxas         .     40 bytes stack frame, 36 bytes spill stores, 32 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem
ptxas info    : Compiling entry function 'gemm_splitk_reduce' for 'sm_90'
ptxas info    : Function properties for gemm_splitk_reduce
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 22 registers"""
    r = parse_ptxas_report(log)
    assert r["gemm"].registers == 255 and r["gemm"].shared_static_bytes == 2048
    assert (r["gemm"].spill_store_bytes, r["gemm"].spill_load_bytes, r["gemm"].stack_bytes) == (36, 32, 40)
    assert r["gemm_splitk_reduce"].registers == 22 and r["gemm_splitk_reduce"].shared_static_bytes == 0


def test_report_comes_from_a_real_compile(tmp_path):
    ck = compile_config(get_family("smem"), {"TILE": 16}, "sm_90", cache_dir=tmp_path)
    assert ck.main.shared_static_bytes == 2 * 16 * 16 * 4
    assert "Used" in ck.log


def test_cache_hits_and_invalidates(tmp_path):
    fam = get_family("smem")
    first = compile_config(fam, {"TILE": 16}, "sm_90", cache_dir=tmp_path)
    again = compile_config(fam, {"TILE": 16}, "sm_90", cache_dir=tmp_path)
    assert (first.cached, again.cached) == (False, True)
    assert again.cubin == first.cubin and again.resources == first.resources
    assert not compile_config(fam, {"TILE": 32}, "sm_90", cache_dir=tmp_path).cached   # other params
    assert not compile_config(fam, {"TILE": 16}, "sm_80", cache_dir=tmp_path).cached   # other arch

    class Edited(SharedMemory):  # same family, edited source: never the stale binary
        @property
        def source(self):
            return super().source.replace("acc += As[ty][kk] * Bs[kk][tx];", "acc = fmaf(As[ty][kk], Bs[kk][tx], acc);")

    edited = compile_config(Edited(), {"TILE": 16}, "sm_90", cache_dir=tmp_path)
    assert not edited.cached and Edited().source_hash != fam.source_hash

    for f in tmp_path.glob("*.json"):  # a damaged entry is rebuilt, not trusted
        f.write_text("{not json")
    assert not compile_config(fam, {"TILE": 16}, "sm_90", cache_dir=tmp_path).cached


def test_a_cache_lookup_never_compiles(tmp_path):
    from kernels.compiler import cached_config

    fam = get_family("smem")
    assert cached_config(fam, {"TILE": 16}, "sm_90", tmp_path) is None
    assert not list(tmp_path.iterdir())  # nothing compiled, nothing written
    built = compile_config(fam, {"TILE": 16}, "sm_90", cache_dir=tmp_path)
    found = cached_config(fam, {"TILE": 16}, "sm_90", tmp_path)
    assert found is not None and found.cached and found.cubin == built.cubin
    assert found.resources == built.resources
    assert cached_config(fam, {"TILE": 16}, "sm_80", tmp_path) is None  # another target
    with pytest.raises(ConfigError):
        cached_config(fam, {"TILE": 7}, "sm_90", tmp_path)


def test_rejected_config_is_not_compiled(tmp_path):
    fam = get_family("vectorized")
    config = dict(BM=64, BN=64, BK=16, TM=16, TN=16, PADA=0, PADB=0, RASTER=1)
    with pytest.raises(ConfigError, match="2 x accumulators per thread \\(TM\\*TN\\)"):
        compile_config(fam, config, "sm_90", cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_compile_error_carries_the_log():
    with pytest.raises(CompileError) as e:
        compile_program('extern "C" __global__ void gemm() { undefined_thing(); }', "sm_90")
    assert "undefined_thing" in e.value.log


def _compile_smem_16(cache_dir: str) -> bool:
    """In a separate process: whether this process compiled (False: the cache had it)."""
    return not compile_config(get_family("smem"), {"TILE": 16}, "sm_90", cache_dir=cache_dir).cached


def test_processes_sharing_a_cache_compile_an_entry_once(tmp_path):
    """Two tuners' compile pools on one host ask for the same config at once: one compiles, the
    other waits for its CUBIN. The test holds the entry's lock until both have asked."""
    from kernels.compiler import _entry, compiling

    fam = get_family("smem")
    _, _, cubin_path, _ = _entry(fam, {"TILE": 16}, "sm_90", tmp_path)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        with compiling(cubin_path):
            asked = [pool.apply_async(_compile_smem_16, (str(tmp_path),)) for _ in range(2)]
            time.sleep(3)  # both workers spawned and blocked on the lock we hold
            assert not any(a.ready() for a in asked), "a compile went ahead past the lock"
        compiled = sorted(a.get(timeout=120) for a in asked)
    assert compiled == [False, True], "exactly one process compiled"


def test_configs_differing_only_in_launch_time_parameters_share_a_cubin_key():
    from kernels.compiler import cubin_key
    from kernels.space import enumerate_accepted

    splitk = get_family("splitk")
    accepted = enumerate_accepted(splitk, "sm_90")
    config = next(accepted)
    variants = [dict(config, SPLITK=s, RASTER=r) for s in (2, 32) for r in (1, 8)]
    assert len({cubin_key(splitk, v) for v in variants}) == 1
    other = next(c for c in accepted if c["STAGES"] != config["STAGES"])  # compiled in
    assert cubin_key(splitk, other) != cubin_key(splitk, config)
    with pytest.raises(ConfigError):
        cubin_key(splitk, dict(config, BM=3))


def _compile_kinds(job):
    """In a separate process: the registers of one config's batched and bias programs (the plain
    one the random sample above compiles)."""
    name, config, arch, layout, cache = job
    fam = get_family(name)
    return [compile_config(fam, config, arch, cache_dir=cache, layout=layout, batch=batch, bias=bias).main.registers
            for batch, bias in ((2, False), (1, True), (2, True))]


def test_batches_and_the_bias_are_separate_programs(tmp_path):
    """A batch and the bias epilogue are compiled in (BATCHED, BIAS), so a single GEMM without a
    bias keeps the program it had before either existed; every kind compiles in some layout."""
    from kernels import LAYOUTS

    smem = get_family("smem")
    single = smem.program({"TILE": 16})
    assert "BATCHED" not in single.split("// Shared by every family")[0]
    assert "#define BATCHED 1" in smem.program({"TILE": 16}, "nn", 2)
    assert "#define BIAS 1" in smem.program({"TILE": 16}, "nn", 1, True)
    kinds = {smem.program({"TILE": 16}, layout, batch, bias)
             for layout in LAYOUTS for batch in (1, 2) for bias in (False, True)}
    assert len(kinds) == 16

    jobs = []
    for i, (name, fam) in enumerate(sorted(FAMILIES.items())):
        arch = "sm_90" if fam.offered_on("sm_90") else "sm_80"
        config = fam.first_config(arch, seed=1)
        jobs.append((name, config, arch, LAYOUTS[i % len(LAYOUTS)], str(tmp_path)))
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for job, registers in zip(jobs, pool.map(_compile_kinds, jobs)):
            assert all(r > 0 for r in registers), (job[0], registers)
    assert len(list(tmp_path.glob("*.cubin"))) == 3 * len(jobs)
