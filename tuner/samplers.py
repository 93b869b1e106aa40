"""Sampler construction, kept in one place so that the recommended set-up can be tuned later."""

from __future__ import annotations

import importlib.util
import warnings

import optuna

# CMA-ES ignores constraints by design; it sees failed configs through their 0 GFLOP/s value.
warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEsSampler",
                        category=UserWarning)

SAMPLERS = ("default", "tpe", "gp", "cmaes", "random")

# Extra packages each sampler needs beyond Optuna itself.
_NEEDS: dict[str, tuple[str, ...]] = {"gp": ("torch", "scipy"), "cmaes": ("cmaes",)}

# Name of the constraint every trial carries (``Trial.set_constraint``): > 0 for rejected,
# failed and wrong configs, 0 for verified ones. Optuna treats <= 0 as feasible; samplers that
# support constraints (TPE, GP) model it, the others see the penalty value 0 GFLOP/s.
CONSTRAINT = "invalid"


def missing_packages(name: str) -> list[str]:
    return [pkg for pkg in _NEEDS.get(name, ()) if importlib.util.find_spec(pkg) is None]


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """The sampler for ``--sampler name``."""
    if name == "default":
        # The recommended set-up: multivariate TPE that models parameter interactions (tile
        # sizes only make sense together), constant liar so a batch of asks in flight spreads
        # out, and a short random start because warm-start trials already seed the model.
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=False,
            constant_liar=True,
            n_startup_trials=6,
        )
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            warn_independent_sampling=False,
            independent_sampler=optuna.samplers.RandomSampler(seed=seed),
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; allowed: {', '.join(SAMPLERS)}")
