"""A learned cost model: which accepted configs of a problem are likely fast, from what other
problems (other shapes, families, GPU models) measured.

What it reads of a config (``features``) is known before anything is compiled or measured:
the launch geometry (``tuner.search.prior.Geometry``: block tile, threads, split of K, dynamic
shared memory), what follows from it on the target GPU (registers, ``Registers``; blocks resident
per SM, rounds of blocks on the busiest SM, idle share of the last round, padding of edge
tiles, the static prior's throughput terms), the problem's size, and the family's own
parameters (log2, by name; NaN where a family lacks one). The family itself is a feature as
well, so measurements of the same family at other shapes weigh most.

What it predicts is a config's GFLOP/s as a fraction of the best measured on the same (GPU
model, family, problem): absolute speed differs between GPUs and shapes, the order within a
problem is what a search needs. Failed configs (compile, launch, wrong result, crash) count
as 0. The regressor is scikit-learn's histogram gradient boosting (one thread, a fixed seed:
the same examples give the same predictions), the anchor being TVM MetaSchedule's boosted
trees over program features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

import kernels

from tuner.problem import Problem
from tuner.measure.resources import Usage
from tuner.search.prior import (
    GLOBAL_REUSE_HALF,
    LATENCY_WARPS,
    SMEM_LOADS_PER_OPERAND,
    STAGED_DEPTH_HALF,
    Geometry,
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
    "log2_splits", "shared_kib", "outputs_per_thread", "registers", "blocks_per_sm",
    "resident_warps", "rounds", "last_round_idle", "edge_waste", "log2_k_per_split",
    "issue", "smem_term", "global_term", "staging_term", "log2_blocks_per_sm_count",
    "prior_rate",  # the static prior's estimate over the best estimate among the configs given
)
FEATURES: tuple[str, ...] = (*GEOMETRY_FEATURES, "family", *(f"p_{p}" for p in PARAMS))
FAMILY_COLUMN = FEATURES.index("family")
PRIOR_RATE = FEATURES.index("prior_rate")

# Boosting set-up: small trees, few rounds (a few thousand examples; fitting must stay well
# under a second on one core, as the sampler refits during a study).
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
    registers: int | None = None  # ptxas's report of its compile, where known

    @property
    def unit(self) -> tuple[str, str, str]:
        """The (GPU model, family, shape) it belongs to: the unit normalised together and
        held out together."""
        return (self.gpu, self.family, self.problem.shape)


RegisterKey = tuple[str, str, tuple[tuple[str, int], ...]]  # (arch, family, config)


def register_key(arch: str, family: str, config: Mapping[str, int]) -> RegisterKey:
    return arch, family, tuple(sorted((str(k), int(v)) for k, v in config.items()))


def features(family: Any, config: Mapping[str, int], problem: Problem, target: Target,
             registers: int | None = None) -> list[float]:
    """The feature vector of one config (order: ``FEATURES``); ``registers``: ptxas's (reported
    or predicted, ``Registers``), else the prior's estimate from the outputs per thread."""
    return _features(geometry(family, config, problem.m, problem.n, problem.k), problem, target,
                     registers, _identity(family, config))


def _features(geom: Geometry, problem: Problem, target: Target, registers: int | None,
              identity: list[float]) -> list[float]:
    m, n, k = problem.m, problem.n, problem.k
    usage = Usage(registers=int(registers)) if registers else estimated_usage(geom)
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
    return [
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
        *identity,
    ]


def _identity(family: Any, config: Mapping[str, int]) -> list[float]:
    """The family and its parameters (log2; NaN for a parameter the family lacks)."""
    return [float(FAMILY_NAMES.index(family.name)) if family.name in FAMILY_NAMES else math.nan,
            *(math.log2(config[p]) if p in config and config[p] > 0
              else (0.0 if p in config else math.nan) for p in PARAMS)]


def register_inputs(geom: Geometry, identity: list[float]) -> list[float]:
    """What a config's registers follow from (``Registers``'s regressor reads it): the block's
    layout, the estimate, the family and its parameters; not the problem's size, which ptxas
    never sees."""
    bm, bn = geom.tile
    return [math.log2(bm), math.log2(bn), math.log2(geom.threads),
            math.log2(max(geom.splits, 1)), geom.shared_bytes / 1024, geom.outputs_per_thread,
            estimated_usage(geom).registers, *identity]


class Registers:
    """ptxas's registers per thread of configs: reported where the config compiled for any
    problem of the examples (registers depend on the config and the architecture, not on the
    shape), else predicted by boosted trees fitted on those reports of the same architecture
    (``register_inputs``, the estimate among them). The prior's estimate, max(q + 64, 1.8·q),
    is 1.4-2× under ptxas on tf32x3 and vectorized; the model reading these instead needs
    fewer measurements on the recordings, leave-one-out (bench/NOTES.md, session 17)."""

    def __init__(self, examples: Iterable[Example] = ()) -> None:
        self._reports: dict[RegisterKey, Example] = {}
        for example in examples:
            if example.registers:
                key = register_key(example.target.arch, example.family, example.config)
                self._reports[key] = example

    def reported(self, arch: str, family: str, config: Mapping[str, int]) -> int | None:
        example = self._reports.get(register_key(arch, family, config))
        return None if example is None else example.registers

    def predict(self, arch: str, x: np.ndarray) -> np.ndarray | None:
        """Registers of configs from their ``register_inputs`` rows; None where no report of
        this architecture is there to learn from."""
        reports = tuple(sorted((key, e.registers) for key, e in self._reports.items()
                               if key[0] == arch))
        if reports not in _register_models:  # the studies of one command read the same reports
            if len(_register_models) >= 8:
                _register_models.pop(next(iter(_register_models)))
            _register_models[reports] = _register_model([self._reports[k] for k, _ in reports])
        fitted = _register_models[reports]
        if fitted is None:
            return None
        from threadpoolctl import threadpool_limits

        columns, model = fitted
        with threadpool_limits(1):
            return np.clip(np.rint(model.predict(x[:, columns])), 1, 255)


REGISTER_FAMILY_INPUT = 7  # register_inputs' family column
_register_models: dict[tuple[tuple[RegisterKey, int | None], ...],
                       tuple[list[int], Any] | None] = {}


def _register_model(examples: Sequence[Example]) -> tuple[list[int], Any] | None:
    """Boosted trees from ``register_inputs`` to the reported registers (with the columns
    they read); None where too few reports."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    usable = [(kernels.FAMILIES[e.family], e) for e in examples if e.family in kernels.FAMILIES]
    usable = [(family, e) for family, e in usable if _geometry_ok(family, e)]
    if len(usable) < 2 * MIN_SAMPLES_LEAF:
        return None
    x = np.array([register_inputs(geometry(family, e.config, e.problem.m, e.problem.n,
                                           e.problem.k), _identity(family, e.config))
                  for family, e in usable])
    y = np.array([float(e.registers or 0) for _, e in usable])
    # a column no report has (a parameter of families not among them) says nothing
    columns = [c for c in range(x.shape[1]) if not np.all(np.isnan(x[:, c]))]
    model = HistGradientBoostingRegressor(
        max_iter=MAX_ITER, learning_rate=LEARNING_RATE, max_leaf_nodes=MAX_LEAF_NODES,
        min_samples_leaf=MIN_SAMPLES_LEAF,
        categorical_features=np.array([c == REGISTER_FAMILY_INPUT for c in columns]),
        early_stopping=False, random_state=0)
    with threadpool_limits(1):
        model.fit(x[:, columns], y)
    return columns, model


def matrix(family: Any, configs: Sequence[Mapping[str, int]], problem: Problem,
           target: Target, registers: Registers | None = None) -> np.ndarray:
    """Feature rows of configs of one problem. The prior's rate is only an order within a
    problem: it is divided by its largest value among ``configs`` (pass every accepted config,
    or every measured one of a full recording, so that the two mean the same). ``registers``:
    ptxas's reports and predictions (without: the estimate)."""
    geoms = [geometry(family, c, problem.m, problem.n, problem.k) for c in configs]
    identities = [_identity(family, c) for c in configs]
    known: list[int | None] = [None] * len(configs)
    if registers is not None:
        known = [registers.reported(target.arch, family.name, c) for c in configs]
        unknown = [i for i, r in enumerate(known) if r is None]
        predicted = registers.predict(target.arch, np.array(
            [register_inputs(geoms[i], identities[i]) for i in unknown])) if unknown else None
        if predicted is not None:
            for i, value in zip(unknown, predicted):
                known[i] = int(value)
    x = np.array([_features(g, problem, target, r, i)
                  for g, r, i in zip(geoms, known, identities)], dtype=np.float64)
    if not len(x):
        return x
    column = x[:, PRIOR_RATE]
    top = column.max()
    x[:, PRIOR_RATE] = column / top if top > 0 else 0.0
    return x


def fractions(gflops: Sequence[float]) -> np.ndarray:
    """GFLOP/s as a fraction of the best of the same unit (all zeros where none ran)."""
    values = np.asarray(gflops, dtype=np.float64)
    best = values.max() if len(values) else 0.0
    return values / best if best > 0 else np.zeros_like(values)


class CostModel:
    """Predicts, for configs of one problem, their GFLOP/s as a fraction of that problem's
    best. ``fit`` on examples (normalised per unit); ``add`` rows normalised by the caller
    (a study's own measurements, weighted)."""

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = 0 if seed is None else int(seed) % (2**32)
        self._rows: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []
        self._model: Any = None
        self._columns = np.ones(len(FEATURES), dtype=bool)  # the columns the fit used

    def copy(self) -> CostModel:
        """The same rows, unfitted (rows are shared: they are never changed in place)."""
        other = CostModel(self.seed)
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

    def add_examples(self, examples: Iterable[Example], weight: float = 1.0) -> None:
        """Examples grouped by unit, each unit normalised by its own best; registers as
        ptxas reported them (predicted from the examples' reports where it did not: a failed
        compile)."""
        examples = list(examples)
        registers = Registers(examples)
        units: dict[tuple[str, str, str], list[Example]] = {}
        for example in examples:
            units.setdefault(example.unit, []).append(example)
        for unit_examples in units.values():
            first = unit_examples[0]
            family = kernels.get_family(first.family)
            usable = [e for e in unit_examples if _geometry_ok(family, e)]
            if not usable:
                continue
            self.add(matrix(family, [e.config for e in usable], first.problem, first.target,
                            registers),
                     fractions([e.gflops for e in usable]), weight)

    def fit(self) -> CostModel:
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        if not self._rows:
            self._model = None
            return self
        x = np.concatenate(self._rows)
        y = np.concatenate(self._targets)
        w = np.concatenate(self._weights)
        # a column no example has (a parameter of families not in the data) says nothing
        self._columns = ~np.all(np.isnan(x), axis=0)
        x = x[:, self._columns]
        categorical = np.zeros(len(FEATURES), dtype=bool)
        categorical[FAMILY_COLUMN] = True
        categorical = categorical[self._columns]
        self._model = HistGradientBoostingRegressor(
            max_iter=MAX_ITER, learning_rate=LEARNING_RATE, max_leaf_nodes=MAX_LEAF_NODES,
            min_samples_leaf=min(MIN_SAMPLES_LEAF, max(1, len(x) // 4)),
            categorical_features=categorical, early_stopping=False, random_state=self.seed)
        # one thread: deterministic, and the CPU's other cores are compiling candidates
        with threadpool_limits(1):
            self._model.fit(x, y, sample_weight=w)
        return self

    @property
    def fitted(self) -> bool:
        return self._model is not None

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self._model is None:
            raise RuntimeError("the cost model has not been fitted (no examples)")
        from threadpoolctl import threadpool_limits

        # one thread: OpenMP's worker threads (GNU libgomp) do not survive a fork, and a process
        # forked after a multi-threaded prediction hung in its first one (bench/NOTES.md,
        # session 15); a live study refits on a background thread instead (ModelSampler)
        with threadpool_limits(1):
            return self._model.predict(np.asarray(x, dtype=np.float64)[:, self._columns])


def preload() -> None:
    """Import what ``fit`` needs: the first fit would otherwise import scikit-learn on the
    tuner's main thread in the middle of a study (1-1.6 s with the GPU waiting)."""
    import sklearn.ensemble  # noqa: F401
    import threadpoolctl  # noqa: F401


def _geometry_ok(family: Any, example: Example) -> bool:
    """Whether the family (as installed) can still lay out this config (a stored config of an
    older version of the family may name values it no longer has)."""
    try:
        geometry(family, example.config, example.problem.m, example.problem.n,
                 example.problem.k)
    except (kernels.ConfigError, KeyError, ValueError, ZeroDivisionError):
        return False
    return True
