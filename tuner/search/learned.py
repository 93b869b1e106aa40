"""``--sampler model``: propose the accepted config a learned cost model ranks best.

The model (``tuner.search.costmodel``) is fitted on what other problems measured — the results
database's trials of other shapes and GPU models (``examples_from_database``), or in the
benchmark the other recordings (``examples_from_recordings``, which is where the
leave-one-out split lives). Where the examples hold the family at other shapes, two fits are
made (``Bases``): with what each config measured at the other shapes (``costmodel.Transfer``:
at the nearest one, and its best at any) and without it; the study asks their rankings in
turn until its own results say which of the two orders them better, and that order in turn
with its breadth-first regrouping by decomposition (block tile and split), so that a
decomposition both fits misjudge is still reached early (``Bases.alternated``).
As the study goes on, its own measurements are learned as they grow (``REFIT_GROWTH``): where
the examples hold the family at other shapes, as a correction of those fits
(``costmodel.Correction``, fitted on the own rows alone); else (the model knows the family only
from the static prior's start-up) by refitting on the examples and the own rows, weighted
(``OWN_WEIGHT``) so that together they count as much as all the other examples.
Each ask takes the unmeasured accepted config with the highest prediction whose geometry
group holds fewer than ``PENDING_PER_GROUP`` configs still waiting for their result (a window
of candidates in flight is spread over geometries); one ask in ``1/EPSILON`` takes a uniform
one instead (an estimate that is wrong about a region would otherwise never be corrected
there), as TVM MetaSchedule's epsilon-greedy search does. With nothing of the family to learn
from yet (a fresh database, or examples of other families only), the start-up is the static
prior's (``SearchSpace.startup``): what other families teach the model transfers worse than the
prior (docs/search.md, "Why the default sampler is what it is").
"""

from __future__ import annotations

import logging
import operator
import os
import random
from collections import Counter
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

import kernels

from tuner.problem import Problem
from tuner.search.costmodel import (FEATURES, TRANSFER_COLUMNS, CostModel, Correction, Example,
                                    MAX_ITER, Unit, lay_out, matrix, transfer_of)
from tuner.search.prior import PER_GROUP, Target

log = logging.getLogger(__name__)

COSTLESS = ("rejected", "missing")  # never compiled nor run: not an example
# One own measurement counts as at least this many examples of another problem, and the own
# ones together as much as all of those (docs/search.md, "The study's own results").
OWN_WEIGHT = 20.0
REFIT_GROWTH = 1.25  # refit when the study's measurements grew by a quarter (and by ≥ 2)
EPSILON = 0.1  # share of asks that take a uniform accepted config
STARTUP_TRIALS = 4  # own measurements before a model of own data alone is fitted
# Own measurements before the study trusts one of its two fits (``Bases.trusted``); until
# then it alternates between them.
TRUST_AFTER = 8
MAX_EXAMPLES = 10_000  # examples of other problems a fit's rows take at most (``capped``)
# For these families, where the examples hold the family at LARGE_FROM_SHAPES shapes or more,
# the fit on them boosts LARGE_ROUNDS rounds instead of costmodel.MAX_ITER: the cap's 10,000
# rows carry more trees than the few thousand the default was sized for. tf32x3 lost pairs
# with it (docs/search.md, "Why the default sampler is what it is").
LARGE_FAMILIES = frozenset({"pipelined", "splitk", "skinny"})
LARGE_FROM_SHAPES = 4
LARGE_ROUNDS = 200
# Configs of one geometry group (same block tile, threads, split) in flight at once, at most,
# while another group has an unseen config: as many as the prior's start-up measures per group.
PENDING_PER_GROUP = PER_GROUP
GROUP_FEATURES = ("log2_tile_rows", "log2_tile_cols", "log2_threads", "log2_splits",
                  "shared_kib")
# What decides the searched shape's waves and tile edges: a coarser group (``decompositions``)
DECOMPOSITION_FEATURES = ("log2_tile_rows", "log2_tile_cols", "log2_splits")

HeldOut = Callable[[Unit], bool]  # units that must not reach a fit


def nothing_held_out(unit: Unit) -> bool:
    return False


def problem_held_out(gpu: str, shape: str) -> HeldOut:
    """Every family's measurements of one problem on one GPU model: a shape the service has
    never seen (the benchmark's leave-one-out unit)."""
    return lambda unit: unit[0] == gpu and unit[2] == shape


def examples_from_recordings(recordings: Sequence[Any], held_out: HeldOut = nothing_held_out
                             ) -> list[Example]:
    """Every measured config of every (family, problem) of the recordings, except the units
    ``held_out`` (leave-one-out: what is being searched never reaches its own fit)."""
    examples = []
    for recording in recordings:
        gpu = str(recording.gpu["name"])
        target = Target(int(recording.gpu["sm_count"]), recording.arch)
        for family, problem in recording.pairs():
            if held_out((gpu, family, problem.shape)) or family not in kernels.FAMILIES:
                continue
            for config, result in recording.results(family, problem):
                if result.state in COSTLESS:
                    continue
                examples.append(Example(gpu, target, family, dict(config), problem,
                                        float(result.gflops or 0.0) if result.usable else 0.0))
    return examples


def lay_out_bundled(gpu: str, name: str) -> int:
    """In a process the command's start leaves idle (a compile worker): the cost model's feature
    rows of the units of one bundled recording of ``gpu``, onto the disk cache the command's
    start-ups then read (``tuner.search.rowcache``), as ``CostModel.add_examples`` lays them
    out; the units laid out. With a fresh cache the first start-up spent most of its time on
    them, with the GPU idle (docs/measurement.md, "The command's start and end")."""
    from tuner.measure.recording import bundled_file

    recording = bundled_file(name)
    if recording.gpu.get("name") != gpu:
        return 0
    return lay_out(examples_from_recordings([recording]))


def examples_from_database(database: Any, families: Collection[str],
                           held_out: HeldOut = nothing_held_out) -> list[Example]:
    """Every measured trial of ``families`` the results database holds, except ``held_out``."""
    examples = []
    for row in database.measured_configs([f for f in families if f in kernels.FAMILIES]):
        problem = Problem(row.m, row.n, row.k)
        if held_out((row.gpu_name, row.family, problem.shape)):
            continue
        examples.append(Example(
            row.gpu_name, Target(row.sm_count, kernels.arch_of(row.compute_capability)), row.family,
            row.params, problem, float(row.gflops or 0.0) if row.state == "ok" else 0.0))
    return examples


def examples_for_study(database: Any, gpu: str, problem: Problem, recordings: bool, *,
                       from_database: list[Example] | None = None) -> list[Example]:
    """What a live study's model learns from: every measured trial the results database holds
    and (``recordings``) the bundled recordings of its GPU model (``tuner.measure.recording.
    bundled``), except those of its own shape on its GPU model, of every family: the unit the
    benchmark holds out (``problem_held_out``), so that the live model is the one
    bench/search_efficiency.py measured, and so that it depends on nothing the command measures
    at that shape (its fit can be prepared ahead, ``tuner.search.prefetch``). The database's
    part first (``database_examples``, or ``from_database`` where already read), then the
    recordings' (``bundled_examples``, less the shape's)."""
    examples = list(database_examples(database, gpu, problem) if from_database is None
                    else from_database)
    if recordings:
        examples += _bundled_examples(gpu, problem.shape)
    return examples


def database_examples(database: Any, gpu: str, problem: Problem) -> list[Example]:
    """``examples_for_study``'s first part: the results database's."""
    return examples_from_database(database, list(kernels.FAMILIES),
                                  problem_held_out(gpu, problem.shape))


@lru_cache(maxsize=2)
def bundled_examples(gpu: str) -> tuple[Example, ...]:
    """Every example of the bundled recordings of this GPU model, none held out."""
    from tuner.measure.recording import bundled

    return tuple(examples_from_recordings(bundled(gpu)))


def without_shape(examples: Sequence[Example], gpu: str, shape: str) -> tuple[Example, ...]:
    """``examples`` less the unit ``problem_held_out(gpu, shape)`` holds out, in their order:
    ``examples_from_recordings`` with that unit held out, from the examples of none held out
    (by ``Example.unit``, formatted once per example and kept: the fits read it again)."""
    return tuple(e for e in examples if e.gpu != gpu or e.unit[2] != shape)


@lru_cache(maxsize=16)
def _bundled_examples(gpu: str, shape: str) -> tuple[Example, ...]:
    return without_shape(bundled_examples(gpu), gpu, shape)


IDENTITY = operator.attrgetter("identity")  # Example.identity, a sort key


def capped(examples: Sequence[Example], family: str, limit: int = MAX_EXAMPLES,
           seed: int | None = 0) -> list[Example]:
    """At most ``limit`` examples, the family's own first, then a seeded sample of the others:
    the rows of a fit (``offline_model``), whose time grows with them (3,400 rows: 0.2-0.4 s on
    one idle core of the 2-core CI machine); what it reads of them (each unit's best, the
    transfer columns) comes from all the examples. Sorted before sampling,
    so that the examples kept and their order depend on which examples there are, not on the
    order the database or the caller listed them in."""
    own = sorted((e for e in examples if e.family == family), key=IDENTITY)
    if len(own) >= limit and len(examples) > limit:  # the others are not drawn: not sorted
        return random.Random(seed).sample(own, limit)
    others = sorted((e for e in examples if e.family != family), key=IDENTITY)
    if len(examples) <= limit:
        return own + others
    return own + random.Random(seed).sample(others, limit - len(own))


def geometry_groups(x: np.ndarray) -> np.ndarray:
    """Each config's geometry group (``prior.Geometry.key``: block tile, threads, split, shared
    memory) as a number, from its feature row."""
    return _groups(x, GROUP_FEATURES)


def decompositions(x: np.ndarray) -> np.ndarray:
    """Each config's decomposition of the problem (block tile and split) as a number, from its
    feature row."""
    return _groups(x, DECOMPOSITION_FEATURES)


def _groups(x: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Rows with equal values of the features ``names``: one number per group."""
    _, group = np.unique(x[:, [FEATURES.index(name) for name in names]], axis=0,
                         return_inverse=True)
    return group.reshape(-1)


def first_picks(x: np.ndarray, scores: np.ndarray, count: int) -> list[int]:
    """The rows the model's first ``count`` asks take when nothing is measured yet: the best
    scores, at most ``PENDING_PER_GROUP`` of one geometry group (``ModelSampler._spread_best``;
    the uniform asks, one in 1/EPSILON, aside). What the prefetch compiles ahead."""
    group = geometry_groups(x)
    picks: list[int] = []
    waiting: dict[int, int] = {}
    for row in np.argsort(-scores, kind="stable"):
        if waiting.get(group[row], 0) < PENDING_PER_GROUP:
            picks.append(int(row))
            waiting[group[row]] = waiting.get(group[row], 0) + 1
            if len(picks) == count:
                break
    return picks


FitKey = tuple[int, tuple[tuple[Unit, int], ...]]


def fit_key(seed: int | None, examples: Sequence[Example]) -> FitKey:
    """What a fit on examples of other problems depends on: the model's seed and the examples
    (by unit and count: a unit's measurements only grow, and the fit reads all of them)."""
    counts = Counter(example.unit for example in examples)  # (kept on each example)
    return CostModel(seed).seed, tuple(sorted(counts.items()))


@dataclass(frozen=True)
class Bases:
    """Two fits on the examples of other problems, as scores of the accepted configs: with
    the transfer columns (``costmodel.Transfer``: what each config measured at other shapes)
    and without them. The first wins where a recorded neighbour shares the searched shape's
    optimum and loses where it does not (docs/search.md, "The fit"); the study cannot tell
    which before it measures, so it alternates between them (``alternated``) until its own
    results say which orders them better (``trusted``)."""

    transfer: np.ndarray
    plain: np.ndarray
    parts: np.ndarray | None = None  # each config's decomposition (``decompositions``)

    @classmethod
    def fit(cls, offline: CostModel, x: np.ndarray) -> Bases:
        return cls(offline.copy().fit().predict(x),
                   offline.copy(ignored=TRANSFER_COLUMNS).fit().predict(x), decompositions(x))

    def alternated(self, transfer: np.ndarray | None = None, plain: np.ndarray | None = None
                   ) -> np.ndarray:
        """Scores that order the configs as the two rankings taken in turn (the transfer
        one's first), each config at its first place; ``transfer``/``plain``: corrected
        scores in place of the bases. With ``parts``, that order is taken in turn with its
        own ``breadth_first`` regrouping: where both fits misjudge the searched shape's best
        decomposition (a wave-quantization needle, a split), the first window still reaches
        it (docs/search.md, "The fit")."""
        first = np.argsort(-(self.transfer if transfer is None else transfer), kind="stable")
        second = np.argsort(-(self.plain if plain is None else plain), kind="stable")
        order = _in_turn(first, second)
        if self.parts is not None:
            order = _in_turn(order, breadth_first(order, self.parts))
        scores = np.empty(len(first), dtype=np.float64)
        scores[order] = -np.arange(len(first), dtype=np.float64)
        return scores

    def trusted(self, rows: Sequence[int], values: np.ndarray) -> np.ndarray | None:
        """The base whose order agrees better (Spearman) with the study's own measurements
        of ``rows``; None while they cannot tell (too few, or a tie)."""
        if len(rows) < TRUST_AFTER:
            return None
        agree = [_spearman(base[list(rows)], values) for base in (self.transfer, self.plain)]
        if agree[0] == agree[1]:
            return None
        return self.transfer if agree[0] > agree[1] else self.plain


def _in_turn(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The two orders' entries taken in turn, each at its first place."""
    order = np.stack([first, second], axis=1).reshape(-1)
    _, at = np.unique(order, return_index=True)
    return order[np.sort(at)]


def breadth_first(order: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """``order`` regrouped by ``parts``: the first config of each part (the parts in the order
    of their first configs), then the second of each, and so on."""
    ordered = parts[order]
    _, first_at, inverse = np.unique(ordered, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse)
    within = np.empty(len(order), dtype=np.int64)  # each config's place within its part
    within[np.argsort(inverse, kind="stable")] = (np.arange(len(order))
                                                  - np.repeat(np.cumsum(counts) - counts, counts))
    return order[np.argsort(within * len(order) + first_at[inverse], kind="stable")]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation; -inf where either side is constant (it orders nothing)."""
    from scipy.stats import spearmanr

    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return -np.inf
    return float(spearmanr(a, b).statistic)


@dataclass(frozen=True)
class PreparedFit:
    """The model sampler's first fit, made ahead (``tuner.search.prefetch``): the examples of
    other problems as rows (``offline``) and, where they hold the family, both fits' scores of
    every accepted config (``Bases``; a study's first asks read ``scores``). 0.4-1.2 s of CPU
    per study at 2048³ that the main thread, with the GPU idle, no longer spends."""

    key: FitKey
    offline: CostModel
    bases: Bases | None

    @cached_property  # read by the prefetch's first picks and the sampler's first asks: once
    def scores(self) -> np.ndarray | None:
        return None if self.bases is None else self.bases.alternated()


def prepare_fit(family: str, examples: Sequence[Example], x: np.ndarray, seed: int | None
                ) -> PreparedFit:
    """What ``ModelSampler`` computes at its first ask from these examples (``x``: the feature
    rows of the study's accepted configs)."""
    offline = offline_model(examples, family, seed)
    bases = (Bases.fit(offline, x)
             if offline.rows and learns_family(examples, family) else None)
    return PreparedFit(fit_key(seed, examples), offline, bases)


@dataclass(frozen=True)
class LearnedSpace:
    """What the model sampler needs beyond ``SearchSpace``: every accepted config (positions,
    every parameter) with its feature row, and the examples of other problems; ``fitted``: its
    first fit on them, where made ahead for the same examples and seed."""

    configs: Sequence[Mapping[str, int]]
    x: np.ndarray
    examples: Sequence[Example]
    family: str  # the searched family's name
    fitted: PreparedFit | None = None

    @classmethod
    def build(cls, family: Any, accepted: Sequence[Mapping[str, int]],
              positions: Sequence[Mapping[str, int]], problem: Problem, target: Target,
              examples: Sequence[Example], geometries: Sequence[Any] | None = None) -> LearnedSpace:
        """``accepted``: configs (values); ``positions``: the same configs as study params;
        ``geometries``: each config's launch geometry, where the caller has them already."""
        x = matrix(family, accepted, problem, target, geometries)
        return cls(list(positions), space_rows(family.name, x, accepted, problem, target,
                                               examples), list(examples), family.name)


def space_rows(family: str, x: np.ndarray, accepted: Sequence[Mapping[str, int]],
               problem: Problem, target: Target, examples: Sequence[Example]) -> np.ndarray:
    """``x`` (``matrix`` of the accepted configs) with what the examples measured of each
    config at the other shapes of the family (``costmodel.Transfer``)."""
    return transfer_of(examples).fill(x, family, accepted, problem, target)


def _key(params: Mapping[str, Any], names: Sequence[str]) -> tuple[int, ...]:
    return tuple(int(params[n]) for n in names)


def _keys(positions: Sequence[Mapping[str, int]], names: Sequence[str]) -> list[tuple[int, ...]]:
    """``_key`` of a study's every accepted config at once: their positions are ints already
    (``space.params_from_configs``), read by one C-level getter (tf32x3's 94,500 at each
    study's set-up: 93 → 30 ms on the 2-core machine)."""
    if len(names) < 2:  # (a getter of one name returns the value, of none fails)
        return [_key(p, names) for p in positions]
    get = operator.itemgetter(*names)
    return [get(p) for p in positions]


_fits: ThreadPoolExecutor | None = None


def _fit_thread() -> ThreadPoolExecutor:
    """One thread of the process for background refits (its studies run one at a time)."""
    global _fits
    if _fits is None:
        _fits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="costmodel-fit")
    return _fits


def _forget_fit_thread() -> None:
    global _fits
    _fits = None  # a forked child has no copy of the thread: its own starts when needed


os.register_at_fork(after_in_child=_forget_fit_thread)


class ModelSampler(optuna.samplers.BaseSampler):
    """See the module's docstring. ``startup``: the static prior's picks (positions), given
    where the examples hold no other shape of the family (``learns_family``): measured first.
    ``background``: refits after the first run on a thread while the study goes on asking with
    the scores it has (a refit and its prediction over every accepted config took 0.1-0.4 s of
    the main thread each, a dozen per study, with the GPU waiting);
    the asks then see a refit a few asks later than a replay (synchronous, the default) does."""

    def __init__(self, learned: LearnedSpace, distributions: Mapping[str, BaseDistribution],
                 startup: Sequence[Mapping[str, int]], seed: int | None,
                 background: bool = False) -> None:
        self.learned, self.startup = learned, list(startup)
        self.background = background
        self._fitting: Future[np.ndarray] | None = None  # a background refit's prediction
        # per trial number: its row of ``learned.configs`` (None: not one of them); a trial's
        # params never change once asked, so each is keyed once, not at every ask
        self._rows: dict[int, int | None] = {}
        self.rng = random.Random(seed)
        self.seed = seed
        self.varying = {n: d for n, d in distributions.items() if not d.single()}
        self.constants = {n: d.low for n, d in distributions.items()  # type: ignore[attr-defined]
                          if d.single()}
        fitted = learned.fitted
        if fitted is not None and fitted.key != fit_key(seed, learned.examples):
            raise ValueError("the prepared fit is of other examples or another seed")
        if fitted is None:
            self.offline = offline_model(learned.examples, learned.family, seed)
        else:
            self.offline = fitted.offline
        self.names = list(self.varying)
        self.index = {key: i for i, key in enumerate(_keys(learned.configs, self.names))}
        # for spreading the asks made before their results come back
        self.group = geometry_groups(learned.x)
        self.scores: np.ndarray | None = None
        self.fitted_on = -1  # own measurements in the last fit (-1: none yet)
        self.fits = 0
        # the examples hold the family at other shapes: their fit stays, own rows correct it
        self.correcting = self.offline.rows > 0 and not self.startup
        self._bases: Bases | None = None  # those fits' scores, made once
        if fitted is not None and fitted.bases is not None:
            # as the first ask's fit (no own measurements yet) would have left it
            self.scores, self.fitted_on, self.fits = fitted.scores, 0, 1
            self._bases = fitted.bases

    def reseed_rng(self) -> None:
        self.rng.seed()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return dict(self.varying)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        names = list(search_space)
        seen, running, measured = self._state(study, names, trial.number)
        unseen = np.flatnonzero(~seen)  # ascending, as the configs are listed
        if not len(unseen):
            return {}
        if (self.offline.rows == 0 or self.startup) and len(measured) < STARTUP_TRIALS:
            for params in self.startup:
                row = self.index.get(_key(params, self.names))
                if row is not None and not seen[row]:
                    return {n: int(params[n]) for n in names}
            return self._params(self.rng.choice(unseen), names)
        self._refit(measured)
        if self.rng.random() < EPSILON or self.scores is None:
            return self._params(self.rng.choice(unseen), names)
        return self._params(self._spread_best(unseen, self._waiting(running), self.scores),
                            names)

    def _state(self, study: Study, names: Sequence[str], asking: int | None
               ) -> tuple[np.ndarray, list[FrozenTrial], list[FrozenTrial]]:
        """Which accepted configs are measured or in flight, the trials in flight (but the
        one ``asking``), and the measured ones."""
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.number != asking]
        # an array over the accepted configs, not a key per config and ask (tens of thousands
        # of configs: ~0.1 s of the main thread per ask, the GPU idle)
        seen = np.zeros(len(self.learned.configs), dtype=bool)
        rows = [row for t in [*done, *running] if (row := self._row(t, names)) is not None]
        seen[rows] = True
        measured = [t for t in done if t.user_attrs.get("state") not in COSTLESS
                    and set(names) <= t.params.keys() and t.value is not None]
        return seen, running, measured

    def _row(self, trial: FrozenTrial, names: Sequence[str]) -> int | None:
        """The trial's row of ``learned.configs``, or None where it is not one of them."""
        try:
            return self._rows[trial.number]
        except KeyError:
            whole = set(names) <= trial.params.keys()
            row = self.index.get(_key(trial.params, self.names)) if whole else None
            if whole or trial.state.is_finished():  # (not one still being asked)
                self._rows[trial.number] = row
            return row

    def _waiting(self, running: Sequence[FrozenTrial]) -> dict[int, int]:
        """Configs in flight per geometry group."""
        rows = [row for t in running if (row := self._row(t, self.names)) is not None]
        groups, counts = np.unique(self.group[rows], return_counts=True)
        return {int(g): int(c) for g, c in zip(groups, counts)}

    def _spread_best(self, unseen: np.ndarray, waiting: Mapping[int, int],
                     scores: np.ndarray) -> int:
        """The best-predicted unseen config whose geometry group holds fewer than
        ``PENDING_PER_GROUP`` configs still waiting for their result (else the best): with a
        window of candidates in flight, a model wrong about one geometry would otherwise fill
        the whole window with it before its first result could say so."""
        full = [g for g, count in waiting.items() if count >= PENDING_PER_GROUP]
        candidates = np.asarray(unseen)
        chosen = scores[candidates]
        open_ = ~np.isin(self.group[candidates], full)
        if open_.any():  # argmax takes the first of equal scores, as max() over the list did
            chosen = np.where(open_, chosen, -np.inf)
        return int(candidates[int(np.argmax(chosen))])

    def upcoming(self, study: Study, count: int) -> list[int]:
        """The rows (of ``learned.configs``) the next ``count`` asks would take if no result
        came back meanwhile, best first: between refits the scores do not change, so a live
        study can begin their compiles while its compile workers idle (the uniform asks, one
        in 1/EPSILON, aside). Nothing is asked, refitted or drawn from the sampler's rng; []
        while the start-up runs or no fit has scores."""
        fitting = self._fitting
        scores = (fitting.result() if fitting is not None and fitting.done() else self.scores)
        if scores is None or count < 1:
            return []
        seen, running, measured = self._state(study, self.names, None)
        if (self.offline.rows == 0 or self.startup) and len(measured) < STARTUP_TRIALS:
            return []
        waiting = self._waiting(running)
        rows: list[int] = []
        for _ in range(count):
            unseen = np.flatnonzero(~seen)
            if not len(unseen):
                break
            row = self._spread_best(unseen, waiting, scores)
            rows.append(row)
            seen[row] = True
            waiting[int(self.group[row])] = waiting.get(int(self.group[row]), 0) + 1
        return rows

    def first_picks(self, study: Study, count: int) -> list[int]:
        """``upcoming`` before the study's first ask: fitted now on the examples of other
        problems where no fit was made ahead (as the first ask would fit them); [] where the
        start-up (the static prior) goes first."""
        if self.scores is None and self._fitting is None and self.offline.rows > 0 and not self.startup:
            self._refit([])
        return self.upcoming(study, count)

    def holds_asks(self, study: Study) -> bool:
        """Whether the study should ask nothing for now: its next ask would wait for the first
        fit of its own measurements (the static prior's start-up measured, no scores yet), which
        this begins on the fit thread where not begun. Meanwhile the study hands the GPU what has
        compiled, instead of fitting on its main thread with the GPU idle (docs/measurement.md,
        "The first fit off the main thread"). Background samplers only: a replay asks as before."""
        if not self.background or self.scores is not None:
            return False
        if self._fitting is None:
            _, _, measured = self._state(study, self.names, None)
            if (self.offline.rows == 0 or self.startup) and len(measured) < STARTUP_TRIALS:
                return False  # the start-up's picks need no fit
            self._refit(measured, first_too=True)
        return self._fitting is not None and not self._fitting.done()

    def _params(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        return {n: int(self.learned.configs[index][n]) for n in names}

    def _refit(self, measured: Sequence[FrozenTrial], first_too: bool = False) -> None:
        """Fit offline + own rows when the own ones grew enough since the last fit (in the
        background, one at a time, where so constructed and a fit's scores exist already, or
        ``first_too``). An ask without scores waits for a fit in the background."""
        if self._fitting is not None and (self._fitting.done() or self.scores is None):
            self.scores, self._fitting = self._fitting.result(), None
            self.fits += 1
        count = len(measured)
        if self._fitting is not None or (
                self.fitted_on >= 0 and count < max(self.fitted_on + 2,
                                                    self.fitted_on * REFIT_GROWTH)):
            return
        rows = [self.index.get(_key(t.params, self.names)) for t in measured]
        values = np.array([float(t.value) for t, r in zip(measured, rows) if r is not None])
        rows_ok = [r for r in rows if r is not None]
        own = rows_ok and values.max() > 0
        x = self.learned.x
        predict: Callable[[], np.ndarray]
        if self.correcting:
            if self._bases is None:
                self._bases = Bases.fit(self.offline, x)
            bases = self._bases
            if own and len(rows_ok) >= 2:
                rates = values / values.max()
                predict = lambda: _corrected(bases, x, rows_ok, rates, self.offline.seed)
            else:
                predict = bases.alternated
        else:
            model = self.offline.copy()
            if own:
                # the own rows together weigh as much as all examples of other problems
                weight = max(OWN_WEIGHT, self.offline.rows / len(rows_ok))
                model.add(x[rows_ok], values / values.max(), weight)
            if model.rows == 0:
                return
            predict = lambda: model.fit().predict(x)
        self.fitted_on = count
        if self.background and (self.scores is not None or first_too):
            self._fitting = _fit_thread().submit(predict)
            return
        self.scores = predict()
        self.fits += 1

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if param_distribution.single():
            return param_distribution.low  # type: ignore[attr-defined]
        # only reached when every accepted config was measured: the study then stops
        return optuna.samplers.RandomSampler(seed=self.rng.randrange(2**31)).sample_independent(
            study, trial, param_name, param_distribution)


def _corrected(bases: Bases, x: np.ndarray, rows: Sequence[int], rates: np.ndarray,
               seed: int) -> np.ndarray:
    """The trusted base corrected by the own rates of ``rows`` (``costmodel.Correction``);
    while neither is trusted, both corrected, alternated."""
    def corrected(base: np.ndarray) -> np.ndarray:
        return base + Correction(seed).fit(x[list(rows)], rates - base[list(rows)]).predict(x)

    trusted = bases.trusted(rows, rates)
    if trusted is not None:
        return corrected(trusted)
    return bases.alternated(corrected(bases.transfer), corrected(bases.plain))


# The hybrid sampler's start-up: this many of the cost model's top-ranked configs first, then
# the static prior's picks (an experiment, docs/search.md, "The static prior and the prior
# set-up": the model wins where another shape of the same family transfers, the prior where
# none does).
HYBRID_PICKS = 3


def offline_model(examples: Sequence[Example], family: str, seed: int | None) -> CostModel:
    """The examples of other problems as the rows of one model, unfitted: at most
    ``MAX_EXAMPLES`` of them (``capped``), their labels and transfer columns read from all
    (``CostModel.add_examples``); of ``LARGE_ROUNDS`` for a family of ``LARGE_FAMILIES`` that
    they hold at ``LARGE_FROM_SHAPES`` shapes or more, else the default. A shape counts once
    per GPU model (its unit)."""
    units = {e.unit for e in examples if e.family == family}
    large = family in LARGE_FAMILIES and len(units) >= LARGE_FROM_SHAPES
    model = CostModel(seed, rounds=LARGE_ROUNDS if large else MAX_ITER)
    model.add_examples(capped(examples, family, MAX_EXAMPLES, seed), context=examples)
    return model


def learns_family(examples: Sequence[Example], family: str) -> bool:
    """Whether the examples hold this family measured on another problem: where they do not,
    the model knows only what other families taught it, and the static prior starts better."""
    return any(e.family == family for e in examples)


def model_picks(learned: LearnedSpace, family: str, count: int, seed: int | None
                ) -> list[dict[str, int]]:
    """The ``count`` accepted configs (positions) the cost model ranks highest (its two fits'
    rankings in turn, ``Bases.alternated``), when its examples hold this family measured
    elsewhere; [] when they do not (then it is no better than the prior, whose picks stand
    alone)."""
    scores = prepare_fit(family, learned.examples, learned.x, seed).scores if count >= 1 else None
    if scores is None:
        return []
    return [dict(learned.configs[i]) for i in np.argsort(-scores, kind="stable")[:count]]
