"""The static prior for the default sampler's start-up (tuner/search/prior.py): its mechanisms on
hand-made geometries, its start-up picks on a real H100 recording, and that the sampler
measures them first."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path

import kernels
import optuna
import pytest

from tuner.measure.replay import ReplayEvaluator
from tuner.problem import Problem, config_key
from tuner.search import prior, space
from tuner.search.samplers import STARTUP_TRIALS, SearchSpace, make_sampler
from tuner.search.study import _accepted_configs
from tuner.measure.recording import BUNDLED_RECORDINGS

H100 = prior.Target(sm_count=132, arch="sm_90")
RECORDING = BUNDLED_RECORDINGS / "h100-warptile+vectorized-2048x2048x2048+1024x1024x1024.json.gz"


def _geom(blocks: int, threads: int = 128, tile: tuple[int, int] = (64, 64)) -> prior.Geometry:
    return prior.Geometry(blocks=blocks, threads=threads, tile=tile, splits=1, shared_bytes=8192)


def test_wave_quantization_one_block_too_many_costs_a_round():
    usage = prior.Usage(registers=128)  # 4 blocks of 128 threads per SM
    full = prior.rate(_geom(132 * 4), usage, H100, k=1024)
    one_more = prior.rate(_geom(132 * 4 + 1), usage, H100, k=1024)
    assert one_more < 0.6 * full  # 529 blocks: a second round for one block


def test_local_arrays_and_unlaunchable_configs_rank_low_a_few_spills_barely():
    geom = _geom(1024)
    clean = prior.rate(geom, prior.Usage(registers=128), H100, k=1024)
    assert prior.rate(geom, prior.Usage(registers=128, spill_bytes=16384), H100, k=1024) < clean / 10
    assert prior.rate(geom, prior.Usage(registers=128, spill_bytes=72), H100, k=1024) > 0.9 * clean
    # 255 registers x 512 threads exceed the register file: not even one block fits an SM
    assert prior.rate(_geom(64, threads=512), prior.Usage(registers=255), H100, k=1024) == 0.0


def test_the_prior_reads_registers_as_capped_by_the_launch_bounds(tmp_path):
    """Every family declares ``__launch_bounds__(threads)``, so ptxas holds a 1024-thread
    block to 64 registers: the prior's estimate is capped there (uncapped, every such config
    read as one that cannot run, and blocktile1d's best at 2048³ is one)."""
    assert [kernels.max_registers("sm_90", t) for t in (1024, 768, 512, 256)] == [64, 80, 128, 255]
    family = kernels.get_family("blocktile1d")
    config = {"BM": 128, "BN": 128, "BK": 64, "TM": 16}
    geom = prior.geometry(family, config, 2048, 2048, 2048)
    assert geom.threads == 1024
    compiled = kernels.compile_config(family, config, "sm_90", cache_dir=str(tmp_path))
    assert compiled.main.registers <= kernels.max_registers("sm_90", 1024)
    assert prior.estimated_usage(geom).registers > 64  # the cost model's feature, uncapped
    assert prior.rate(geom, prior.estimated_usage(geom), H100, 2048) == 0.0
    capped = prior.estimated_usage(geom, H100.arch)
    assert capped.registers == 64 and capped.spill_bytes == 0  # 16 accumulators fit in 64
    assert prior.rate(geom, capped, H100, 2048) > 0.0


def test_blocktile1d_best_ranks_high_though_it_spills_at_the_cap():
    """blocktile1d's best at 2048³ (1024 threads held to 64 registers) spills 72 bytes and
    measures 1.09× the next config: read with the recorded resources, the prior ranks it among
    the first tenth of the 284 (with spills halving the rate at 32 bytes it ranked 277th)."""
    problem = Problem(2048, 2048, 2048)
    replay = ReplayEvaluator.open(BUNDLED_RECORDINGS / "h100-blocktile1d-2048x2048x2048.json.gz")
    family = replay.family(kernels.get_family("blocktile1d"))
    usage = replay.compiled_usage(family, problem)
    recorded = [(config, result) for config, result in replay.recording.results("blocktile1d", problem)
                if result.usable]
    best, _ = replay.recording.optimum("blocktile1d", problem)
    assert recorded[[c for c, _ in recorded].index(best)][1].spill_bytes > 0

    def score(config: dict[str, int]) -> float:
        return prior.rate(prior.geometry(family, config, 2048, 2048, 2048), usage(config), H100,
                          2048)

    ranked = sorted((c for c, _ in recorded), key=score, reverse=True)
    assert ranked.index(best) < len(recorded) // 10


def test_more_outputs_per_thread_rank_higher_when_the_gpu_stays_full():
    usage = prior.Usage(registers=96)
    small = prior.rate(_geom(4096, tile=(32, 32), threads=64), usage, H100, k=1024)
    large = prior.rate(_geom(1024, tile=(64, 64), threads=64), usage, H100, k=1024)
    assert large > small  # same warps, 4x the reuse per value loaded


def test_a_deeper_k_slice_per_barrier_ranks_higher():
    usage = prior.Usage(registers=96)
    shallow = prior.Geometry(blocks=1024, threads=128, tile=(64, 64), splits=1,
                             shared_bytes=4 * 8 * 128)  # 8 k-steps between barriers
    deep = prior.Geometry(blocks=1024, threads=128, tile=(64, 64), splits=1,
                          shared_bytes=4 * 32 * 128)  # 32: still 4 blocks per SM
    assert prior.rate(deep, usage, H100, k=1024) > 1.2 * prior.rate(shallow, usage, H100, k=1024)


def _recorded(problem: Problem):
    replay = ReplayEvaluator.open(RECORDING)
    family = replay.family(kernels.get_family("warptile"))
    return replay, family, _accepted_configs(family, "sm_90")


@pytest.mark.parametrize("shape,compiles", [((2048, 2048, 2048), 10), ((1024, 1024, 1024), 0)])
def test_startup_on_the_h100_recording_beats_uniform_picks(shape, compiles):
    """At 2048³ registers decide how many blocks fit an SM (128 vs 129 per thread: 4 or 3), so
    the prior needs NVRTC's report there (a few compiles, CPU: here the recorded report, of the
    source that was timed); at 1024³ filling the 132 SMs dominates and estimated registers suffice."""
    problem = Problem(*shape)
    replay, family, accepted = _recorded(problem)
    recording = replay.recording
    _, optimum = recording.optimum("warptile", problem)
    fraction = {config_key(c): recording.result("warptile", problem, c).gflops / optimum
                for c in accepted}
    resources = replay.compiled_usage(family, problem) if compiles else None
    picked = []
    for seed in range(2 if compiles else 5):
        configs = prior.startup_configs(family, accepted, *shape, H100, STARTUP_TRIALS, seed,
                                        resources, max_compiles=compiles)
        assert len(configs) == STARTUP_TRIALS
        keys = [prior.geometry(family, c, *shape).key() for c in configs]
        # the best groups in turn, a few members of each (distinct configs)
        assert all(keys.count(key) <= prior.PER_GROUP for key in keys)
        assert keys == sorted(keys, key=keys.index) and len(set(keys)) < len(keys)
        assert len({config_key(c) for c in configs}) == len(configs)
        assert all(family.accepts(c) for c in configs)
        picked += [fraction[config_key(c)] for c in configs]
    assert statistics.mean(picked) > statistics.mean(fraction.values()) + 0.08


def test_startup_is_seeded_and_compiles_at_most_the_bound():
    problem = Problem(2048, 2048, 2048)
    _, family, accepted = _recorded(problem)
    asked: list[dict[str, int]] = []

    def usage(config):
        asked.append(dict(config))
        return prior.Usage(registers=128)

    ranking = prior.Ranking()
    first = prior.startup_configs(family, accepted, 2048, 2048, 2048, H100, 6, seed=3,
                                  resources=usage, max_compiles=5, ranking=ranking, workers=5)
    assert ranking.compiled <= len(asked) <= 5 and ranking.groups > 5
    assert first == prior.startup_configs(family, accepted, 2048, 2048, 2048, H100, 6, seed=3,
                                          resources=usage, max_compiles=5)
    # a config that does not compile is never picked
    failing = {config_key(c) for c in asked}
    again = prior.startup_configs(
        family, accepted, 2048, 2048, 2048, H100, 6, seed=3, max_compiles=5,
        resources=lambda c: None if config_key(c) in failing else prior.Usage(128))
    assert not failing & {config_key(c) for c in again}


def test_the_compiles_in_parallel_rank_as_one_at_a_time(tmp_path):
    """NVRTC runs outside the GIL: the prior compiles on every core, with the same ranking."""
    family = kernels.get_family("blocktile1d")
    accepted = _accepted_configs(family, "sm_90")
    ranked = {}
    for workers in (1, 4):
        ranking = prior.Ranking()
        ranked[workers] = prior.startup_configs(
            family, accepted, 256, 256, 256, H100, 6, seed=5, max_compiles=4, ranking=ranking,
            resources=prior.compiled_usage(family, "sm_90", tmp_path / str(workers)),
            workers=workers)
        assert 1 <= ranking.compiled <= 4
    assert ranked[1] == ranked[4] and len(ranked[1]) == 6


def test_best_rate_bounds_the_rate_of_every_usage():
    """What lets the prior stop compiling: no ptxas report can rank a group above its bound
    (reports where fewer registers than outputs per thread spill those outputs, as ptxas does)."""
    rng = random.Random(0)
    for _ in range(300):
        tile = (rng.choice([16, 32, 64, 128, 256]), rng.choice([16, 32, 64, 128, 256]))
        geom = prior.Geometry(blocks=rng.randint(1, 5000), threads=32 * rng.randint(1, 32),
                              tile=tile, splits=rng.choice([1, 2, 4]),
                              shared_bytes=rng.choice([0, 4096, 16384, 65536]))
        usage = _physical(geom, rng)
        assert prior.rate(geom, usage, H100, k=2048) <= prior.best_rate(geom, H100, k=2048)


def _physical(geom: prior.Geometry, rng: random.Random) -> prior.Usage:
    """A usage ptxas could report: any registers; below the outputs per thread, those spill."""
    registers = rng.randint(16, 255)
    spill = max(rng.choice([0, 0, 0, 96]), 4 * (geom.outputs_per_thread - registers))
    return prior.Usage(registers, rng.choice([0, 0, 2048]), int(math.ceil(spill)))


# warptile's start-up at 2048³ compiled half the bound before blocked sums narrowed its space
# (124 groups now, whose estimates do not settle early: every compile of the bound is spent)
@pytest.mark.parametrize("name,shape,saves", [("warptile", (2048, 2048, 2048), False),
                                              ("pipelined", (2048, 2048, 2048), True),
                                              ("blocktile2d", (4096, 4096, 4096), False)])
def test_compiling_fewer_groups_picks_exactly_what_compiling_all_would(name, shape, saves):
    """Rounds of one compile (workers=1) stop as soon as the groups left cannot matter; one
    round of all of them is what the prior did before. Usages: the estimate itself (at 2048³
    the first groups then settle the start-up), and seeded random ones (registers either side of
    the estimate, spills, failures: any group may rise or fall)."""
    family = kernels.get_family(name)
    accepted = _accepted_configs(family, "sm_90")
    geometry = lambda c: prior.geometry(family, c, *shape)  # noqa: E731

    def drawn(seed):
        def usage(config):
            rng = random.Random(f"{seed}{sorted(config.items())}")
            return None if rng.random() < 0.1 else _physical(geometry(config), rng)
        return usage

    saved = []
    for resources in [lambda c: prior.estimated_usage(geometry(c)), *map(drawn, range(4))]:
        ranking = prior.Ranking()
        lazily = prior.startup_configs(family, accepted, *shape, H100, 21, 7, resources,
                                       ranking=ranking, workers=1)
        assert lazily == _compiling_all(family, accepted, shape, resources) and len(lazily) == 21
        saved.append(min(prior.MAX_COMPILES, ranking.groups) - ranking.compiled)
    assert (saved[0] >= prior.MAX_COMPILES // 2) == saves


def _compiling_all(family, accepted, shape, resources, count=21, seed=7):
    """The prior as it was: the estimate's best MAX_COMPILES groups all compiled, then ranked
    (the same seeded draws: a pick per group, then the others of each chosen group)."""
    rng = random.Random(seed)
    groups = prior.group_configs(family, accepted, *shape)
    picks = {key: rng.choice(members) for key, (_, members) in groups.items()}
    scored = {key: prior.rate(geom, prior.estimated_usage(geom), H100, shape[2])
              for key, (geom, _) in groups.items()}
    for key in sorted(scored, key=scored.__getitem__, reverse=True)[:prior.MAX_COMPILES]:
        usage = resources(picks[key])
        scored[key] = 0.0 if usage is None else prior.rate(groups[key][0], usage, H100, shape[2])
    chosen = []
    for key in sorted((key for key in scored if scored[key] > 0), key=scored.__getitem__,
                      reverse=True):
        others = [c for c in groups[key][1] if c is not picks[key]]
        chosen += [picks[key], *rng.sample(others, min(len(others), prior.PER_GROUP - 1))]
        if len(chosen) >= count:
            break
    return chosen[:count]


def test_the_default_sampler_measures_the_startup_first_then_its_model():
    naive = kernels.get_family("naive")
    accepted = naive.accepted_configs()
    chosen = accepted[-3:]
    search_space = SearchSpace(space.distributions(naive), space.feasibility(naive, "sm_90"),
                               [space.params_from_config(naive, c) for c in chosen])
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler("prior", 0, search_space))
    asked = []
    for number in range(STARTUP_TRIALS + 2):
        trial = study.ask(search_space.distributions)
        asked.append(space.config_from_params(naive, trial.params))
        trial.set_user_attr("state", "ok")
        study.tell(trial, float(number))
    assert asked[:3] == chosen  # the prior's picks, in order, then uniform accepted ones
    assert len({config_key(c) for c in asked}) == len(asked)


def test_a_replay_gives_the_prior_the_recorded_resources():
    """Replayed, the prior reads registers and spills from the recording (the compiler that
    built the recorded kernels), not from a local NVRTC of another version."""
    problem = Problem(2048, 2048, 2048)
    replay = ReplayEvaluator.open(RECORDING)
    family = replay.family(kernels.get_family("warptile"))
    usage = replay.compiled_usage(family, problem)
    for config, result in list(replay.recording.results("warptile", problem))[:20]:
        dynamic = family.main_launch(dict(config), 2048, 2048, 2048).shared_bytes
        assert usage(config) == prior.Usage(result.registers, result.shared_bytes - dynamic,
                                            result.spill_bytes)
    absent = {**config, "BM": 256, "BN": 256, "WM": 16}  # rejected: never recorded
    assert usage(absent) is None


BLOCKED = (Path(__file__).resolve().parents[1] / "bench" / "data"
           / "h200-pipelined-blocked-2048x2048x2048+1023x1025x999+4096x1024x4096.json.gz")


def test_on_the_blocked_kernel_the_estimate_of_one_register_per_output_picks_better(monkeypatch):
    """Blocked sums keep two registers per output in the FFMA ladder (docs/kernels.md, "Blocked
    sums over K"), yet on a recording of that pipelined kernel (H200, 2048³, 183 configs) the
    prior's start-up with its estimate of one register per output picks faster configs (0.889
    of the optimum on average) than the same estimate counting two (0.779), and than uniform
    picks (0.850): its occupancy term would reject the 64-output tiles that measure fastest."""
    problem = Problem(2048, 2048, 2048)
    replay = ReplayEvaluator.open(BLOCKED)
    family = replay.family(kernels.get_family("pipelined"))
    accepted = _accepted_configs(family, "sm_90")
    _, optimum = replay.recording.optimum("pipelined", problem)
    fraction = {config_key(c): r.gflops / optimum for c, r in replay.recording.results("pipelined", problem)
                if r.usable}
    one = prior.estimated_usage

    def mean_pick() -> float:
        return statistics.mean(fraction.get(config_key(c), 0.0) for seed in range(5)
                               for c in prior.startup_configs(family, accepted, problem.m, problem.n, problem.k, H100,
                                                              STARTUP_TRIALS, seed, max_compiles=0))

    def two(geom, arch=None):
        return one(dataclasses.replace(geom, tile=(geom.tile[0], 2 * geom.tile[1])), arch)

    as_is = mean_pick()
    monkeypatch.setattr(prior, "estimated_usage", two)
    doubled = mean_pick()
    uniform = statistics.mean(fraction.get(config_key(c), 0.0) for c in accepted)
    assert as_is > uniform + 0.03 and as_is > doubled + 0.05, (as_is, doubled, uniform)
