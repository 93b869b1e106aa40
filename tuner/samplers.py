"""Sampler construction, kept in one place so that the recommended set-up can be tuned later.

The default set-up (``--sampler default``) and why each piece is there (measurements in
bench/NOTES.md, "Search set-up"):

* positions, not categories (``tuner.space``): power-of-two tile sizes are ordered, so the
  model can learn "128 is good, try 64 and 256".
* only accepted, not yet measured configs are proposed (``FeasibleSampler``): in the tile
  families 60-97% of the grid breaks a constraint. Told to the model, those rejections
  dominate TPE's split into good and bad trials (its "good" tenth of all trials is then simply
  the feasible ones) and the model learns feasibility instead of speed. Drawing proposals until
  one is accepted costs microseconds of CPU and keeps the model about GFLOP/s.
* a short start-up from the accepted configs — ranked by the static prior (``tuner.prior``,
  passed in as ``SearchSpace.startup``), uniform where there is none — then multivariate TPE
  (tile sizes only make sense together) with constant liar (a batch of asks in flight spreads
  out).
"""

from __future__ import annotations

import importlib.util
import random
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

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

# Default set-up: measured configs before TPE starts (the prior's picks, else random accepted).
STARTUP_TRIALS = 6
# Proposals drawn from the model (or at random) per ask until one is accepted and new.
MAX_DRAWS = 30


@dataclass(frozen=True)
class SearchSpace:
    """What a sampler may need to know about the study's space beyond Optuna's trials."""

    distributions: Mapping[str, BaseDistribution]
    feasible: Callable[[Mapping[str, Any]], bool]  # params → the family's constraints accept
    # params (positions) the default measures first, in order, instead of uniform draws
    # (tuner.prior: a static estimate from geometry and compile-time resources)
    startup: Sequence[Mapping[str, Any]] = ()


def missing_packages(name: str) -> list[str]:
    return [pkg for pkg in _NEEDS.get(name, ()) if importlib.util.find_spec(pkg) is None]


def make_sampler(name: str, seed: int | None, space: SearchSpace | None = None
                 ) -> optuna.samplers.BaseSampler:
    """The sampler for ``--sampler name``. ``space`` is needed by the default set-up only; the
    others are Optuna's samplers as shipped (the benchmark's reference points)."""
    if name == "default":
        if space is None:
            raise ValueError("the default sampler needs the study's SearchSpace")
        model = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                           n_startup_trials=0)
        return FeasibleSampler(model, space, seed=seed, startup_trials=STARTUP_TRIALS)
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


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((name, int(value)) for name, value in params.items()))


class FeasibleSampler(optuna.samplers.BaseSampler):
    """Proposes only configs the constraints accept and the study has not seen: the first
    ``startup_trials`` from ``space.startup`` in order, then uniformly from the accepted ones,
    then the model's proposals, drawn again while they are rejected or repeats (after
    ``MAX_DRAWS`` a random accepted one).

    The model samples the whole space jointly (``sample_relative``); constants (single-valued
    parameters) come from ``sample_independent``."""

    def __init__(self, model: optuna.samplers.BaseSampler, space: SearchSpace, *,
                 seed: int | None, startup_trials: int) -> None:
        self.model, self.space = model, space
        self.startup_trials = startup_trials
        self.rng = random.Random(seed)
        self.varying = {name: d for name, d in space.distributions.items() if not d.single()}

    def reseed_rng(self) -> None:
        self.rng.seed()
        self.model.reseed_rng()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return dict(self.varying)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        seen = {_key({n: t.params[n] for n in search_space if n in t.params}) for t in trials
                if search_space.keys() <= t.params.keys()}
        seen |= {_key(t.params) for t in study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING,))
            if t.number != trial.number and search_space.keys() <= t.params.keys()}
        measured = sum(1 for t in trials if t.user_attrs.get("state") != "rejected")
        if measured >= self.startup_trials:
            for _ in range(MAX_DRAWS):
                params = self.model.sample_relative(study, trial, search_space)
                if params and self._usable(params, seen):
                    return params
        else:
            for startup in self.space.startup:
                params = {name: int(startup[name]) for name in search_space}
                if self._usable(params, seen):
                    return params
        return self._random(search_space, seen)

    def _usable(self, params: Mapping[str, Any], seen: set[tuple[tuple[str, int], ...]]
                ) -> bool:
        full = {**self._constants(), **params}
        return _key(params) not in seen and self.space.feasible(full)

    def _constants(self) -> dict[str, Any]:
        return {name: d.low for name, d in self.space.distributions.items()  # type: ignore
                if d.single()}

    def _random(self, search_space: Mapping[str, BaseDistribution],
                seen: set[tuple[tuple[str, int], ...]]) -> dict[str, Any]:
        """A uniform draw from the accepted, unseen configs (by rejection; {} when none found:
        Optuna then falls back to ``sample_independent``)."""
        for _ in range(MAX_DRAWS * 100):
            params = {name: self.rng.randint(d.low, d.high)  # type: ignore[attr-defined]
                      for name, d in search_space.items()}
            if self._usable(params, seen):
                return params
        return {}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if param_distribution.single():
            return param_distribution.low  # type: ignore[attr-defined]
        return self.model.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.model.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.model.after_trial(study, trial, state, values)
