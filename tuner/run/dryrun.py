"""``--dry-run``: compile a seeded sample of accepted configs per family and report what each
uses (registers, shared memory, spills) and the occupancy that follows. No GPU, no database."""

from __future__ import annotations

import random
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TextIO

from tuner.measure.live import CompilePool, _Compiled
from tuner.measure.resources import summarize
from tuner.problem import Problem
from tuner.report import config_text, format_table

# Rejection sampling tries per wanted config before a family is taken as (nearly) exhausted.
_TRIES_PER_CONFIG = 500


def sample_accepted(family: Any, count: int, seed: int | None, arch: str) -> list[dict[str, int]]:
    """Up to ``count`` distinct configs the family's constraints accept, drawn with ``seed``."""
    rng = random.Random(seed)
    chosen: list[dict[str, int]] = []
    for _ in range(count * _TRIES_PER_CONFIG):
        if len(chosen) == count:
            break
        config = {param.name: rng.choice(sorted(param.values)) for param in family.params}
        if config not in chosen and not family.reject_reasons(config, arch):
            chosen.append(config)
    return chosen


def dry_run(
    families: list[Any],
    problem: Problem,
    *,
    arch: str,
    cache_dir: Path | str | None,
    count: int,
    seed: int | None,
    workers: int,
    out: TextIO,
) -> bool:
    """Prints one table per family; returns whether every chosen config compiled."""
    pool = CompilePool(arch, cache_dir, workers)
    try:
        jobs: list[tuple[Any, dict[str, int], Future[_Compiled]]] = [
            (family, config, pool.submit(family, config))
            for family in families
            for config in sample_accepted(family, count, seed, arch)
        ]
        all_compiled = True
        for family in families:
            rows = []
            for job_family, config, future in jobs:
                if job_family is not family:
                    continue
                compiled = future.result()
                if compiled.cubin is None:
                    all_compiled = False
                    first_line = (compiled.error or "").strip().splitlines()[:1]
                    rows.append([config_text(config), "compile error", "", "", "",
                                 first_line[0][:80] if first_line else ""])
                    continue
                used = summarize(family, config, problem, compiled.resources, arch)
                rows.append([config_text(config), used.registers, used.shared_bytes,
                             used.spill_bytes, f"{used.occupancy:.2f}", used.limiter])
            print(f"\n{family.name} (source {family.source_hash[:12]}, {arch}, "
                  f"launch geometry for {problem.shape})", file=out)
            if rows:
                print(format_table(["config", "registers", "shared B", "spill B", "occupancy",
                                    "limited by"], rows), file=out)
            elif not family.offered_on(arch):
                print(f"  none on {arch}: it runs only on {', '.join(family.architectures)} "
                      f"({family.architecture_reason})", file=out)
            else:
                print("  no accepted config found", file=out)
        return all_compiled
    finally:
        pool.close()
