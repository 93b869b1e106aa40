"""A static prior for a study's first measurements: which accepted configs are likely fast.

Computed without a GPU and without any measurement, from what the tuner knows when it starts:
the family's launch geometry (``Family.launches``, ``tiles``), the problem's M, N, K, the GPU's
SM count and architecture limits (``kernels.occupancy``), and what ptxas reports when a config is
compiled (registers, spills; CPU work, cached, at most ``MAX_COMPILES`` per study).

The model is a rough throughput estimate with three mechanisms, none of them family-specific:

* filling the GPU: a block runs on one SM; the busiest SM runs ``ceil(blocks / SMs)`` blocks,
  at most ``blocks_per_sm`` (occupancy) at once, so a grid of 133 blocks on 132 SMs takes two
  rounds, and a grid smaller than the GPU leaves SMs idle (wave quantization);
* hiding latency: warps resident per SM (``LATENCY_WARPS`` of them give half the issue rate),
  and blocks resident per SM (one block alone stalls at each barrier; two overlap);
* reuse: outputs per thread ``q`` (FMAs per value loaded from shared memory, about ``√q`` per
  operand) and outputs per block tile (FMAs per value loaded from global memory/L2);
* staging: the depth of K a block holds in shared memory (dynamic shared memory over the tile's
  rows plus columns): every slice ends in barriers and a copy, which deeper slices amortize.

Configs that cannot be resident at all score zero, local arrays (kilobytes of spills) near
it; a few registers spilled where the launch bounds cap them cost little. It ranks
groups of configs the model cannot tell apart (same block tile, threads, split) only. Within a
group the warp layout (how a block's tile is split among warps and lanes) can still cost 40%
(registers past an occupancy step, shared-memory wavefronts), and the model cannot see it: the
start-up therefore measures a few members of each of the best groups, not one config of many.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import kernels
from kernels.occupancy import REGISTERS_BESIDE_OUTPUTS

from tuner.measure.resources import Resources, Usage, usage_of

log = logging.getLogger(__name__)

# Warps per SM at which latency hiding gives half the issue rate (4 schedulers per SM: one
# warp each leaves every stall exposed).
LATENCY_WARPS = 4.0
# Shared-memory loads per FMA: a thread computing q outputs loads about 2·√q operands per k step.
SMEM_LOADS_PER_OPERAND = 2.0
# Values per FMA from global memory/L2 at which that traffic halves the rate (bm·bn / (bm+bn)).
GLOBAL_REUSE_HALF = 8.0
# Depth of K staged in shared memory per block at which the per-slice barriers and copy halve
# the rate (without it the prior preferred 8-deep slices, which measure 0.6-0.85 of the best on
# warptile's full grid at 2048³: docs/search.md, "The static prior and the prior set-up").
STAGED_DEPTH_HALF = 4.0
# Spilled bytes (stores + loads per thread, as ptxas reports) that halve the rate. A few
# registers spilled at the launch bounds' cap cost nothing measurable in the recordings (within
# a geometry group, spilling up to 1 KB measures 0.97-1.17 of its clean members), a local array
# (15-22 KB) leaves 2-4 % of the best. 1024: the rank correlation of the prior with the
# recorded speeds, chosen leaving each recording out, on 19 of 20 (family, shape) recordings
# (512 on the other); 32 ranked blocktile1d's best at 2048³ (72 bytes) 277th of 284.
SPILL_HALF_BYTES = 1024.0
# Compiles (NVRTC, one CPU core each, cached on disk) the prior may spend per study.
MAX_COMPILES = 48
# Members of each of the best groups the start-up measures (a group's first measurement alone
# says little about its warp layouts: docs/search.md, "The static prior and the prior set-up").
PER_GROUP = 3


@dataclass(frozen=True)
class Target:
    """The GPU the study runs on, as far as the prior needs it."""

    sm_count: int
    arch: str



@dataclass(frozen=True)
class Geometry:
    blocks: int
    threads: int
    tile: tuple[int, int]  # output rows x columns of one block
    splits: int  # slices of K (grid z)
    shared_bytes: int  # dynamic shared memory per block

    @property
    def outputs_per_thread(self) -> float:
        return self.tile[0] * self.tile[1] / self.threads

    def key(self) -> tuple[int, ...]:
        """What the model reads of a config, apart from resources: configs with equal keys
        differ only in ways it cannot see (warp layout, padding, rasterization, …). Shared
        memory is part of it: a deeper K slice can cost a resident block."""
        return (*self.tile, self.threads, self.splits, self.shared_bytes)


def geometry(family: Any, config: Mapping[str, int], m: int, n: int, k: int) -> Geometry:
    main = family.main_launch(dict(config), m, n, k)
    blocks = main.grid[0] * main.grid[1] * main.grid[2]
    threads = main.block[0] * main.block[1] * main.block[2]
    rows, cols = family.tiles(dict(config), m, n)
    return Geometry(blocks, threads, (int(rows), int(cols)), main.grid[2], main.shared_bytes)


def estimated_usage(geom: Geometry, arch: str | None = None) -> Usage:
    """Registers without compiling: accumulators plus operands and addressing, about
    max(q + 64, 1.8·q) for q outputs per thread (ptxas' median on the tile families), capped
    at what ptxas may use: 255, or with ``arch`` what a block of ``geom.threads`` may hold
    there, as every family's ``__launch_bounds__`` holds ptxas to it (64 registers for 1024
    threads: uncapped, every 1024-thread config reads as one that cannot run), the
    accumulators past it spilled (as ``best_rate`` bounds them). The prior's ranking passes
    ``arch``; the cost model's features do not (capped, they moved the replay's rows of
    families whose configs were never near the cap)."""
    q = geom.outputs_per_thread
    cap = 255
    if arch is not None:
        try:
            cap = min(cap, kernels.max_registers(arch, geom.threads))
        except ValueError:  # an architecture without limits, or threads out of range
            pass
    return Usage(registers=min(cap, int(max(q + REGISTERS_BESIDE_OUTPUTS, 1.8 * q))),
                 spill_bytes=int(least_spill_bytes(q, cap)))


def rate(geom: Geometry, usage: Usage, target: Target, k: int) -> float:
    """Relative throughput (higher is faster; 0: cannot be resident on an SM). Only its order
    among configs of one problem means anything."""
    try:
        occ = kernels.occupancy(target.arch, geom.threads, usage.registers,
                                geom.shared_bytes + usage.shared_static_bytes)
    except ValueError:  # an architecture without limits, or threads out of range
        return 0.0
    return _rate_at(geom, occ.blocks_per_sm, usage.spill_bytes, target, k)


def least_spill_bytes(outputs_per_thread: float, registers: int) -> float:
    """Each thread keeps its q outputs in registers through the K loop: with fewer registers
    than that, ptxas spills at least 4·(q − r) bytes (true of every ok config in
    tuner/recordings)."""
    return max(0.0, 4.0 * (outputs_per_thread - registers))


def best_rate(geom: Geometry, target: Target, k: int) -> float:
    """An upper bound of ``rate`` over every usage ptxas could report for ``geom``, which lets
    the prior skip compiles that cannot change its ranking. Resources enter ``rate`` only through
    the blocks resident per SM and the spills. For each register count (in the allocation's
    steps of 8) the bound takes the least spill (``least_spill_bytes``) and the best of the block
    counts it allows (static shared memory can only lower them)."""
    q = geom.outputs_per_thread
    best = 0.0
    for registers in [*range(8, 256, 8), 255]:
        try:
            most = kernels.occupancy(target.arch, geom.threads, registers,
                                     geom.shared_bytes).blocks_per_sm
        except ValueError:
            return 0.0
        spill = least_spill_bytes(q, registers)
        best = max([best, *(_rate_at(geom, blocks, spill, target, k)
                            for blocks in range(1, most + 1))])
    return best


def _rate_at(geom: Geometry, blocks_per_sm: int, spill_bytes: float, target: Target, k: int
             ) -> float:
    if blocks_per_sm < 1 or geom.blocks < 1:
        return 0.0
    per_sm = math.ceil(geom.blocks / target.sm_count)  # blocks on the busiest SM
    resident = min(blocks_per_sm, per_sm)
    rounds = math.ceil(per_sm / resident)
    warps = resident * geom.threads / 32
    q = geom.outputs_per_thread
    bm, bn = geom.tile
    # a block waiting at a barrier issues nothing; another resident block fills that gap
    issue = warps / (warps + LATENCY_WARPS) * resident / (resident + 1)
    smem = q / (q + SMEM_LOADS_PER_OPERAND * math.sqrt(q))
    reuse = bm * bn / (bm + bn)
    glob = reuse / (reuse + GLOBAL_REUSE_HALF)
    depth = geom.shared_bytes / (4.0 * (bm + bn))  # 0: no dynamic shared memory, no term
    staging = depth / (depth + STAGED_DEPTH_HALF) if depth else 1.0
    spill = 1.0 / (1.0 + spill_bytes / SPILL_HALF_BYTES)
    # time on the busiest SM: rounds of `resident` blocks, each block's work bm·bn·K/splits
    work = rounds * resident * bm * bn * (k / geom.splits)
    return issue * smem * glob * staging * spill / work


def compiled_usage(family: Any, arch: str, cache_dir: Any = None) -> Resources:
    """Usage from NVRTC's ptxas report (through the CUBIN cache); None where it cannot compile."""

    def usage(config: Mapping[str, int]) -> Usage | None:
        try:
            compiled = kernels.compile_config(family, dict(config), arch, cache_dir=cache_dir)
        except (kernels.CompileError, kernels.ConfigError, ImportError, OSError, RuntimeError):
            return None
        return usage_of(compiled.main)

    return usage


@dataclass
class Ranking:
    """What ``startup_configs`` did, for the log."""

    groups: int = 0
    compiled: int = 0
    compile_seconds: float = 0.0


Groups = dict[tuple[int, ...], tuple[Geometry, list[dict[str, int]]]]


def group_configs(family: Any, accepted: Sequence[Mapping[str, int]], m: int, n: int, k: int,
                  geometries: Sequence[Geometry] | None = None) -> Groups:
    """The accepted configs grouped by what the model reads (``Geometry.key``); ``geometries``:
    each config's, where the caller has them already."""
    if geometries is None:
        geometries = [geometry(family, config, m, n, k) for config in accepted]
    groups: Groups = {}
    for config, geom in zip(accepted, geometries):
        groups.setdefault(geom.key(), (geom, []))[1].append(dict(config))
    return groups


def startup_configs(family: Any, accepted: Sequence[Mapping[str, int]], m: int, n: int, k: int,
                    target: Target, count: int, seed: int | None,
                    resources: Resources | None = None, max_compiles: int = MAX_COMPILES,
                    ranking: Ranking | None = None, per_group: int = PER_GROUP,
                    groups: Groups | None = None, workers: int | None = None
                    ) -> list[dict[str, int]]:
    """``count`` accepted configs to measure first: groups (``group_configs``) are ranked by the
    estimate (registers estimated), the best ones are compiled (one seeded pick per group, at
    most ``max_compiles``, fewer where the rest cannot matter: ``best_rate``) and ranked again
    by their real registers and spills; the start-up is
    then the best groups in order, ``per_group`` configs of each (the compiled pick first, the
    others seeded draws from the group). ``groups``: ``group_configs`` of ``accepted``, where
    the caller has it already. ``workers``: compile threads (default: one per core)."""
    rng = random.Random(seed)
    ranking = ranking if ranking is not None else Ranking()
    groups = groups if groups is not None else group_configs(family, accepted, m, n, k)
    ranking.groups = len(groups)
    picks = {key: rng.choice(members) for key, (_, members) in groups.items()}
    scored = {key: rate(geom, estimated_usage(geom, target.arch), target, k)
              for key, (geom, _) in groups.items()}
    position = {key: index for index, key in enumerate(scored)}  # ties: the groups' order
    if resources is not None:
        started = time.perf_counter()
        top = sorted(scored, key=scored.__getitem__, reverse=True)[:max_compiles]
        bound = {key: best_rate(groups[key][0], target, k) for key in top}
        # NVRTC runs outside the GIL for the most part: threads spread the compiles over the
        # cores, in the estimate's order. Compiling stops once no group left could rank among
        # the chosen whatever ptxas reports for it: the start-up is then exactly the one of
        # compiling all of them (tested; where the estimate is exact, warptile and pipelined
        # at 2048³ stop after 16 of 48). Compiles already running finish unawaited.
        threads = max(1, workers or os.cpu_count() or 1)
        pool = ThreadPoolExecutor(max_workers=max(1, min(len(top), threads)))
        try:
            jobs = {pool.submit(resources, picks[key]): key for key in top}
            left = set(top)
            # the groups not compiled keep their estimate: the best ``count`` of them (each
            # group gives one config at least) are all that can join the start-up
            fixed = _ranked(scored, (key for key in scored if key not in left), position)[:count]
            for job in as_completed(jobs):
                key = jobs[job]
                usage = job.result()
                left.discard(key)
                ranking.compiled += 1
                scored[key] = 0.0 if usage is None else rate(groups[key][0], usage, target, k)
                last = _last_chosen(scored, groups, count, per_group,
                                    [*fixed, *(other for other in top if other not in left)],
                                    position)
                if last is not None and all(bound[other] < last for other in left):
                    break
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        ranking.compile_seconds = time.perf_counter() - started
    chosen: list[dict[str, int]] = []
    for key in _ranked(scored, scored, position):
        others = [c for c in groups[key][1] if c is not picks[key]]
        chosen += [picks[key], *rng.sample(others, min(len(others), per_group - 1))]
        if len(chosen) >= count:
            break
    return chosen[:count]


def _ranked(scored: Mapping[tuple[int, ...], float], keys: Iterable[tuple[int, ...]],
            position: Mapping[tuple[int, ...], int]) -> list[tuple[int, ...]]:
    """Those of ``keys`` that can run, best first (ties in the groups' order: ``position``)."""
    return sorted((key for key in keys if scored[key] > 0),
                  key=lambda key: (-scored[key], position[key]))


def _last_chosen(scored: Mapping[tuple[int, ...], float], groups: Groups, count: int,
                 per_group: int, keys: Iterable[tuple[int, ...]],
                 position: Mapping[tuple[int, ...], int]) -> float | None:
    """The score of the last group the start-up takes from ``keys`` alone; None where they do
    not fill it."""
    taken = 0
    for key in _ranked(scored, keys, position):
        taken += min(len(groups[key][1]), per_group)
        if taken >= count:
            return scored[key]
    return None
