"""Sampler construction, kept in one place so that the recommended set-up can be tuned later.

``--sampler default`` is the recommended set-up: the learned cost model
(``tuner.search.learned``, ``--sampler model``) where the family's accepted configs are listed
(``resolve``), which meets the search's targets (docs/search.md, "Today's table") on every
leave-one-out recorded pair and met them on 15 of 18 against 7 for the TPE set-up below when it
replaced it (docs/search.md, "Why the default sampler is what it is"); that TPE set-up (``--sampler prior``) where they are too many
to list (``tuner.search.study.ENUMERABLE_SPACE``: every registered family's space is listed
today). Why each piece of the TPE set-up is there (docs/search.md, "The static prior and the
prior set-up"):

* positions, not categories (``tuner.search.space``): power-of-two tile sizes are ordered, so the
  model can learn "128 is good, try 64 and 256".
* only accepted, not yet measured configs are proposed (``FeasibleSampler``): in the tile
  families 60-97% of the grid breaks a constraint. Told to the model, those rejections
  dominate TPE's split into good and bad trials (its "good" tenth of all trials is then simply
  the feasible ones) and the model learns feasibility instead of speed. Drawing proposals until
  one is accepted costs microseconds of CPU and keeps the model about GFLOP/s.
* a short start-up from the accepted configs — a few members of each of the best geometry
  groups of the static prior (``tuner.search.prior``, passed in as ``SearchSpace.startup``), uniform
  where there is none — then multivariate TPE (tile sizes only make sense together) with
  constant liar (a batch of asks in flight spreads out). Warm-start configs (measured first,
  from the database) do not shorten the start-up.
* where the accepted configs are enumerated (``SearchSpace.groups``), TPE draws its candidates
  from them (``EnumeratedTPE``) instead of from the whole box, most of which is rejected; and
  every second ask after the start-up measures another member of the best config's geometry
  group, up to ``GROUP_TRIES`` of them: the model sees tile sizes, not which warp layout of a
  good tile is the fast one.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers._tpe import _truncnorm
from optuna.samplers._tpe.probability_distributions import (
    _BatchedDiscreteTruncNormDistributions, _log_gauss_mass_unique, _unique_inverse_2d)
from optuna.samplers._tpe.sampler import _split_trials, default_gamma
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from tuner.search.choices import PRIOR_SAMPLERS, SAMPLERS

# CMA-ES ignores constraints by design; it sees failed configs through their 0 GFLOP/s value.
warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEsSampler",
                        category=UserWarning)

# Name of the constraint every trial carries (``Trial.set_constraint``): > 0 for rejected,
# failed and wrong configs, 0 for verified ones. Optuna treats <= 0 as feasible; samplers that
# support constraints (TPE, GP) model it, the others see the penalty value 0 GFLOP/s.
CONSTRAINT = "invalid"

# Default set-up: measured configs before TPE starts (the prior's picks, else random accepted).
STARTUP_TRIALS = 6
# Proposals drawn from the model (or at random) per ask until one is accepted and new.
MAX_DRAWS = 30
# Measured members of the incumbent's geometry group before its exploitation stops.
GROUP_TRIES = 4

Params = Mapping[str, Any]


@dataclass(frozen=True)
class SearchSpace:
    """What a sampler may need to know about the study's space beyond Optuna's trials."""

    distributions: Mapping[str, BaseDistribution]
    feasible: Callable[[Mapping[str, Any]], bool]  # params → the family's constraints accept
    # params (positions) the prior set-up measures first, in order, instead of uniform draws
    # (tuner.search.prior: a static estimate from geometry and compile-time resources)
    startup: Sequence[Params] = ()
    # params (positions) of every accepted config, partitioned by geometry
    # (tuner.search.prior.group_configs); empty where the space is not enumerated
    groups: Sequence[Sequence[Params]] = ()
    # the model sampler's accepted configs, features and examples of other problems
    # (tuner.search.learned.LearnedSpace); None for the other samplers
    learned: Any = None
    # start-up picks ahead of ``startup`` that the hybrid measures before the prior set-up's six
    # (the cost model's top-ranked configs when it learned from the same family elsewhere)
    model_picks: int = 0


def resolve(name: str, listed: bool) -> str:
    """The set-up a study runs for ``--sampler name``; ``listed``: the family's accepted configs
    are enumerated (the learned model ranks every one of them)."""
    if name == "default":
        return "model" if listed else "prior"
    return name


def make_sampler(name: str, seed: int | None, space: SearchSpace | None = None,
                 background: bool = False) -> optuna.samplers.BaseSampler:
    """The sampler for ``--sampler name``. ``space`` is needed by the tuner's own set-ups
    (default, model, prior, hybrid); the others are Optuna's samplers as shipped (the
    benchmark's reference points). ``default``: the model where ``space.learned`` is given.
    ``background``: the model refits on a thread (a live study: the GPU measures meanwhile)."""
    if name == "default":
        name = resolve(name, space is not None and space.learned is not None)
    if name in PRIOR_SAMPLERS:
        if space is None:
            raise ValueError(f"the {name} sampler needs the study's SearchSpace")
        tpe = dict(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=0)
        model = (EnumeratedTPE([p for group in space.groups for p in group], **tpe)
                 if space.groups else optuna.samplers.TPESampler(**tpe))
        return FeasibleSampler(model, space, seed=seed,
                               startup_trials=STARTUP_TRIALS + space.model_picks)
    if name == "model":
        if space is None or space.learned is None:
            raise ValueError("the model sampler needs the study's enumerated accepted configs "
                             "(SearchSpace.learned)")
        from tuner.search.learned import ModelSampler

        return ModelSampler(space.learned, space.distributions, space.startup, seed,
                            background=background)
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


def _key(params: Params) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((name, int(value)) for name, value in params.items()))


def _keys(columns: Sequence[Sequence[int]], names: Sequence[str]
          ) -> Iterator[tuple[tuple[str, int], ...]]:
    """``_key`` of each row of ``columns`` (one list of ints per name) without a dict and a
    sort per row: the names are distinct, so sorting them once orders every key alike. A study
    of 10⁵ accepted configs builds these at its start, with the GPU waiting."""
    order = sorted(range(len(names)), key=lambda j: names[j])
    if not order:
        return iter([()] * (len(columns[0]) if columns else 0))
    return zip(*([(names[j], value) for value in columns[j]] for j in order))


def _seen(trials: Sequence[FrozenTrial], names: Sequence[str]) -> set[tuple[tuple[str, int], ...]]:
    return {_key({n: t.params[n] for n in names}) for t in trials if set(names) <= t.params.keys()}


@dataclass(frozen=True)
class _Table:
    """Enumerated configs over some parameter names: their values (float, one row per config,
    in order) and each config's row by its key."""

    names: tuple[str, ...]
    values: np.ndarray
    rows: dict[tuple[tuple[str, int], ...], int]
    # per column: its distinct values, and each row's index among them
    columns: tuple[tuple[np.ndarray, np.ndarray], ...]

    @classmethod
    def build(cls, configs: Sequence[Params], names: Sequence[str]) -> _Table:
        # a column at a time (one list per name, not one per config): the same float64 values
        # in the same (C) layout in a fraction of the time
        values = np.ascontiguousarray(np.array(
            [[p[n] for p in configs] for n in names], dtype=np.float64
        ).reshape(len(names), len(configs)).T)
        rows = {key: row for row, key in enumerate(
            _keys([values[:, j].astype(np.int64).tolist() for j in range(len(names))], names))}
        columns = tuple(np.unique(values[:, j], return_inverse=True) for j in range(len(names)))
        return cls(tuple(names), values, rows, columns)

    def unseen(self, seen: set[tuple[tuple[str, int], ...]]) -> np.ndarray:
        """Rows of the configs whose keys are not in ``seen``, in order."""
        mask = np.ones(len(self.values), dtype=bool)
        mask[[row for key in seen if (row := self.rows.get(key)) is not None]] = False
        return np.flatnonzero(mask)

    def log_pdf(self, estimator: Any, rows: np.ndarray) -> np.ndarray:
        """``estimator.log_pdf`` at ``rows`` (an Optuna ``_ParzenEstimator`` over the table's
        names, integer positions: discrete truncated normals), bit for bit: the same operations
        on each element in the same order (Optuna's ``_MixtureOfProductDistribution.log_pdf``),
        but each column's distinct values come from the table instead of an ``np.unique``
        over 10⁴-10⁵ candidates per call, and each column's mass per (value, kernel) is
        gathered by row. Other distributions: Optuna's own."""
        mixture = estimator._mixture_distribution
        if any(type(d) is not _BatchedDiscreteTruncNormDistributions
               for d in mixture.distributions):
            return estimator.log_pdf({n: self.values[rows, j] for j, n in enumerate(self.names)})
        weighted = np.zeros((len(rows), len(mixture.weights)), dtype=np.float64)
        for (distinct, inverse), d in zip(self.columns, mixture.distributions):
            mu, sigma, kernel = _unique_inverse_2d(d.mu, d.sigma)
            left, right = distinct - d.step / 2, distinct + d.step / 2
            mass = _log_gauss_mass_unique((left[:, np.newaxis] - mu) / sigma,
                                          (right[:, np.newaxis] - mu) / sigma)[:, kernel]
            weighted += mass[inverse[rows]]
            weighted -= _truncnorm._log_gauss_mass((d.adapted_low - mu) / sigma,
                                                   (d.adapted_high - mu) / sigma)[kernel]
        weighted += np.log(mixture.weights[np.newaxis])
        largest = weighted.max(axis=1)
        largest[np.isneginf(largest)] = 0  # no (-inf) - (-inf) where the density is zero
        with np.errstate(divide="ignore"):
            return np.log(np.exp(weighted - largest[:, None]).sum(axis=1)) + largest


class EnumeratedTPE(optuna.samplers.TPESampler):
    """Multivariate TPE over an enumerated set of configs (positions).

    Optuna's TPE draws ``n_ei_candidates`` points from its density of good trials l(x) over the
    whole box and keeps the one with the best l(x)/g(x). In the tile families 80-97% of that box
    breaks a constraint, so nearly every draw was rejected and the asks fell back to uniform
    picks. Here the candidates are drawn from the accepted configs not yet
    measured or in flight, weighted by l(x) — TPE's own candidate distribution restricted to
    what can run — and ranked by TPE's l(x)/g(x). Everything else is TPESampler's: the split
    into good and bad trials, the Parzen estimators and their bandwidths, constant liar. It
    overrides TPESampler's private ``_sample`` and uses its helpers (hence ``optuna<6``)."""

    def __init__(self, accepted: Sequence[Params], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.accepted = [dict(p) for p in accepted]
        self._table: _Table | None = None

    def _table_over(self, names: Sequence[str]) -> _Table:
        """The accepted configs over ``names`` as arrays (built once per search space): an ask
        then selects its candidates with a mask instead of a Python pass over 10⁴-10⁵ configs,
        which cost most of its time."""
        if self._table is None or self._table.names != tuple(names):
            self._table = _Table.build(self.accepted, names)
        return self._table

    def _sample(self, study: Study, trial: FrozenTrial,
                search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        trials = [t for t in study._get_trials(deepcopy=False, states=states, use_cache=False)
                  if t.number != trial.number]
        names = list(search_space)
        table = self._table_over(names)
        candidates = table.unseen(_seen(trials, names))  # rows, in accepted order
        if not len(candidates):
            return {}
        gamma = self._gamma or default_gamma
        below, above = _split_trials(
            study, trials, gamma(sum(t.state != TrialState.RUNNING for t in trials)))
        good = self._build_parzen_estimator(study, search_space, below, handle_below=True)
        bad = self._build_parzen_estimator(study, search_space, above, handle_below=False)
        log_good = table.log_pdf(good, candidates)
        weights = np.exp(log_good - log_good.max())
        count = min(self._n_ei_candidates, len(candidates))
        drawn = self._rng.rng.choice(len(candidates), size=count, replace=False,
                                     p=weights / weights.sum())
        score = log_good[drawn] - table.log_pdf(bad, candidates[drawn])
        best = self.accepted[int(candidates[drawn[int(np.argmax(score))]])]
        return {n: search_space[n].to_external_repr(best[n]) for n in names}


class FeasibleSampler(optuna.samplers.BaseSampler):
    """Proposes only configs the constraints accept and the study has not seen: the first
    ``startup_trials`` (warm-start trials not counted; asks made while those are still in
    flight continue down ``space.startup``) from ``space.startup`` in order, then uniformly from
    the accepted ones; then, every second ask, another member of the best config's geometry
    group (``space.groups``, up to ``GROUP_TRIES`` measured), and otherwise the model's
    proposals, drawn again while they are rejected or repeats (after ``MAX_DRAWS`` a random
    accepted one).

    The model samples the whole space jointly (``sample_relative``); constants (single-valued
    parameters) come from ``sample_independent``."""

    def __init__(self, model: optuna.samplers.BaseSampler, space: SearchSpace, *,
                 seed: int | None, startup_trials: int) -> None:
        self.model, self.space = model, space
        self.startup_trials = startup_trials
        self.rng = random.Random(seed)
        self.varying = {name: d for name, d in space.distributions.items() if not d.single()}
        # each accepted config's geometry group, by its key over the varying parameters (what
        # the study's trials hold); built from columns, not a dict per config
        self.groups = space.groups
        names = list(self.varying)
        columns = [[int(p[n]) for group in self.groups for p in group] for n in names]
        self.group_of = dict(zip(_keys(columns, names),
                                 (index for index, group in enumerate(self.groups)
                                  for _ in group)))

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
        names = list(search_space)
        seen = _seen(trials, names) | _seen(
            [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
             if t.number != trial.number], names)
        measured = [t for t in trials if t.user_attrs.get("state") != "rejected"]
        own = sum(1 for t in measured if not t.user_attrs.get("warm_start"))
        if own < self.startup_trials:
            for startup in self.space.startup:
                params = {name: int(startup[name]) for name in search_space}
                if self._usable(params, seen):
                    return params
            return self._random(search_space, seen)
        if (own - self.startup_trials) % 2 == 1:
            params = self._from_best_group(measured, names, seen)
            if params:
                return params
        for _ in range(MAX_DRAWS):
            params = self.model.sample_relative(study, trial, search_space)
            if params and self._usable(params, seen):
                return params
        return self._random(search_space, seen)

    def _from_best_group(self, measured: Sequence[FrozenTrial], names: Sequence[str],
                         seen: set[tuple[tuple[str, int], ...]]) -> dict[str, Any]:
        """An unseen member of the geometry group of the best measured config, while that group
        has fewer than ``GROUP_TRIES`` measured; {} otherwise."""
        scored = [t for t in measured if t.value is not None and set(names) <= t.params.keys()]
        if not scored or not self.group_of:
            return {}
        best = max(scored, key=lambda t: t.value)  # type: ignore[arg-type, return-value]
        index = self.group_of.get(_key({n: best.params[n] for n in names}))
        if index is None:
            return {}
        members = [{n: int(p[n]) for n in self.varying} for p in self.groups[index]]
        if sum(1 for p in members if _key(p) in seen) >= GROUP_TRIES:
            return {}
        left = [p for p in members if _key(p) not in seen]
        return dict(self.rng.choice(left)) if left else {}

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
