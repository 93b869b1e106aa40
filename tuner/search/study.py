"""The search loop: one Optuna study per (GPU model, family + source hash, problem)."""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import socket
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import db
import kernels
from kernels.space import enumerate_accepted
import numpy as np
import optuna
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial
from tqdm import tqdm

from tuner.lifetime import StopRequest
from tuner.measure.evaluator import (OK, REJECTED, Evaluator, Measurement, asynchronous,
                                     collect, submit, tickets)
from tuner.measure.phases import PROPOSE, STORE, STORE_BG, STUDY_MODEL, STUDY_PRIOR, STUDY_STORAGE, TELL, Phases
from tuner.measure.resources import Resources
from tuner.problem import ConfigKey, Problem, config_key
from tuner.report import config_text
from tuner.search import enumcache, prior, space
from tuner.search.costmodel import Example, matrix
from tuner.search.fleet import Changes, Heartbeat, SharedStudy, heartbeats_on
from tuner.search.learned import (HYBRID_PICKS, MAX_EXAMPLES, LearnedSpace, PreparedFit, Unit,
                                  examples_for_study, first_picks, fit_key, learns_family,
                                  model_picks, prepare_fit, space_rows)
from tuner.search.choices import LEARNING, PRIOR_SAMPLERS, RANKED_STARTUP
from tuner.search.samplers import (CONSTRAINT, STARTUP_TRIALS, SearchSpace, make_sampler,
                                   resolve)
from tuner.search.warmstart import warm_start
from tuner.search.writer import StoreWriter, done

log = logging.getLogger(__name__)

# A new best must beat the old one by this fraction to reset the patience count: timing noise
# alone should not keep a converged study alive.
MIN_GAIN = 0.005
# Asks in a row that bring nothing new to measure (rejected or already measured) before the
# study is called exhausted: the sampler keeps circling a space it has covered.
MAX_FRUITLESS_ASKS = 200
# Spaces up to this size are enumerated once: the study then knows exactly when every accepted
# config has been measured, when the sampler circles it is handed an unmeasured config, and the
# default sampler runs the learned model on them (the set-up bench/search_efficiency.py
# measures). The walk prunes as it binds parameters (kernels.space.enumerate_accepted), so its
# cost follows the accepted configs, not this product: split-K's 4.4M lists its 214,440 in
# about 2 s of one CPU core of the CI machine, warptile's 13,216 of 295k in 0.2 s.
ENUMERABLE_SPACE = 5_000_000
NUDGE_AFTER_FRUITLESS_ASKS = 20
# With nothing left to ask while other workers still measure (or a dead one's candidate waits
# to go stale), look at the storage again this often.
WAIT_FOR_OTHERS_S = 0.5
# Without claims (one worker, or a few on one SQLite file) others' results are pulled at most
# this often: each pull also reads back this worker's own recent trials.
UNCLAIMED_PULL_EVERY_S = 2.0
# With claims, the window's refill pulls unless a pull came this recently: every claimed ask
# pulls after its claim anyway (that pull settles a race for the config), and a second read per
# trial bought a view at most this much fresher (docs/fleet.md, "One pull per claimed ask").
CLAIMED_PULL_EVERY_S = 0.1
ERROR_ATTR_LIMIT = 1000


@dataclass(frozen=True)
class Budget:
    trials: int  # measured configs per study, over all runs of that study
    timeout_s: float | None  # wall time of one run of the study
    patience: int | None  # measured configs without a new best before stopping

    def as_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "timeout_s": self.timeout_s, "patience": self.patience}


@dataclass
class Session:
    """What every study of one tuner invocation shares."""

    database: Any  # db.Database
    evaluator: Evaluator
    storage: optuna.storages.BaseStorage
    gpu_id: int
    gpu_name: str
    sampler: str = "default"
    seed: int | None = 0
    batch: int = 1  # candidates in flight (compiling ahead of the GPU)
    warm_start: bool = True
    progress: bool = True
    host: str = field(default_factory=socket.gethostname)
    command: str = "python -m tuner"
    stop: StopRequest = field(default_factory=StopRequest)
    # Several workers on one study (README, "Several workers"): register each candidate in the
    # storage before measuring it. Needs a storage made by tuner.run.storage.open_storage.
    claim_trials: bool = False
    # The default sampler's start-up (tuner.search.prior) may compile this many configs to read
    # their registers and spills (CPU, cached in compile_cache); 0: rank by estimated registers.
    prior_compiles: int = prior.MAX_COMPILES
    compile_cache: Path | str | None = None  # CUBIN cache folder (None: kernels' default)
    # --sampler model: examples of other problems to learn from (None: the results database's
    # measured trials and, where learn_from_recordings, the bundled recordings of this GPU
    # model; tuner.search.learned.examples_for_study)
    training: Sequence[Example] | None = None
    learn_from_recordings: bool = False  # live runs (a replay's recording may be a bundled one)
    heartbeat_s: float = 30.0  # runs and claimed trials are refreshed this often …
    stale_after_s: float = 300.0  # … and taken for dead this long after their last heartbeat
    # where the studies' wall time goes (tuner.measure.phases); shared with the evaluator's
    phases: Phases = field(default_factory=Phases)
    # Finished trials are written (Optuna storage, then results database) by a writer thread
    # while the loop goes on (tuner.search.writer); False: on the main thread, as before
    # (kept to compare the two in tests).
    background_store: bool = True
    # tune_all prepares the next study's start-up in a child process while one runs
    # (tuner.search.prefetch); off where no GPU waits (replay, tests' fakes)
    prefetch_startup: bool = False
    # that process, started already (tuner.search.preparer.start) where the command began it
    # beside the GPU child; else tune_all starts it
    prefetch_process: Any = None
    # tune_all times a shape's fastest configs this many more times at its end (tuner.run.retime)
    retime_rounds: int = 0


@dataclass
class StudyOutcome:
    study_name: str
    run_id: int
    run_state: str  # finished | interrupted | failed
    stop_reason: str
    measured: int  # distinct configs measured in the study, all runs
    measured_now: int  # of which in this run
    best_config: dict[str, int] | None
    best_gflops: float | None
    best_number: int | None


@dataclass
class _Known:
    stored: Future[int]  # its number in the storage, once the writer thread has stored it
    state: str
    value: float
    violation: float

    @property
    def number(self) -> int:
        return self.stored.result()


@dataclass
class _Pending:
    trial: Trial
    config: dict[str, int]
    key: ConfigKey
    alias: bool = False  # same config as an earlier pending candidate: answered from it
    claim: int | None = None  # its RUNNING trial id in the storage (claims on)
    retry: bool = False  # a dead worker's candidate, taken from the storage's WAITING queue
    dropped: bool = False  # its compile let go (the run stopped before it was handed over)


@dataclass
class _Submitted:
    """A candidate handed to the evaluator, its measurement not yet recorded."""

    item: _Pending
    ticket: Any
    started_at: datetime


def study_name(gpu_name: str, family: Any, problem: Problem) -> str:
    return (
        f"gemmtune/{gpu_name}/{family.name}@{family.source_hash[:16]}/"
        f"{problem.shape}/{problem.dtype}/{problem.layout}"
        f"{'' if problem.general_alpha_beta else '/alpha1beta0'}"
    )


def _known_from_trials(family: Any, trials: list[FrozenTrial]
                       ) -> dict[ConfigKey, _Known]:
    known: dict[ConfigKey, _Known] = {}
    for trial in trials:
        state = trial.user_attrs.get("state")
        if state is None or "duplicate_of" in trial.user_attrs:
            continue
        key = config_key(space.config_from_params(family, trial.params,
                                                        trial.distributions))
        known.setdefault(
            key,
            _Known(done(trial.number), state, float(trial.value or 0.0),
                   sum(max(0.0, v) for v in trial.constraints.values())),
        )
    return known


def _seed_for(seed: int | None, n_trials: int, shared: bool = False) -> int | None:
    # A resumed study must not replay the first run's random proposals, nor may workers that
    # share a study all propose the same configs.
    if seed is None:
        return None
    return seed + n_trials + (os.getpid() if shared else 0)


def enumerable(family: Any) -> bool:
    """Whether a study lists the family's accepted configs (what --sampler model ranks, and
    what the static prior groups): its full product of values is at most ENUMERABLE_SPACE."""
    return math.prod(len(param.values) for param in family.params) <= ENUMERABLE_SPACE


def _accepted_configs(family: Any, arch: str) -> list[dict[str, int]] | None:
    return list(enumerate_accepted(family, arch)) if enumerable(family) else None


@dataclass
class Startup:
    """A study's start-up inputs, computed from the family, the GPU and the problem alone, so
    that they can be prepared ahead, while the study before runs (``StartupPrefetch``)."""

    accepted: list[dict[str, int]] | None  # every accepted config, where enumerable
    groups: prior.Groups | None  # the static prior's geometry groups (tuner.search.prior)
    # the static prior's start-up (the prior set-up's, and the model's where it has not learned
    # the family elsewhere), with compiled resources (None: to be ranked on the main thread: a
    # replay reads the resources its recording holds)
    ranked: list[dict[str, int]] | None = None
    ranking: prior.Ranking = field(default_factory=prior.Ranking)
    seconds: float = 0.0  # CPU wall time it took where prepared ahead
    # the cost model's feature rows of ``accepted`` on the GPU's SM count, for the samplers that
    # learn (None: computed on the main thread, 1-2.4 s for pipelined and tf32x3 at 2048³)
    features: np.ndarray | None = None
    # the model's first fit on the examples of other problems known when it was prepared (a
    # study that finds other examples, e.g. of a shape the command measured since, fits itself)
    fitted: PreparedFit | None = None
    # each accepted config's launch geometry, while the start-up is prepared: the groups and the
    # feature rows both read them (laying tf32x3's 94,500 configs out twice was a quarter of its
    # start-up); dropped before the start-up is handed over
    geometries: list[prior.Geometry] | None = field(default=None, repr=False, compare=False)

    # the model's first ``batch`` picks on ``fitted`` (``learned.first_picks``), listed where
    # the start-up is prepared: ranking splitk's 109,440 configs took 0.1 s on the 2-core machine
    first_picks: list[dict[str, int]] | None = None

    def first_asks(self, count: int) -> list[dict[str, int]]:
        """The first ``count`` configs a study built on this start-up asks, before any answer
        comes back (besides its warm start): the static prior's ranking where it was prepared
        (the study then starts from it; the hybrid after its few model picks), else the model's
        first picks (one ask in 1/EPSILON takes a uniform config instead); [] where neither was
        prepared."""
        if self.ranked is not None:
            return self.ranked[:count]
        return (self.first_picks or [])[:count]


def _startup_count(batch: int) -> int:
    # with ``batch`` candidates in flight, the asks made before the start-up's results come
    # back take the next picks of the prior's ranking (instead of uniform ones)
    return STARTUP_TRIALS + max(0, batch - 1)


def _enumerate(family: Any, arch: str, problem: Problem, sampler: str,
               cache_dir: Path | str | None = None, rank: bool = True) -> Startup:
    """The accepted configs, and the prior's geometry groups where they will be used: by the
    prior set-up's TPE, or by a ranking (``rank``: the study may start from the prior; grouping
    tf32x3's 94,500 configs takes ~0.9 s)."""
    accepted = enumcache.accepted(family, arch, cache_dir,
                                  lambda: _accepted_configs(family, arch))
    grouped = sampler in PRIOR_SAMPLERS or (rank and sampler in RANKED_STARTUP)
    if not grouped or accepted is None:
        return Startup(accepted, None)
    geometries = [prior.geometry(family, c, problem.m, problem.n, problem.k) for c in accepted]
    groups = prior.group_configs(family, accepted, problem.m, problem.n, problem.k, geometries)
    return Startup(accepted, groups, geometries=geometries)


def _rank(family: Any, arch: str, problem: Problem, startup: Startup, sm_count: int,
          batch: int, seed: int | None, prior_compiles: int, resources: Any
          ) -> tuple[list[dict[str, int]], prior.Ranking]:
    """The static prior's start-up configs, and what it did."""
    assert startup.accepted is not None
    ranking = prior.Ranking()
    configs = prior.startup_configs(
        family, startup.accepted, problem.m, problem.n, problem.k, prior.Target(sm_count, arch),
        _startup_count(batch), _seed_for(seed, 0), resources, prior_compiles, ranking,
        groups=startup.groups)
    return configs, ranking


def prepare_startup(family_name: str, arch: str, problem: Problem, sampler: str, sm_count: int,
                    batch: int, seed: int | None, prior_compiles: int,
                    cache_dir: str | None, rank: bool = True,
                    examples: Sequence[Example] | None = None,
                    usage: Resources | None = None) -> Startup:
    """A registered family's start-up inputs with the prior's compiles (NVRTC, CUBIN cache):
    what ``StudyRun`` computes itself when it was not prepared ahead. ``rank``: False where
    the study will not start from the prior (``ranks_prior``): enumerated only. ``examples``:
    the model's examples of other problems (``examples_for_study``), to fit it ahead on.
    ``usage``: how the prior's compiles are made (default: NVRTC on threads of this process;
    the live evaluator's compile processes, ``CompilePool.usage``, give the same reports)."""
    started = time.perf_counter()
    family = kernels.bind(kernels.get_family(family_name), problem.layout, problem.batch)
    startup = _enumerate(family, arch, problem, sampler, cache_dir, rank)
    if sampler in LEARNING and startup.accepted is not None and sm_count >= 1:
        target = prior.Target(sm_count, arch)
        startup.features = matrix(family, startup.accepted, problem, target, startup.geometries)
        if examples is not None and resolve(sampler, True) == "model":
            startup.features = space_rows(family.name, startup.features, startup.accepted,
                                          problem, target, examples)
            startup.fitted = prepare_fit(family.name, examples, startup.features,
                                         _seed_for(seed, 0))
            if startup.fitted.scores is not None:
                startup.first_picks = [startup.accepted[row] for row in
                                       first_picks(startup.features, startup.fitted.scores, batch)]
    if rank and sampler in RANKED_STARTUP and startup.accepted is not None and sm_count >= 1:
        resources = ((usage or prior.compiled_usage(family, arch, cache_dir)) if prior_compiles
                     else None)
        startup.ranked, startup.ranking = _rank(family, arch, problem, startup, sm_count, batch,
                                                seed, prior_compiles, resources)
    startup.geometries = None  # not carried to the study (nor pickled back from the preparer)
    startup.seconds = time.perf_counter() - started
    return startup


def ranks_prior(sampler: str, family: Any, unit: Unit, measured: Iterable[Unit]) -> bool:
    """Whether a study of ``family`` (``unit``: its GPU model, family and shape) starts from the
    static prior's ranking, so that preparing it ahead is worth the prior's compiles: the prior
    set-up's always; the model's (the default's, where the space is listed) only where
    ``measured`` (units with measured configs: the results database's, and this command's
    studies before it) holds no other unit of the family: else it learns from them
    (``learns_family``) and never asks for the prior."""
    if sampler in PRIOR_SAMPLERS or (sampler == "default" and not enumerable(family)):
        return True
    if sampler not in RANKED_STARTUP:
        return False
    return not any(other[1] == unit[1] and other != unit for other in measured)


@dataclass
class _Tally:
    """The measured configs of a study and its best so far, fed in trial order. `best` is the
    fastest measured; `since_best` counts the configs since one beat the mark by MIN_GAIN."""

    measured: int = 0
    since_best: int = 0
    best: _Known | None = None
    best_config: dict[str, int] | None = None
    mark: float | None = None  # the value the patience count last restarted at

    def add(self, result: _Known, config: dict[str, int]) -> None:
        if result.state == REJECTED:
            return
        self.measured += 1
        self.since_best += 1
        if result.state != OK:
            return
        if self.best is None or result.value > self.best.value:
            self.best, self.best_config = result, dict(config)
        if self.mark is None or result.value > self.mark * (1 + MIN_GAIN):
            self.mark, self.since_best = result.value, 0


# Called by a run once it asks for nothing more and its last candidates are with the GPU child.
Draining = Callable[[], None]
# Called by a run each time it is about to wait for a compile with none of its candidates with the
# GPU child.
Waiting = Callable[[], None]


class StudyRun:
    """One run of one study. The study lives in the Optuna storage; the search runs on an
    in-memory copy and writes each finished trial back in one transaction, on a writer thread
    (tuner.search.writer) while the loop goes on, in trial order. (Asking and telling
    through an RDB storage costs a commit per parameter and attribute, a quarter second per
    trial on a slow disk, and trials in flight when the process dies never reach the storage.)
    Before each ask it pulls what other workers stored since (tuner.search.fleet); with claims on, a
    candidate is stored as RUNNING before it is measured and finished in place."""

    def __init__(self, session: Session, family: Any, problem: Problem, budget: Budget,
                 baseline_gflops: float | None, startup: Startup | None = None, place: str = "") -> None:
        """``place``: where this study stands in the command, e.g. "3/16", shown on its bar."""
        self.place = place
        # the family as this problem builds and runs it (its layout's program, its batch's launches)
        family = kernels.bind(family, problem.layout, problem.batch)
        self.session, self.family, self.problem, self.budget = session, family, problem, budget
        self.baseline_gflops = baseline_gflops
        self.name = study_name(session.gpu_name, family, problem)
        self.distributions = space.distributions(family)  # positions: see tuner.search.space
        self.arch = session.evaluator.arch()
        # ``startup``: prepared ahead (StartupPrefetch); else computed here, the same way
        self.startup = startup or _enumerate(family, self.arch, problem, session.sampler,
                                             session.compile_cache)
        self.accepted_all = self.startup.accepted
        # what --sampler names, for this family (default: the model where its space is listed)
        self.sampler = resolve(session.sampler, self.accepted_all is not None)
        # the static prior's geometry groups (tuner.search.prior): its start-up, the prior TPE
        self.groups = self.startup.groups

        with session.phases.timed(STUDY_STORAGE):
            self.shared = SharedStudy(session.storage, self.name, key_of=self._key_of,
                                      claims=session.claim_trials,
                                      stale_check_every_s=session.heartbeat_s)
            changes = self.shared.pull()
        history = changes.completed
        # A resumed study past its start-up never asks for it: spare the prior's compiles.
        resumed = len(history) >= STARTUP_TRIALS
        # hybrid only needs the model for its start-up picks
        sampler = self.sampler
        seed = _seed_for(session.seed, len(history), self.shared.claims)
        with session.phases.timed(STUDY_MODEL):
            learned = (self._learned(seed) if sampler == "model"
                       or (sampler == "hybrid" and not resumed) else None)
        self.startup.geometries = None  # read by the groups and the model's rows: done with
        # The model sampler starts from the static prior where its examples hold no other
        # shape of this family (what other families teach it transfers worse than the prior;
        # the hybrid's rule, tuner.search.learned.model_picks).
        wants_startup = (not resumed
                         and (sampler in PRIOR_SAMPLERS
                              or (learned is not None
                                  and not learns_family(learned.examples, family.name))))
        with session.phases.timed(STUDY_PRIOR):
            startup = self._prior_startup() if wants_startup else []
        picks: list[dict[str, int]] = []
        if sampler == "hybrid" and wants_startup and learned is not None:
            picks = model_picks(learned, family.name, HYBRID_PICKS, session.seed)
            startup = picks + [p for p in startup if p not in picks]
        search_space = SearchSpace(self.distributions, space.feasibility(family, self.arch),
                                   startup,
                                   self._geometry_groups() if sampler in PRIOR_SAMPLERS else [],
                                   learned if sampler == "model" else None,
                                   model_picks=len(picks))
        self.study = optuna.create_study(
            direction="maximize",
            sampler=make_sampler(sampler, seed, search_space,
                                 background=asynchronous(session.evaluator)),
        )
        self.known: dict[ConfigKey, _Known] = {}  # numbered as stored
        self.tally = _Tally()
        self.mirrors: dict[int, int] = {}  # others' RUNNING claim id → in-memory trial number
        self._learn(changes)
        if session.warm_start and not history:
            with session.phases.timed(STUDY_STORAGE):
                same, elsewhere = warm_start(session.database, session.gpu_name, family, problem, self.arch)
            warm = same + elsewhere
            for config in same + [c for c in self._beside_model_picks(elsewhere) if c not in same]:
                from_warm_start = config in warm
                log.info("%s: %s %s", self.name, "warm start with" if from_warm_start else "the model's pick",
                         config_text(config))
                self.study.enqueue_trial(space.params_from_config(family, config),
                                         user_attrs={"warm_start": True} if from_warm_start else {},
                                         skip_if_exists=True)

        self.nudges = random.Random(session.seed)
        self.pending: deque[_Pending] = deque()  # asked, compiling, not yet submitted
        self.submitted: deque[_Submitted] = deque()  # with the evaluator, in order
        self.depth = tickets(session.evaluator)  # submitted at once, all GPUs together
        self.phases = session.phases
        self.measured_now = 0
        self.deadline: float | None = None  # the loop's time limit (monotonic), if any
        self.loop_started = 0.0
        self.fruitless = 0
        self.run_id = 0
        self.pulled_at = -math.inf  # the last pull (monotonic)
        self.writer = StoreWriter(background=session.background_store)
        self.while_draining: Draining | None = None  # run's, until called
        self.while_waiting: Waiting | None = None  # run's
        # compile_ahead's rows (of accepted_all): the model's next asks as its fit number
        # ``_ahead_fits`` foresaw them
        self._ahead: deque[int] = deque()
        self._ahead_fits = -1

    def _geometry_groups(self) -> list[list[dict[str, int]]]:
        """Every accepted config (positions), grouped by geometry; [] where there are no groups
        (another sampler, or a space that is not enumerated)."""
        return [space.params_from_configs(self.family, members)
                for _, members in (self.groups or {}).values()]

    def _learned(self, seed: int | None) -> LearnedSpace:
        """The model sampler's view: every accepted config with its features, and examples of
        other problems (the session's, else ``examples_for_study``: the results database's
        and the bundled recordings', except this GPU model's at this shape)."""
        if self.accepted_all is None:
            raise ValueError(f"--sampler model needs an enumerable space; {self.family.name}'s "
                             f"has more than {ENUMERABLE_SPACE} configs: use --sampler default")
        info = self.session.evaluator.info()
        target = prior.Target(int(info.get("sm_count") or 1), self.arch)
        examples = self.session.training
        if examples is None:
            examples = examples_for_study(self.session.database, self.session.gpu_name,
                                          self.problem, self.session.learn_from_recordings)
        log.info("%s: the cost model learns from %d measured configs of other problems (%d of "
                 "%s; a fit takes %d at most), then from this study's own", self.name,
                 len(examples), sum(e.family == self.family.name for e in examples),
                 self.family.name, MAX_EXAMPLES)
        positions = space.params_from_configs(self.family, self.accepted_all)
        if self.startup.features is not None:  # prepared ahead, for the same SM count
            fitted = self.startup.fitted
            if fitted is not None and fitted.key != fit_key(seed, examples):
                log.info("%s: the model's fit prepared ahead is of other examples; fitting it "
                         "here", self.name)
                fitted = None
            features = self.startup.features
            if fitted is None:  # its transfer columns are of no examples, or of others
                features = space_rows(self.family.name, features, self.accepted_all,
                                      self.problem, target, examples)
            return LearnedSpace(positions, features, examples, self.family.name, fitted)
        return LearnedSpace.build(self.family, self.accepted_all, positions, self.problem, target,
                                  examples, self.startup.geometries)

    def _prior_startup(self) -> list[dict[str, int]]:
        """The static prior's start-up (tuner.search.prior; positions); [] where the
        space is not enumerated or the GPU's SM count is unknown (uniform start-up then).
        With ``batch`` candidates in flight, the asks made before the start-up's results come
        back take the next picks of the prior's ranking (instead of uniform ones)."""
        sm_count = int(self.session.evaluator.info().get("sm_count") or 0)
        if self.accepted_all is None or sm_count < 1:
            return []
        if self.startup.ranked is not None:  # ranked ahead, beside the study before
            configs, ranking = self.startup.ranked, self.startup.ranking
        else:
            # A replay reads the resources the recording holds (the compiler of its
            # measurements).
            session = self.session
            recorded = getattr(session.evaluator, "compiled_usage", None)
            resources = (None if not session.prior_compiles
                         else recorded(self.family, self.problem) if recorded is not None
                         else prior.compiled_usage(self.family, self.arch, session.compile_cache))
            configs, ranking = _rank(self.family, self.arch, self.problem, self.startup, sm_count,
                                     session.batch, session.seed, session.prior_compiles,
                                     resources)
        log.info("%s: start-up from the static prior (%d geometry groups, %d compiled in "
                 "%.1f s): %s", self.name, ranking.groups, ranking.compiled,
                 ranking.compile_seconds, "; ".join(config_text(c) for c in configs))
        return [space.params_from_config(self.family, c) for c in configs]

    # ---------------------------------------------------------------- other workers

    def _key_of(self, trial: FrozenTrial) -> ConfigKey:
        return config_key(space.config_from_params(self.family, trial.params,
                                                         trial.distributions))

    def _learn(self, changes: Changes) -> None:
        """Bring what other workers stored into the in-memory study: their finished trials
        (as history), and their claims in flight as RUNNING trials, which a constant-liar
        sampler steers away from, until they finish."""
        for trial in changes.completed + changes.failed:
            mirror = self.mirrors.pop(trial._trial_id, None)
            if mirror is not None:
                self.study.tell(mirror, state=TrialState.FAIL)
        completed = sorted(changes.completed, key=lambda t: t.number)
        self.study.add_trials(space.reencode_trials(self.family, completed))
        for key, entry in _known_from_trials(self.family, completed).items():
            if key not in self.known:
                self.known[key] = entry
                self.tally.add(entry, dict(key))
        for trial in changes.started:
            key = self._key_of(trial)
            self.mirrors[trial._trial_id] = len(self.study.get_trials(deepcopy=False))
            self.study.add_trial(create_trial(
                state=TrialState.RUNNING, params=space.params_from_config(self.family, dict(key)),
                distributions=self.distributions))

    def _pull(self) -> None:
        self._flush()  # our own writes first: the pull reads them back (and skips them)
        self._learn(self.shared.pull())
        self.pulled_at = time.monotonic()

    def _flush(self) -> None:
        """Wait for the writer thread's queue to drain (raising its error, if any): before
        reading the storage, writing to it from this thread, or ending the run."""
        with self.phases.timed(STORE):
            self.writer.flush()
        self._count_background()

    def _count_background(self) -> None:
        seconds, jobs = self.writer.take_seconds()
        if jobs:
            self.phases.add(STORE_BG, seconds, jobs)

    def _others_holding(self) -> list[FrozenTrial]:
        """Other workers' claims in flight, and queued retries of dead workers' candidates
        where this worker takes them too (claims on): what will still be measured."""
        return [t for t in self.shared.others_open.values()
                if t.state == TrialState.RUNNING or self.shared.claims]

    def _others_busy(self) -> set[ConfigKey]:
        return {self._key_of(t) for t in self._others_holding()}

    # ---------------------------------------------------------------- recording

    def _tell(self, trial: Trial, state: str, value: float, violation: float,
              claim: int | None = None, then: Callable[[int], None] | None = None,
              **attrs: Any) -> Future[int]:
        """Tell the in-memory study and hand the finished trial to the writer thread, which
        writes it to the storage (completing its claim, if it has one) and then calls ``then``
        with its number there (the number the results database uses too)."""
        trial.set_user_attr("state", state)
        trial.set_constraint(CONSTRAINT, violation)
        for attr, attr_value in attrs.items():
            trial.set_user_attr(attr, attr_value)
        with self.phases.timed(TELL):
            finished = self.study.tell(trial, value)  # a finished trial: never changed again
        shared = self.shared

        def write() -> int:
            number = (shared.finish(claim, finished) if claim is not None
                      else shared.add_finished(finished))
            if then is not None:
                then(number)
            return number

        with self.phases.timed(STORE):
            return self.writer.submit(write)

    def _record(self, trial: Trial, config: dict[str, int], measurement: Measurement,
                started_at: datetime, violation: float = 1.0,
                claim: int | None = None) -> _Known:
        """Tell the measurement and queue its writes: the storage's, then the results
        database's under the storage's number, then the log line (all on the writer thread,
        in trial order)."""
        fields = record_fields(measurement)
        usable = measurement.usable
        value = float(measurement.gflops) if usable else 0.0  # type: ignore[arg-type]
        violation = 0.0 if usable else violation
        attrs = {"error": fields["error"][:ERROR_ATTR_LIMIT]} if fields["error"] else {}
        database, run_id, baseline = self.session.database, self.run_id, self.baseline_gflops

        def store(number: int) -> None:
            database.add_trial(
                run_id,
                db.TrialRecord(number=number, params=config, started_at=started_at, **fields),
            )
            if measurement.state == REJECTED:
                log.debug("trial %d rejected: %s (%s)", number, config_text(config),
                          measurement.error)
            else:
                _log_trial(number, config, measurement, baseline)

        stored = self._tell(trial, fields["state"], value, violation, claim, then=store, **attrs)
        return _Known(stored, fields["state"], value, violation)

    def _tell_duplicate(self, trial: Trial, earlier: _Known) -> None:
        # Its duplicate_of is the earlier trial's stored number: wait for that write if it is
        # still queued (rare: a sampler mostly circles back to configs of long ago).
        with self.phases.timed(STORE):
            number = earlier.number
        self._tell(trial, earlier.state, earlier.value, earlier.violation,
                   duplicate_of=number)

    # ---------------------------------------------------------------- proposals

    def _held(self) -> list[_Pending]:
        """The candidates of this run in flight: in the window or with the evaluator."""
        return list(self.pending) + [done.item for done in self.submitted]

    def _in_flight(self) -> int:
        return sum(not item.alias for item in self._held())

    def _room(self, taking: int = 0) -> bool:
        """Whether one more candidate fits the window and the budget (counting what other
        workers of the study hold, so that together they measure exactly the budget).
        ``taking``: 1 when the candidate is one of those (a queued retry moving from theirs to
        ours), which must not count twice: else a retry of the budget's last config would wait
        for itself until the timeout. (A window of ``batch`` compiles, candidates that share a
        CUBIN counted once, kept more workers busy but asked up to twice as far ahead of the
        results, and the studies that stop on patience found less: docs/measurement.md,
        "Tried and not kept".)"""
        return self._in_flight() < self.session.batch and self._asks_left(taking) > 0

    def _asks_left(self, taking: int = 0) -> int:
        """Candidates this run may still ask for: what the trial budget leaves (``_room``'s
        ``taking``) and, near a time limit, what the time left can measure beyond those in
        flight (``_time_room``)."""
        left = self.budget.trials - self._budget_taken(len(self._others_holding()) - taking)
        time_room = self._time_room()
        return left if time_room is None else min(left, time_room - self._in_flight())

    def _budget_taken(self, held_by_others: int) -> int:
        """Measured, in flight here, and held by other workers: the budget spent or promised."""
        return self.tally.measured + self._in_flight() + held_by_others

    def _budget_full_before(self, claim: int) -> bool:
        """Whether the budget was full, in claim order, when this claim was made: two workers
        that both saw room for the budget's last config claim at once; the later claim (ids
        are handed out in commit order) backs off, as for two claims of one config."""
        earlier = sum(1 for t in self._others_holding() if t._trial_id < claim)
        return self._budget_taken(earlier) >= self.budget.trials

    def _time_room(self) -> int | None:
        """Candidates that can still be measured before the deadline at this run's rate so
        far, plus the evaluator's queue: near a time limit the window stops asking for
        candidates that would be compiled and never measured (a fresh CUBIN cache spent a
        window's worth of compiles at the end of every study). No deadline, or
        fewer results than the queue holds: None, no limit."""
        if self.deadline is None or self.measured_now < self.depth:
            return None
        now = time.monotonic()
        rate = self.measured_now / max(1e-9, now - self.loop_started)
        return self.depth + math.ceil(max(0.0, self.deadline - now) * rate)

    def _take_retries(self) -> None:
        """Take dead workers' candidates, queued as WAITING trials, before asking anew."""
        for waiting in self.shared.waiting():
            if not self._room(taking=1) or self.study.get_trials(deepcopy=False,
                                                         states=(TrialState.WAITING,)):
                return  # our own queue (warm start, nudges) first: asks pop it in order
            self._flush()
            if not self.shared.take_waiting(waiting):
                continue
            key = self._key_of(waiting)
            self._pull()  # a claim of the same config made while the retry was being queued
            if (key in self.known or any(item.key == key for item in self._held())
                    or self.shared.claimed_before(key, waiting._trial_id)):
                self.shared.release(waiting._trial_id, requeue=False)  # answered meanwhile
                continue
            self.study.enqueue_trial(space.params_from_config(self.family, dict(key)),
                                     user_attrs={"retry_of": waiting.number})
            trial = self.study.ask(self.distributions)
            config = space.config_from_params(self.family, trial.params)
            assert config_key(config) == key, "the enqueued retry was not asked first"
            log.info("%s: retrying trial %d of a worker that stopped: %s", self.name,
                     waiting.number, config_text(config))
            self.session.evaluator.prepare(self.family, config)
            self.pending.append(_Pending(trial, config, key, claim=waiting._trial_id,
                                         retry=True))

    def _ask(self) -> bool:
        """Ask for one candidate; returns whether it needs measuring (it joined the window)."""
        trial = self.study.ask(self.distributions)
        config = space.config_from_params(self.family, trial.params)
        key = config_key(config)
        if key in self.known:
            self._tell_duplicate(trial, self.known[key])
            return False
        if key in self._others_busy():  # another worker measures it: its result will come
            self.study.tell(trial, state=TrialState.FAIL)
            return False
        if any(item.key == key and not item.alias for item in self._held()):
            self.pending.append(_Pending(trial, config, key, alias=True))
            return False
        try:
            reasons = self.family.reject_reasons(config, self.arch)
        except ValueError as error:  # kernels.ConfigError: a value the family does not allow
            reasons = [str(error)]
        if reasons:
            rejected = Measurement(state=REJECTED, error="; ".join(reasons))
            self.known[key] = self._record(trial, config, rejected, datetime.now(timezone.utc),
                                           violation=float(len(reasons)))
            return False
        claim = None
        if self.shared.claims:
            self._flush()  # the claim is written now, before measuring: after queued writes
            claim = self.shared.claim(trial.params, self.distributions)
            self._pull()
            if (key in self.known or self.shared.claimed_before(key, claim)
                    or self._budget_full_before(claim)):
                self.shared.release(claim, requeue=False)  # lost a race for it
                self.study.tell(trial, state=TrialState.FAIL)
                return False
        self.session.evaluator.prepare(self.family, config)
        self.pending.append(_Pending(trial, config, key, claim=claim))
        return True

    def _fill_window(self) -> None:
        """Keep up to `batch` candidates in flight, so compiles run ahead of the GPU."""
        with self.phases.timed(PROPOSE):
            self._fill()

    def _fill(self) -> None:
        every = CLAIMED_PULL_EVERY_S if self.shared.claims else UNCLAIMED_PULL_EVERY_S
        if time.monotonic() - self.pulled_at >= every:
            self._pull()
        if self.shared.claims:
            self._take_retries()
        holds_asks = getattr(self.study.sampler, "holds_asks", None)
        while (
            self._room()
            and self.fruitless < MAX_FRUITLESS_ASKS
            and not self._covered()
        ):
            if holds_asks is not None and (self.pending or self.submitted) \
                    and holds_asks(self.study):
                break  # its first fit runs on a thread: the GPU measures what is in flight
            if self._ask():
                self.fruitless = 0
                if len(self.submitted) < self.depth:
                    # the GPU child has room (a study's start, or it ran dry): hand it what
                    # has compiled by now, not after the window's last ask (docs/measurement.md, "Study boundaries")
                    self._submit_ready(wait=False)
            else:
                self.fruitless += 1
            if self.fruitless and self.fruitless % NUDGE_AFTER_FRUITLESS_ASKS == 0:
                self._nudge()

    def _covered(self, counting_others: bool = True) -> bool:
        """Every accepted config measured or in flight, here or (counting_others) with other
        workers (known only for enumerable spaces)."""
        if self.accepted_all is None:
            return False
        in_flight = {item.key for item in self._held()}
        if counting_others:
            in_flight |= self._others_busy()
        return self._known_or_in(in_flight)

    def _known_or_in(self, keys: set[ConfigKey]) -> bool:
        """Every accepted config (an enumerable space's) measured, or one of ``keys``."""
        assert self.accepted_all is not None
        return all(config_key(c) in self.known or config_key(c) in keys
                   for c in self.accepted_all)

    def _nudge(self) -> None:
        """Hand a circling sampler an accepted config it has not measured yet."""
        if self.accepted_all is None:
            return
        in_flight = {item.key for item in self._held()} | self._others_busy()
        fresh = [c for c in self.accepted_all
                 if config_key(c) not in self.known and config_key(c) not in in_flight]
        if fresh:
            self.study.enqueue_trial(space.params_from_config(self.family,
                                                              self.nudges.choice(fresh)),
                                     user_attrs={"nudge": True})

    # ---------------------------------------------------------------- the loop

    def _stop_reason(self, deadline: float | None) -> str | None:
        budget, tally = self.budget, self.tally
        if self.session.stop.requested:
            return "interrupted"
        if tally.measured >= budget.trials:
            return "trial budget"
        if deadline is not None and time.monotonic() >= deadline:
            return "time budget"
        if budget.patience is not None and tally.best is not None \
                and tally.since_best >= budget.patience:
            return "patience"
        if not self.pending and not self.submitted and self._covered(counting_others=False):
            return "search space exhausted"
        return None

    def _submit_ready(self, wait: bool = True) -> None:
        """Hand window candidates to the evaluator while its queue has room: it measures the
        next one while this thread records, tells and asks. ``wait=False``: only
        those compiled already; else one compile is waited for while the child has none."""
        for item in [item for item in self.pending if item.alias and item.key in self.known]:
            self.pending.remove(item)  # the same config as an earlier one, measured by now
            self._tell_duplicate(item.trial, self.known[item.key])
        while (len(self.submitted) < self.depth
               and (item := self._next_compiled(wait and not self.submitted)) is not None):
            self.pending.remove(item)
            self._hand_over(item)

    def _next_compiled(self, wait: bool = True) -> _Pending | None:
        """The first window candidate whose compile is done, so a slow compile at the head does
        not hold back those behind it (compile times of one family differ tenfold); else
        (``wait``) the first whose compile finishes (the head, where the evaluator cannot say
        which). Aliases wait for their earlier candidate's result."""
        evaluator = self.session.evaluator
        ready = getattr(evaluator, "ready", None)
        candidates = [item for item in self.pending if not item.alias]
        if ready is not None:
            def first_ready() -> _Pending | None:
                return next((item for item in candidates if ready(self.family, item.config)),
                            None)

            item = first_ready()
            wait_any = getattr(evaluator, "wait_any", None)
            if item is None and wait and candidates and wait_any is not None:
                if self.while_waiting is not None:
                    self.while_waiting()
                wait_any(self.family, [waiting.config for waiting in candidates])
                item = first_ready()
            if item is not None:
                return item
        return candidates[0] if candidates and wait else None

    def _measure_next(self, submit_more: bool = True) -> Measurement | None:
        """Record the oldest submitted candidate's measurement (waiting for it). A compile is
        waited for only when the GPU child has nothing left: blocked on one while the child
        still measured, the window could not be refilled as other compiles finished (H100,
        fresh 4096³: warptile's study kept 8 of 14 workers busy with the GPU idle 6-10 s in
        it; docs/measurement.md, "Waiting on compiles")."""
        if submit_more:
            self._submit_ready()  # waits for a compile only while the child has none
            self._compile_ahead()
            if (self.submitted and not self.pending
                    and self._budget_taken(len(self._others_holding())) >= self.budget.trials):
                self._draining()  # the trial budget is all asked for and handed to the child
        if not self.submitted:
            return None
        done = self.submitted.popleft()
        measurement = collect(self.session.evaluator, done.ticket, self.phases)
        item = done.item
        result = self._record(item.trial, item.config, measurement, done.started_at,
                              claim=item.claim)
        self.known[item.key] = result
        self.tally.add(result, item.config)
        self.measured_now += 1
        self.phases.trials += 1
        return measurement

    def _beside_model_picks(self, warm: list[dict[str, int]]) -> list[dict[str, int]]:
        """The warm start's configs taking turns with as many of the model's best-ranked ones,
        the model's first (each config once), where the model sampler has scores: asked ahead
        of them all, the warm start's dozen or so configs (nearest problems' bests, then the
        family's starting points) kept the model's own first picks out of the first window and
        cost up to ten measurements where they were no better (docs/search.md, "Warm start").
        Taking turns costs either side at most twice its own count. Elsewhere: ``warm``."""
        first_picks = getattr(self.study.sampler, "first_picks", None)
        if not warm or first_picks is None or self.accepted_all is None:
            return warm
        picks = [self.accepted_all[row] for row in first_picks(self.study, len(warm))]
        ordered: list[dict[str, int]] = []
        for pair in itertools.zip_longest(picks, warm):
            ordered += [config for config in pair if config is not None and config not in ordered]
        return ordered

    def _compile_ahead(self) -> None:
        """Begin, on compile workers idle now, the compiles of the configs the model would ask
        for next (``ModelSampler.upcoming``). A full window of candidates often shares a few
        programs (RASTER variants share a CUBIN) whose compiles all began together, so most
        workers idle while the GPU waits for them (H100, fresh 2048³: warptile's study idled
        the GPU 2.5-3.3 s at a stretch with 5-6 of 14 workers busy; docs/measurement.md,
        "Compiles begun ahead of the model's asks"). What is asked does not change: only when a
        compile begins."""
        ahead = getattr(self.session.evaluator, "compile_ahead", None)
        upcoming = getattr(self.study.sampler, "upcoming", None)
        if ahead is None or upcoming is None or self.accepted_all is None:
            return
        fits = self.study.sampler.fits
        if fits != self._ahead_fits:  # new scores: the next window's asks, as they now stand
            self._ahead = deque(upcoming(self.study, self.session.batch))
            self._ahead_fits = fits
        if not self._ahead:
            return
        # no further than the asks the trial budget and the time limit leave: a compile begun
        # for an ask never made would hold a worker into the next study's start
        began = ahead(self.family, self._take_ahead(self._asks_left()))
        if began:
            log.debug("%s: %d compiles begun ahead", self.name, began)

    def _take_ahead(self, limit: int) -> Iterator[dict[str, int]]:
        """compile_ahead's configs not asked for since they were foreseen, at most ``limit``,
        each let go once offered."""
        assert self.accepted_all is not None
        held = {item.key for item in self._held()}
        offered = 0
        while self._ahead and offered < limit:
            config = self.accepted_all[self._ahead.popleft()]
            key = config_key(config)
            if key not in self.known and key not in held:
                offered += 1
                yield config

    def _show_best(self, bar: tqdm) -> None:
        best = self.tally.best
        if best is None:
            return
        postfix = {"best": f"{best.value:,.0f} GFLOP/s"}
        if self.baseline_gflops:
            postfix["cuBLAS"] = f"{best.value / self.baseline_gflops:.2f}"
        bar.set_postfix(postfix, refresh=False)

    def _loop(self, deadline: float | None, bar: tqdm, while_draining: Draining | None,
              while_waiting: Waiting | None) -> str:
        """Ask and measure until a stop rule holds; returns the reason."""
        self.session.evaluator.set_problem(self.problem)
        self.deadline, self.loop_started = deadline, time.monotonic()
        self.while_draining, self.while_waiting = while_draining, while_waiting
        with self.phases.loop():
            if self._all_posted():
                # nothing left for the search to choose: its asks would only fit the model on
                # the main thread first (naive's 48 configs, 1 s with the GPU idle at the
                # command's first shape; docs/measurement.md, "A space posted whole")
                self._take_posted()
            reason = self._search(deadline, bar)
            if reason != "interrupted":
                self._take_posted()
            self._discard_pending()  # never measured now: their compiles free the cores
            if self.submitted:
                self._draining()
            while self.submitted:  # measured or being measured: record, whatever the reason
                self._measure_next(submit_more=False)
            self._flush()  # everything measured is stored (and numbered) before the outcome
        return reason

    def _all_posted(self) -> bool:
        """Whether every accepted config not measured yet was posted ahead for this study (the
        opening posts a small space whole). Not with claims, as ``_take_posted``."""
        posted = getattr(self.session.evaluator, "posted", None)
        if posted is None or self.shared.claims or self.accepted_all is None:
            return False
        answered = {config_key(config) for config in posted(self.family, self.problem)}
        return bool(answered) and self._known_or_in(answered)

    def _take_posted(self) -> None:
        """Record the answers posted ahead for this study that it did not ask for (the
        opening posts a small space whole: naive's 48 configs at the command's start, while
        the GPU would otherwise wait): measured already, they become trials, up to the trial
        budget, instead of being dropped. Not with claims: each trial there is claimed first."""
        posted = getattr(self.session.evaluator, "posted", None)
        if posted is None or self.shared.claims:
            return
        answered = {config_key(config): config for config in posted(self.family, self.problem)}
        for item in [item for item in self.pending if not item.alias and item.key in answered]:
            self.pending.remove(item)  # asked, and its answer is there: no longer let go
            self._hand_over(item)
            del answered[item.key]
        held = {item.key for item in self._held()}
        for key, config in answered.items():
            if key in self.known or key in held:
                continue
            if self._budget_taken(0) >= self.budget.trials:  # (claims off: nobody else's)
                break
            self._hand_over(_Pending(self._ask_for(config), config, key))

    def _hand_over(self, item: _Pending) -> None:
        """Hand a window candidate to the evaluator (its compile waited for, where not done)."""
        started_at = datetime.now(timezone.utc)
        ticket = submit(self.session.evaluator, self.family, item.config, self.problem)
        self.submitted.append(_Submitted(item, ticket, started_at))

    def _ask_for(self, config: dict[str, int]) -> Trial:
        """A trial of this config: enqueued, then asked for (a trial enqueued earlier and never
        asked, a warm start's or a nudge's, comes first: told FAIL, never measured)."""
        self.study.enqueue_trial(space.params_from_config(self.family, config),
                                 user_attrs={"posted": True})
        while True:
            trial = self.study.ask(self.distributions)
            if config_key(space.config_from_params(self.family, trial.params)) == config_key(config):
                return trial
            self.study.tell(trial, state=TrialState.FAIL)

    def _discard_pending(self) -> None:
        """Let the evaluator drop the compiles of the window's candidates (asked, compiling,
        never handed over); they stay in the window until the run's end tells them FAIL."""
        discard = getattr(self.session.evaluator, "discard", None)
        for item in self.pending:
            if discard is not None and not item.alias and not item.dropped:
                discard(self.family, item.config)
                item.dropped = True

    def _draining(self) -> None:
        """Call ``while_draining`` (once), now that all this run still holds is with the GPU
        child: it measures those while the caller builds the next study."""
        if self.while_draining is not None:
            call, self.while_draining = self.while_draining, None
            call()

    def _search(self, deadline: float | None, bar: tqdm) -> str:
        while (reason := self._stop_reason(deadline)) is None:
            self._fill_window()
            if self.pending or self.submitted:
                self._measure_next()
            elif self._others_holding() and heartbeats_on(self.session.storage):
                # Others hold the rest of the budget (or a dead worker's candidate waits to go
                # stale and be retried): wait for their results instead of stopping short.
                time.sleep(WAIT_FOR_OTHERS_S)
                self.fruitless = 0
            else:
                # the fill's pull may have brought the other workers' last results: the budget
                # they filled, not the space, is then why nothing was left to ask
                return self._stop_reason(deadline) or "search space exhausted"
            bar.update(min(self.tally.measured, self.budget.trials) - bar.n)
            self._show_best(bar)
        return reason

    def _beat_run(self) -> None:
        if not self.session.database.heartbeat_run(self.run_id):
            log.warning("run %d was marked ended by another process (a heartbeat was late by "
                        "more than %g s?)", self.run_id, self.session.stale_after_s)

    def _finish_run(self, state: str) -> None:
        try:
            self.session.database.finish_run(self.run_id, state)
        except db.InvalidInputError as error:  # marked interrupted as stale meanwhile
            log.warning("%s", error)

    def run(self, while_draining: Draining | None = None,
            while_waiting: Waiting | None = None) -> StudyOutcome:
        """Measure until a stop rule holds. ``while_draining``: called once when the run asks
        for nothing more, while the GPU child still measures its last candidates (the caller
        builds the next study then, instead of after them with the GPU idle).
        ``while_waiting``: called each time the run is about to wait for a compile with none of
        its candidates with the GPU (the caller can hand it other work meanwhile)."""
        session, problem, budget = self.session, self.problem, self.budget
        with session.phases.timed(STUDY_STORAGE):
            problem_id = session.database.ensure_problem(
                problem.m, problem.n, problem.k, dtype=problem.dtype, layout=problem.layout,
                general_alpha_beta=problem.general_alpha_beta, batch=problem.batch,
            )
            family_id = session.database.ensure_family(self.family.name, self.family.source_hash)
            for dead in session.database.interrupt_stale_runs(session.stale_after_s):
                log.warning("run %d had no heartbeat for %g s: marked interrupted (its tuner died)",
                            dead, session.stale_after_s)
            self.run_id = session.database.start_run(
                gpu_id=session.gpu_id, problem_id=problem_id, family_id=family_id,
                sampler=self.sampler, seed=session.seed, budget=budget.as_dict(),
                host=session.host, command=session.command, study_name=self.name,
                stale_after_s=session.stale_after_s,
            )
        deadline = None if budget.timeout_s is None else time.monotonic() + budget.timeout_s
        run_state, stop_reason = "failed", "error"
        bar = tqdm(total=budget.trials, initial=min(self.tally.measured, budget.trials),
                   unit="trial", desc=f"{f'[{self.place}] ' if self.place else ''}{self.family.name} {problem.label}",
                   disable=not session.progress, leave=True, dynamic_ncols=True)
        self._show_best(bar)
        heartbeat = Heartbeat(session.heartbeat_s, [self._beat_run, self.shared.beat])
        try:
            with heartbeat:
                stop_reason = self._loop(deadline, bar, while_draining, while_waiting)
            run_state = "interrupted" if stop_reason == "interrupted" else "finished"
        except KeyboardInterrupt:
            run_state, stop_reason = "interrupted", "interrupted"
            raise
        finally:
            # whatever stopped the run, what it measured is written before it ends; not a loop
            # phase (the loop's phases add up to at most its wall time): after a loop that ended
            # normally it flushed already, and this only ends the writer's thread
            write_error = self.writer.close()
            self._count_background()
            if write_error is not None:
                run_state, stop_reason = "failed", "error"
            # asked but never recorded (an error or a second Ctrl-C left the evaluator's queue
            # behind: it reads those answers before its next request): not a result, let go
            for item in self._held():
                self.study.tell(item.trial, state=TrialState.FAIL)
                if item.claim is not None and not item.alias:
                    self.shared.release(item.claim, requeue=item.retry)
            self._discard_pending()
            self.pending.clear()
            self.submitted.clear()
            bar.close()
            self._finish_run(run_state)
            log.info("%s: %s after %d new measurements (%s)", self.name, run_state,
                     self.measured_now, stop_reason)
        if write_error is not None:  # (flushes raise it first; this is the last resort)
            raise write_error
        best = self.tally.best
        return StudyOutcome(
            study_name=self.name, run_id=self.run_id, run_state=run_state,
            stop_reason=stop_reason, measured=self.tally.measured,
            measured_now=self.measured_now, best_config=self.tally.best_config,
            best_gflops=None if best is None else best.value,
            best_number=None if best is None else best.number,
        )


def run_study(
    session: Session,
    family: Any,
    problem: Problem,
    budget: Budget,
    baseline_gflops: float | None = None,
    startup: Startup | None = None,
) -> StudyOutcome:
    """Runs (or resumes) the study of ``family`` on ``problem`` until a stop rule holds.
    ``startup``: its start-up inputs where prepared ahead (``StartupPrefetch``)."""
    return StudyRun(session, family, problem, budget, baseline_gflops, startup).run()


def record_fields(measurement: Measurement) -> dict[str, Any]:
    """A measurement's fields as a trial stores them: the clock in whole MHz, times and GFLOP/s
    that are not finite and positive as None, an "ok" without a usable time not ok."""
    fields = measurement.fields()
    if fields["sm_clock_mhz"] is not None:
        fields["sm_clock_mhz"] = int(round(fields["sm_clock_mhz"]))
    for name in ("time_min_ms", "time_median_ms", "time_max_ms", "gflops"):
        value = fields[name]
        if value is not None and not (math.isfinite(value) and value > 0):
            fields[name] = None
    if measurement.state == OK and not measurement.usable:
        # An "ok" without a usable time cannot be stored as ok, nor ever become best.
        fields["state"] = "wrong_result"
        fields["error"] = (fields["error"]
                           or "evaluator returned ok without a positive time and GFLOP/s")
    return fields


def _log_trial(number: int, config: dict[str, int], measurement: Measurement,
               baseline_gflops: float | None) -> None:
    if measurement.usable:
        gflops = float(measurement.gflops)  # type: ignore[arg-type]
        fraction = f" ({gflops / baseline_gflops:.2f} of cuBLAS)" if baseline_gflops else ""
        log.info("trial %d ok %.0f GFLOP/s%s  %s", number, measurement.gflops, fraction,
                 config_text(config))
    else:
        log.info("trial %d %s  %s  %s", number, measurement.state, config_text(config),
                 (measurement.error or "").splitlines()[0][:200] if measurement.error else "")
