"""Where a new study starts: the best configs already known for nearby problems."""

from __future__ import annotations

import logging
from typing import Any

import db

from tuner.problem import Problem
from tuner.search import space

log = logging.getLogger(__name__)

NEAREST_PROBLEMS = 3
MAX_WARM_START = 6


def warm_start(
    database: Any, gpu_name: str, family: Any, problem: Problem, arch: str,
    limit: int = MAX_WARM_START
) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """Two lists: the best measured at this very problem on this GPU model (an older source of
    the family; a pack's entry), which a study asks before anything else; then the family's
    best configs for the other nearest tuned problems on this GPU model (closest first), for the
    same problem on other GPU models (at most ``limit`` in all, the first list's included), and
    the family's declared ``starting_points``. Only configs the family still accepts on this
    GPU's ``arch`` (another model's best may need more shared memory than it has), each once."""
    shape = {"dtype": problem.dtype, "layout": problem.layout,
             "general_alpha_beta": problem.general_alpha_beta}
    found: list[dict[str, int]] = []

    def consider(result: Any) -> None:
        if result is None:
            return
        config = family.completed(result.params)  # stored before a parameter was added: as it ran
        if config in found or not space.representable(family, config) \
                or family.refusals(config, arch):
            return
        found.append(config)

    try:
        nearest = database.nearest_problems(
            gpu_name, problem.m, problem.n, problem.k, limit=NEAREST_PROBLEMS, **shape
        )
    except db.UnknownGpuError:
        nearest = []  # first run on this GPU model
    same = 0  # how many of ``found`` were measured at this very problem
    for near in nearest:
        p = near.problem
        consider(database.best(gpu_name, p.m, p.n, p.k, family=family.name, nearest=False, **shape))
        if (p.m, p.n, p.k) == (problem.m, problem.n, problem.k):
            same = len(found)

    for other in sorted({gpu.name for gpu in database.list_gpus()} - {gpu_name}):
        consider(database.best(other, problem.m, problem.n, problem.k, family=family.name,
                               nearest=False, **shape))
    found = found[:limit]
    for config in family.starting_points:  # the family's own measured-good configs come last
        consider(_Known(config))
    return found[:same], found[same:]


class _Known:
    """A declared starting point, shaped like a stored result for ``consider``."""

    def __init__(self, params: dict[str, int]) -> None:
        self.params = params
