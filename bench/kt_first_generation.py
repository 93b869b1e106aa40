"""Kernel Tuner's diff_evo with its first generation evaluated in a shuffled order.

Kernel Tuner 1.5's diff_evo starts from a Latin hypercube sample of configs
(``Searchspace.get_LHS_sample_indices``), which it returns as ``list(set(indices))``: for small
ints that is an order by hash slot (the index modulo the set's table size), not a random one,
so some configs come first whatever the seed. This runs ``bench/search_efficiency.py``
unchanged with that list shuffled (seeded; the same configs), to see how much of a strategy's
count is that order (bench/NOTES.md, session 39).

    python bench/kt_first_generation.py shuffled|as-shipped <search_efficiency.py arguments>
"""

from __future__ import annotations

import random
import runpy
import sys
from pathlib import Path

import kernel_tuner.searchspace as searchspace

_as_shipped = searchspace.Searchspace.get_LHS_sample_indices


def _shuffled(self: searchspace.Searchspace, num_samples: int) -> list[int]:
    indices = list(_as_shipped(self, num_samples))
    random.Random(len(indices) * 7919 + indices[0]).shuffle(indices)
    return indices


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("shuffled", "as-shipped"):
        sys.exit(__doc__)
    if sys.argv[1] == "shuffled":
        searchspace.Searchspace.get_LHS_sample_indices = _shuffled  # type: ignore[method-assign]
    sys.argv = ["search_efficiency.py", *sys.argv[2:]]
    runpy.run_path(str(Path(__file__).with_name("search_efficiency.py")), run_name="__main__")
