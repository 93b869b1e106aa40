"""The samplers ``--sampler`` offers by name, and the packages each needs beyond Optuna.

Apart from ``tuner.search.samplers`` (which builds them, and imports Optuna) so that the command
line can be parsed and checked before the heavy imports: ``python -m tuner`` starts its GPU
process first and imports the search while that process starts CUDA (tuner.run.cli).
"""

from __future__ import annotations

import importlib.util

SAMPLERS = ("default", "model", "prior", "hybrid", "tpe", "gp", "cmaes", "random")
# the TPE set-up started from the static prior's ranking (FeasibleSampler)
PRIOR_SAMPLERS = ("prior", "hybrid")
# samplers that may start from the static prior's ranking (tuner.search.prior), which is then
# prepared ahead (tuner.search.prefetch): the model's where it has not learned the family
RANKED_STARTUP = ("default", "model", *PRIOR_SAMPLERS)
# samplers that fit the learned cost model (tuner.search.costmodel), on any listed space
LEARNING = ("default", "model", "hybrid")

# Extra packages each sampler needs beyond Optuna itself.
_NEEDS: dict[str, tuple[str, ...]] = {"gp": ("torch", "scipy"), "cmaes": ("cmaes",),
                                      "default": ("sklearn",), "model": ("sklearn",),
                                      "hybrid": ("sklearn",)}


def missing_packages(name: str) -> list[str]:
    return [pkg for pkg in _NEEDS.get(name, ()) if importlib.util.find_spec(pkg) is None]
