"""A learned cost model: which accepted configs of a problem are likely fast, from what other
problems (other shapes, families, GPU models) measured.

What it reads of a config (``features``) is known before anything is compiled or measured:
the launch geometry (``tuner.search.prior.Geometry``: block tile, threads, split of K, dynamic
shared memory), what follows from it on the target GPU (estimated registers, blocks resident
per SM, rounds of blocks on the busiest SM, idle share of the last round, padding of edge
tiles, the static prior's throughput terms, waves of blocks over what the GPU holds at once),
the problem's size, and the family's own
parameters (log2, by name; NaN where a family lacks one). The family itself is a feature as
well, so measurements of the same family at other shapes weigh most. Three more features
depend on the examples (``Transfer``): what the same config measured at the nearest other
shape of its family, how far that shape is, and the best it measured at any other shape.

What it predicts is a config's GFLOP/s as a fraction of the best measured on the same (GPU
model, family, problem): absolute speed differs between GPUs and shapes, the order within a
problem is what a search needs. Failed configs (compile, launch, wrong result, crash) count
as 0. The regressor is scikit-learn's histogram gradient boosting (one thread, a fixed seed:
the same examples give the same predictions), the anchor being TVM MetaSchedule's boosted
trees over program features.
"""

from __future__ import annotations

import math
import operator
import threading
from functools import cached_property, lru_cache
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

import kernels

from tuner.problem import Problem
from tuner.search import rowcache
from tuner.search.prior import (
    GLOBAL_REUSE_HALF,
    Geometry,
    LATENCY_WARPS,
    SMEM_LOADS_PER_OPERAND,
    STAGED_DEPTH_HALF,
    Target,
    rate,
    estimated_usage,
    geometry,
)

# Family parameters read by name (log2 of the value), union over the registered families.
PARAMS: tuple[str, ...] = tuple(sorted({p.name for f in kernels.FAMILIES.values()
                                        for p in f.params}))
FAMILY_NAMES: tuple[str, ...] = tuple(sorted(kernels.FAMILIES))
GEOMETRY_FEATURES = (
    "log2_m", "log2_n", "log2_k", "log2_tile_rows", "log2_tile_cols", "log2_threads",
    "log2_splits", "shared_kib", "outputs_per_thread", "est_registers", "blocks_per_sm",
    "resident_warps", "rounds", "last_round_idle", "edge_waste", "log2_k_per_split",
    "issue", "smem_term", "global_term", "staging_term", "log2_blocks_per_sm_count",
    "prior_rate",  # the static prior's estimate over the best estimate among the configs given
    # blocks over the blocks the whole GPU holds at once (estimated occupancy): a size relative
    # to the problem, so what larger tiles do at another shape carries over where the trees
    # cannot extrapolate log2_m and its kin (docs/search.md, "Why the default sampler is what it
    # is": tf32x3 at 3000³ 45 → 20.5 measurements to 3 %)
    "waves",
)
# What the same config measured at the other shapes of its family (``Transfer``): its
# fraction of the nearest shape's best and how far that shape is (log2 steps of m, n and k),
# and its largest fraction at any of them (a config fast somewhere often is here where the
# nearest shape's optimum is not: docs/search.md, "Why the default sampler is what it is"). NaN
# where no other shape of the family measured it, and in ``matrix``'s rows until
# ``Transfer.fill`` sets them.
TRANSFER_FEATURES = ("near_rate", "near_distance", "best_rate")
FEATURES: tuple[str, ...] = (*GEOMETRY_FEATURES, "family", *(f"p_{p}" for p in PARAMS),
                             *TRANSFER_FEATURES)
FAMILY_COLUMN = FEATURES.index("family")
PRIOR_RATE = FEATURES.index("prior_rate")
PARAM_COLUMNS = {name: FEATURES.index(f"p_{name}") for name in PARAMS}
TRANSFER_COLUMNS = [FEATURES.index(name) for name in TRANSFER_FEATURES]

# Boosting set-up: small trees, few rounds (a few thousand examples; fitting must stay well
# under a second on one core, as the sampler refits during a study). A study's fit on the
# examples of other problems boosts more rounds where those hold its family at many shapes
# (learned.offline_model).
MAX_ITER = 80
LEARNING_RATE = 0.1
MAX_LEAF_NODES = 15
MIN_SAMPLES_LEAF = 8


@dataclass(frozen=True)
class Example:
    """One measured config: what a fit learns from."""

    gpu: str  # GPU model name
    target: Target
    family: str
    config: Mapping[str, int]
    problem: Problem
    gflops: float  # 0 where the config failed

    # Both cached on the instance (== compares the fields alone): a start-up reads them for
    # each of the 54,136 bundled examples, the same objects study after study; computed anew,
    # they were a quarter of naive's start-up (docs/search.md, "Start-ups' own time").
    @cached_property
    def unit(self) -> tuple[str, str, str]:
        """The (GPU model, family, shape) it belongs to: the unit normalised together and
        held out together."""
        return (self.gpu, self.family, self.problem.shape)

    @cached_property
    def identity(self) -> tuple[Any, ...]:
        """What tells one example from another, as a sort key."""
        p = self.problem
        return (self.gpu, self.target.sm_count, self.target.arch, self.family,
                p.m, p.n, p.k, p.dtype, p.layout, p.general_alpha_beta,
                tuple(sorted(self.config.items())), self.gflops)

    def __getstate__(self) -> tuple[Any, ...]:
        # The fields alone: not the cached values (computed again where read), nor the
        # instance's dict, which a start-up's thread may be filling while the examples are
        # pickled for the preparing processes (tuner.search.prefetch).
        return tuple(getattr(self, f) for f in _EXAMPLE_FIELDS)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.__dict__.update(zip(_EXAMPLE_FIELDS, state))


_EXAMPLE_FIELDS = tuple(f.name for f in fields(Example))


def features(family: Any, config: Mapping[str, int], problem: Problem, target: Target
             ) -> list[float]:
    """The feature vector of one config (order: ``FEATURES``; the prior's rate as estimated,
    not divided as ``matrix`` divides it)."""
    return _rows(family, [config], problem, target)[0].tolist()


def _rows(family: Any, configs: Sequence[Mapping[str, int]], problem: Problem, target: Target,
          geometries: Sequence[Geometry] | None = None) -> np.ndarray:
    """``features`` of each config, a row each (``geometries``: each config's, where the caller
    has them already). Column by column, not config by config: a split-K space lists 214,440
    configs, and building each row in Python took most of ``matrix``'s time."""
    x = np.full((len(configs), len(FEATURES)), math.nan)
    if not len(configs):
        return x
    # the launch geometry's columns once per geometry: configs of a family share few
    seen: dict[Geometry, int] = {}
    if geometries is None:
        geometries = [geometry(family, c, problem.m, problem.n, problem.k) for c in configs]
    which = np.fromiter((seen.setdefault(g, len(seen)) for g in geometries),
                        dtype=np.intp, count=len(configs))
    values = np.array([_geometry_values(g, problem, target) for g in seen], dtype=np.float64)
    x[:, :len(GEOMETRY_FEATURES)] = values[which]
    if family.name in FAMILY_NAMES:
        x[:, FAMILY_COLUMN] = float(FAMILY_NAMES.index(family.name))
    # every config names exactly the family's parameters (``geometry`` validated each one)
    names = [param.name for param in family.params if param.name in PARAM_COLUMNS]
    if not names:
        return x
    given = np.array([operator.itemgetter(*names)(c) for c in configs], dtype=np.float64
                     ).reshape(len(configs), len(names))
    for column, name in zip(given.T, names):
        # log2 of each distinct value by math.log2, as one config's row always had it (0 for 0)
        distinct, at = np.unique(column, return_inverse=True)
        logs = np.array([math.log2(v) if v > 0 else 0.0 for v in distinct.tolist()])
        x[:, PARAM_COLUMNS[name]] = logs[at.reshape(-1)]
    return x


# configs of a family share few launch geometries (split-K's 214,440: matrix 4.85 → 3.47 s)
@lru_cache(maxsize=65536)
def _geometry_values(geom: Geometry, problem: Problem, target: Target) -> tuple[float, ...]:
    """``GEOMETRY_FEATURES``: what follows from a launch geometry on one problem and GPU."""
    m, n, k = problem.m, problem.n, problem.k
    usage = estimated_usage(geom)
    try:
        occ = kernels.occupancy(target.arch, geom.threads, usage.registers, geom.shared_bytes)
        per_block = occ.blocks_per_sm
    except ValueError:
        per_block = 0
    per_sm = math.ceil(max(geom.blocks, 1) / target.sm_count)
    resident = max(1, min(per_block, per_sm))
    rounds = math.ceil(per_sm / resident)
    slots = rounds * resident * target.sm_count
    bm, bn = geom.tile
    warps = resident * geom.threads / 32
    q = geom.outputs_per_thread
    reuse = bm * bn / (bm + bn)
    depth = geom.shared_bytes / (4.0 * (bm + bn))
    padded = math.ceil(m / bm) * bm * math.ceil(n / bn) * bn
    return (
        math.log2(m), math.log2(n), math.log2(k), math.log2(bm), math.log2(bn),
        math.log2(geom.threads), math.log2(max(geom.splits, 1)), geom.shared_bytes / 1024,
        q, usage.registers, per_block, warps, rounds, 1 - geom.blocks / slots,
        1 - m * n / padded, math.log2(max(1.0, k / max(geom.splits, 1))),
        warps / (warps + LATENCY_WARPS) * resident / (resident + 1),
        q / (q + SMEM_LOADS_PER_OPERAND * math.sqrt(q)),
        reuse / (reuse + GLOBAL_REUSE_HALF),
        depth / (depth + STAGED_DEPTH_HALF) if depth else 1.0,
        math.log2(max(geom.blocks, 1) / target.sm_count),
        rate(geom, usage, target, k),
        geom.blocks / (max(per_block, 1) * target.sm_count),
    )


def matrix(family: Any, configs: Sequence[Mapping[str, int]], problem: Problem,
           target: Target, geometries: Sequence[Geometry] | None = None) -> np.ndarray:
    """Feature rows of configs of one problem. The prior's rate is only an order within a
    problem: it is divided by its largest value among ``configs`` (pass every accepted config,
    or every measured one of a full recording, so that the two mean the same)."""
    x = _rows(family, configs, problem, target, geometries)
    if len(x):
        column = x[:, PRIOR_RATE]
        top = column.max()
        x[:, PRIOR_RATE] = column / top if top > 0 else 0.0
    return x


Unit = tuple[str, str, str]  # Example.unit
# a unit's fractions by parameter names (sorted), then by the values in that order
Rates = dict[tuple[str, ...], dict[tuple[int, ...], float]]


def by_unit(examples: Iterable[Example]) -> dict[Unit, list[Example]]:
    """Examples grouped by unit (GPU model, family, shape), in their order."""
    units: dict[Unit, list[Example]] = {}
    for example in examples:
        units.setdefault(example.unit, []).append(example)
    return units


def shape_distance(a: Problem, b: Problem) -> float:
    """Steps of 2× between two shapes, summed over m, n and k."""
    return (abs(math.log2(a.m / b.m)) + abs(math.log2(a.n / b.n))
            + abs(math.log2(a.k / b.k)))


class Transfer:
    """What each config measured at the other shapes of its family on GPUs of the same target
    (SM count and arch): its fraction of the best there (``fractions``), by unit. ``fill`` sets
    a problem's ``TRANSFER_FEATURES`` from the shapes that measured each config. The
    warm start showed that a shape's optimum is often its neighbour's (tf32x3 3000³ and
    2560×2816×2304) while the geometry features rank it far down; this carries that to the
    model, which learns from the other units how far it holds (docs/search.md, "The fit")."""

    def __init__(self, examples: Iterable[Example]) -> None:
        # (target, family) → [(unit, problem, rates)]; keyed once here, not per ``fill``
        # (re-keying every other unit for each unit cost ``add_examples`` 0.05-0.3 s)
        self._units: dict[tuple[Target, str], list[tuple[Unit, Problem, Rates]]] = {}
        for unit, unit_examples in by_unit(examples).items():
            first = unit_examples[0]
            rates: Rates = {}
            for example, rate in zip(unit_examples, fractions([e.gflops for e in unit_examples])):
                names = tuple(sorted(example.config))
                values = tuple(int(example.config[name]) for name in names)
                rates.setdefault(names, {})[values] = float(rate)
            self._units.setdefault((first.target, first.family), []).append(
                (unit, first.problem, rates))

    def fill(self, x: np.ndarray, family: str, configs: Sequence[Mapping[str, int]],
             problem: Problem, target: Target, own: Unit | None = None) -> np.ndarray:
        """``x`` (rows of ``configs`` at ``problem``) with the transfer columns set from the
        other units of the family that measured each config (the nearest one's fraction and
        distance, the best fraction of any); never from ``own`` (a training unit's own
        measurements) nor from the same shape."""
        out = np.array(x, dtype=np.float64, copy=True)
        out[:, TRANSFER_COLUMNS] = math.nan
        if not len(configs):
            return out
        # keyed by values in one order of names: a split-K space lists 214,440 configs, and
        # sorting each one's items took most of a second
        names = tuple(sorted(configs[0]))
        candidates = sorted(
            ((shape_distance(problem, p), rates.get(names, {}))
             for unit, p, rates in self._units.get((target, family), [])
             if unit != own and p.shape != problem.shape),
            key=lambda item: item[0])
        if not candidates:
            return out
        # each distinct config once (an id per key), then each unit's measured configs looked up,
        # nearest unit first: a unit measured thousands where a space lists up to 214,440
        getter = operator.itemgetter(*names)
        index: dict[tuple[Any, ...], int] = {}
        ids = np.fromiter((-1 if (key := _values(getter, config, len(names))) is None
                           else index.setdefault(key, len(index)) for config in configs),
                          dtype=np.intp, count=len(configs))
        nearest = np.full(len(index), math.nan)
        distance_of = np.full(len(index), math.nan)
        best = np.full(len(index), math.nan)
        for distance, rates in candidates:
            for key, fraction in rates.items():
                i = index.get(key)
                if i is None:
                    continue
                if math.isnan(nearest[i]):  # the nearest: candidates are by distance
                    nearest[i], distance_of[i] = fraction, distance
                    best[i] = fraction
                elif fraction > best[i]:
                    best[i] = fraction
        rows = ids >= 0
        rate_column, distance_column, best_column = TRANSFER_COLUMNS
        out[rows, rate_column] = nearest[ids[rows]]
        out[rows, distance_column] = distance_of[ids[rows]]
        out[rows, best_column] = best[ids[rows]]
        return out


def _values(getter: Any, config: Mapping[str, int], count: int) -> tuple[Any, ...] | None:
    """A config's values in the order of ``getter``'s ``count`` names; None where it lacks one
    (another family's names: nothing of it was measured here)."""
    try:
        values = getter(config)
    except KeyError:
        return None
    return values if count > 1 else (values,)


UnitKey = tuple[Unit, int, float]  # a unit, its count of examples and their summed GFLOP/s
UnitRows = tuple[dict[tuple[Any, ...], np.ndarray], float]
_unit_rows_kept: dict[Unit, tuple[UnitKey, UnitRows]] = {}  # the last seen of each unit


def _config_key(config: Mapping[str, int]) -> tuple[Any, ...]:
    return tuple(sorted(config.items()))


def _unit_key(unit: Unit, examples: Sequence[Example]) -> UnitKey:
    """What tells one state of a unit's examples from another: a unit's measurements only
    grow, and are never rewritten."""
    return unit, len(examples), sum(e.gflops for e in examples)


def _unit_rows(unit: Unit, examples: Sequence[Example]) -> UnitRows:
    """The feature rows (``matrix``, no transfer columns) of every config of one unit the
    family can still lay out, by config, and the best GFLOP/s among them: kept per unit in the
    process, as studies read the same units again and again, and on disk (``rowcache``), as
    every process fitting the model reads the same recorded units (the H200's: 1.9 s)."""
    key = _unit_key(unit, examples)
    seen = _unit_rows_kept.get(unit)
    if seen is not None and seen[0] == key:
        return seen[1]

    def compute() -> UnitRows:
        first = examples[0]
        family = kernels.get_family(first.family)
        # each example's launch geometry once: whether the family can still lay it out, and its row
        laid_out = [(e, g) for e in examples if (g := _geometry_of(family, e)) is not None]
        usable = [e for e, _ in laid_out]
        x = matrix(family, [e.config for e in usable], first.problem, first.target,
                   [g for _, g in laid_out])
        return ({_config_key(e.config): row for e, row in zip(usable, x)},
                max((e.gflops for e in usable), default=0.0))

    # from disk where another process of this install laid these examples out already
    rows = rowcache.unit_rows(unit, examples, compute) if examples[0].family in kernels.FAMILIES else compute()
    _unit_rows_kept[unit] = (key, rows)
    return rows


def lay_out(examples: Sequence[Example]) -> int:
    """Each unit's feature rows (``_unit_rows``) of these examples, kept in this process and on
    disk for the others; how many units."""
    units = by_unit(examples)
    for unit, unit_examples in units.items():
        _unit_rows(unit, unit_examples)
    return len(units)


TransferKey = tuple[UnitKey, ...]
_transfers: dict[TransferKey, Transfer] = {}
_transfers_lock = threading.Lock()  # a study's fit and the next one's, prepared ahead, share it
TRANSFERS_KEPT = 4


def transfer_of(examples: Sequence[Example]) -> Transfer:
    """``Transfer(examples)``, the last few kept: a study reads it for its own configs and for
    its fit's rows (0.3 s for the 120,000 recorded examples), and a benchmark runs many studies
    on the same examples. Keyed by its units' ``_unit_key``."""
    key = tuple(sorted(_unit_key(unit, unit_examples)
                       for unit, unit_examples in by_unit(examples).items()))
    with _transfers_lock:
        transfer = _transfers.pop(key, None)
    if transfer is None:
        transfer = Transfer(examples)
    with _transfers_lock:
        _transfers[key] = transfer  # the most recent last
        while len(_transfers) > TRANSFERS_KEPT:
            del _transfers[next(iter(_transfers))]
    return transfer


def fractions(gflops: Sequence[float], best: float = 0.0) -> np.ndarray:
    """GFLOP/s as a fraction of the best of the same unit: ``best``, or theirs where higher
    (all zeros where none ran)."""
    values = np.asarray(gflops, dtype=np.float64)
    best = max(best, values.max() if len(values) else 0.0)
    return values / best if best > 0 else np.zeros_like(values)


class CostModel:
    """Predicts, for configs of one problem, their GFLOP/s as a fraction of that problem's
    best. ``fit`` on examples (normalised per unit); ``add`` rows normalised by the caller
    (a study's own measurements, weighted)."""

    def __init__(self, seed: int | None = 0, ignored: Sequence[int] = (),
                 rounds: int = MAX_ITER) -> None:
        self.seed = _seed(seed)
        self.ignored = tuple(ignored)  # feature columns the fit leaves out
        self.rounds = rounds  # boosting rounds of the fit
        self._rows: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []
        self._model: Any = None
        self._columns = np.ones(len(FEATURES), dtype=bool)  # the columns the fit used

    def copy(self, ignored: Sequence[int] | None = None) -> CostModel:
        """The same rows, unfitted (rows are shared: they are never changed in place);
        ``ignored``: columns the copy's fit leaves out (default: this one's)."""
        other = CostModel(self.seed, self.ignored if ignored is None else ignored, self.rounds)
        other._rows, other._targets = list(self._rows), list(self._targets)
        other._weights = list(self._weights)
        return other

    @property
    def rows(self) -> int:
        return sum(len(r) for r in self._rows)

    def add(self, x: np.ndarray, y: np.ndarray, weight: float = 1.0) -> None:
        if len(x):
            self._rows.append(np.asarray(x, dtype=np.float64))
            self._targets.append(np.asarray(y, dtype=np.float64))
            self._weights.append(np.full(len(x), float(weight)))

    def add_examples(self, examples: Iterable[Example], weight: float = 1.0,
                     context: Sequence[Example] | None = None) -> None:
        """Examples grouped by unit, each normalised by its unit's best. ``context``: every
        example they were drawn from (default: themselves), which what a row reads of its
        unit and of the others comes from: the unit's best, the prior's rate over its best
        (``matrix``) and the transfer columns. A sample of a unit (``learned.capped``) may
        lack its best, and a sample of a neighbour the very config."""
        units = by_unit(examples)
        whole = units if context is None else by_unit(context)
        transfer = transfer_of(context if context is not None else
                               [e for unit_examples in units.values() for e in unit_examples])
        for unit, unit_examples in units.items():
            first = unit_examples[0]
            rows, best = _unit_rows(unit, whole[unit])
            usable = [e for e in unit_examples if _config_key(e.config) in rows]
            if not usable:
                continue
            configs = [e.config for e in usable]
            x = np.array([rows[_config_key(c)] for c in configs])
            self.add(transfer.fill(x, first.family, configs, first.problem, first.target, unit),
                     fractions([e.gflops for e in usable], best), weight)

    def fit(self) -> CostModel:
        from threadpoolctl import threadpool_limits

        if not self._rows:
            self._model = None
            return self
        x = np.concatenate(self._rows)
        y = np.concatenate(self._targets)
        w = np.concatenate(self._weights)
        # a column no example has (a parameter of families not in the data) says nothing
        self._columns = ~np.all(np.isnan(x), axis=0)
        self._columns[list(self.ignored)] = False
        x = x[:, self._columns]
        categorical = np.zeros(len(FEATURES), dtype=bool)
        categorical[FAMILY_COLUMN] = True
        categorical = categorical[self._columns]
        self._model = _boosted(self.seed, min(MIN_SAMPLES_LEAF, max(1, len(x) // 4)),
                               categorical, self.rounds)
        # Equal weights fit as none, to the same model bit for bit (tested): given weights,
        # scikit-learn finds each feature's bin edges by one weighted percentile per edge, which
        # took 0.3 of a 0.5-s fit (docs/search.md, "The fit").
        weights = None if np.all(w == 1.0) else w
        # one thread: deterministic, and the CPU's other cores are compiling candidates
        with threadpool_limits(1):
            self._model.fit(x, y, sample_weight=weights)
        return self

    @property
    def fitted(self) -> bool:
        return self._model is not None

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("the cost model has not been fitted (no examples)")
        return _predict(self._model, self._columns, x)


class Correction:
    """A study's own measurements as a correction of a model fitted on other problems: a small
    boosted model of (own fraction − that model's prediction), fitted on the own rows alone.
    The other problems' model stays as fitted; where they hold the family at other shapes,
    refitting it with the own rows weighted in let a few dozen rows of one shape pull the
    whole fit (docs/search.md, "Why the default sampler is what it is"). The rows are one
    family's: no family column, and the columns with no value (other families' parameters)
    are left out."""

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = _seed(seed)
        self._model: Any = None
        self._columns = np.ones(len(FEATURES), dtype=bool)

    def fit(self, x: np.ndarray, residuals: np.ndarray) -> Correction:
        from threadpoolctl import threadpool_limits

        self._columns = ~np.all(np.isnan(x), axis=0)
        # leaves of a few rows: there are tens of own rows, not thousands
        self._model = _boosted(self.seed, max(2, len(x) // 8))
        with threadpool_limits(1):  # (as CostModel.fit)
            self._model.fit(x[:, self._columns], residuals)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return _predict(self._model, self._columns, x)


def _seed(seed: int | None) -> int:
    """A seed scikit-learn takes (None: 0)."""
    return 0 if seed is None else int(seed) % (2**32)


def _boosted(seed: int, min_samples_leaf: int, categorical: np.ndarray | None = None,
             rounds: int = MAX_ITER) -> Any:
    """The boosted trees both models fit (``MAX_ITER`` rounds and its kin), seeded."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        max_iter=rounds, learning_rate=LEARNING_RATE, max_leaf_nodes=MAX_LEAF_NODES,
        min_samples_leaf=min_samples_leaf, categorical_features=categorical,
        early_stopping=False, random_state=seed)


def _predict(model: Any, columns: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``model``'s predictions over the columns it was fitted on, on one thread: OpenMP's worker
    threads (GNU libgomp) do not survive a fork, and a process forked after a multi-threaded
    prediction hung in its first one; a live study refits on a
    background thread instead (ModelSampler)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return model.predict(np.asarray(x, dtype=np.float64)[:, columns])


def preload() -> None:
    """Import what ``fit`` needs: the first fit would otherwise import scikit-learn on the
    tuner's main thread in the middle of a study (1-1.6 s with the GPU waiting)."""
    import sklearn.ensemble  # noqa: F401
    import threadpoolctl  # noqa: F401


def _geometry_of(family: Any, example: Example) -> Geometry | None:
    """The config's launch geometry, or None where the family (as installed) can no longer lay
    it out (a stored config of an older version of the family may name values it no longer
    has)."""
    try:
        return geometry(family, example.config, example.problem.m, example.problem.n,
                        example.problem.k)
    except (kernels.ConfigError, KeyError, ValueError, ZeroDivisionError):
        return None
