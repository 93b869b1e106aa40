"""Search efficiency: how many measurements each sampler needs to come near the true optimum.

    python bench/search_efficiency.py                       # every recording, 20 seeds
    python bench/search_efficiency.py --seeds 2 --samplers default random
    # in parts (Optuna's own samplers capped, GP on the less constrained family only), then one table:
    python bench/search_efficiency.py --samplers default random --out dr.json
    python bench/search_efficiency.py --samplers tpe cmaes --reference-max-evals 40 --out tc.json
    python bench/search_efficiency.py --samplers gp --family vectorized --reference-max-evals 40 --out gp.json
    python bench/search_efficiency.py --merge dr.json tc.json gp.json
    # a table grown by new pairs: their random runs, and Kernel Tuner's rows by reference
    python bench/search_efficiency.py --merge table.json new-default.json new-random-kt.json \
        --merge-samplers default random --kernel-tuner-from new-random-kt.json
    # only the recordings in the tree now (one removed leaves the table; an old name resolves):
    python bench/search_efficiency.py --merge table.json --merge-recordings tuner/recordings/*.json.gz
    # today's table, re-read from the kept outputs (docs/search.md, "Today's table"):
    python bench/search_efficiency.py --merge bench/results/search_efficiency-table.json.gz \
        --kernel-tuner-from bench/results/search_efficiency-table.json.gz \
        --merge-recordings tuner/recordings/*.json.gz
    # Kernel Tuner's strategies as reference rows (simulation mode on the same recordings):
    python bench/search_efficiency.py --samplers default random --kernel-tuner all
    python bench/search_efficiency.py --kernel-tuner none      # without them
    # warm start across GPU models (issue 17 part 2), e.g. the H200 warm-started from the H100:
    python bench/search_efficiency.py --samplers prior --cross-model --kernel-tuner none \
        --recording tuner/recordings/h200-splitk-256x256x16384+512x384x8192.json.gz \
        --recording tuner/recordings/h100-splitk-256x256x16384+512x384x8192.json.gz

For every (family, shape) of every recording in tuner/recordings/ that holds the full
accepted space of its grid (so the recorded optimum is the optimum of the space searched), each
sampler the tuner offers runs the tuner's own search loop (``tuner.search.study.run_study`` with
``tuner.search.samplers.make_sampler``) against the replay evaluator, once per seed, from a cold start
(no warm-start configs: a new GPU or shape). A run stops when it has measured a config within
1% of the optimum, or at ``--max-evals``.

What counts as an evaluation: a measured candidate, i.e. one that would cost GPU time (ok,
compile_error, launch_error, wrong_result, timeout, crashed). Configs the family's constraints
reject cost nothing (never compiled nor run) and proposals of an already measured config are
answered from the study: neither is counted. ``missing`` cannot happen on a full recording.

Recordings of several GPU models (the header's ``gpu.name``) may be given together. Every row
but ``prior+xmodel`` sees only the searched GPU model's recordings (``Job.others``, ``plan``):
no other model's measurement, of the same problem least of all, reaches its warm start or
training, so leave-one-out stays leave-one-out and nothing is stored under the wrong GPU.

The ``model`` sampler (tuner.search.learned; ``default`` runs it on every recording, their grids
being listed) learns from measurements of other problems: here every measured config of every
recorded problem of the same GPU model except the one searched — all of its families are held
out (leave-one-out, ``training_for``). Each row says whether its sampler was fitted on the
recording it is measured on (``fit_kind``): ``in-sample`` for the prior set-up's rows
(``prior``) on the recordings its constants were chosen on
(``DESIGN_RECORDINGS``), and for the model's there too (one of its features is the prior's
estimate), ``leave-one-out`` for the model's elsewhere, ``-`` where nothing was fitted (random,
Optuna's own).

Warm-started rows run the tuner's own warm start (``tuner.search.warmstart``) on a fresh
database seeded with recorded optima (as finished runs): ``prior+warm`` and ``default+warm``
(``--warm-start``; the prior set-up, and the default learning leave-one-out as its cold rows do)
with the family's optimum on every OTHER problem recorded on the same GPU model; ``prior+xmodel``
(``--cross-model``, issue 17 part 2) runs the prior set-up with the family's optimum on every
problem each OTHER GPU model's recording holds, the searched one included (what a service that
tuned that model knows), stored under that model's GPU — nothing of the searched model. Its
pairs without another model's recording of the family are listed as skipped; its target: median
evaluations to 3% at most half the cold ``prior`` row's (``cross_model_target``).

Kernel Tuner reference rows (``kt:STRATEGY``, ``--kernel-tuner``; on by default when the
``kernel_tuner`` package is importable): the same (recording, family, shape) written as a Kernel
Tuner cache (``tuner.measure.kerneltuner.cache_from_recording``) and searched by
``kernel_tuner.tune_kernel`` in simulation mode, restricted to the recorded configs, with
``max_fevals`` = the space (or ``--max-evals``), Python's and NumPy's global RNGs seeded per run.
Counted the same way: the unique configs Kernel Tuner's runner served (ok or failed; a repeat is
answered from its cache and costs nothing), in the order served, until within 1% (then the run's
budget is declared spent, Kernel Tuner's own stop). The best-so-far is flops / the cache's
``time`` (the recorded median ms, the objective Kernel Tuner minimises).

Reported per sampler: the median and 90th percentile of the evaluations needed to reach within
1%, 3% and 5% of the optimum (``>N``: not reached within N in at least that share of runs),
printed as a table and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.measure.recording import (BUNDLED_RECORDINGS, Recording, canonical_name,  # noqa: E402
                                      load, read_json, resolve, write_json)
from tuner.problem import Problem  # noqa: E402
from tuner.report import format_table  # noqa: E402
# LEARNING: they learn from the other recordings (leave-one-out); ``default`` is the model on
# every recording (their grids are listed)
from tuner.search.choices import LEARNING, SAMPLERS, missing_packages  # noqa: E402

THRESHOLDS = (0.01, 0.03, 0.05)
COSTLESS = ("rejected", "missing")
# The prior set-up as a service runs it: warm-started
# from what the database knows. Here that is the recorded optimum of the same family on every
# OTHER recorded problem (real measurements, leave-one-out: never the problem being searched),
# in a fresh database per run.
WARM = "prior+warm"
# The default (the model on every recording) as a service runs it: the same warm start, and the
# model learning from the other recorded problems (leave-one-out), as the model rows do.
DEFAULT_WARM = "default+warm"
# The prior set-up as a service that has tuned other GPU models starts on a new one (issue 17
# part 2): warm-started from the family's recorded optima of every OTHER GPU model's recordings
# (the searched problem included, stored under that model's GPU), nothing of the searched model.
XMODEL = "prior+xmodel"
WARM_SETUPS = {WARM: "prior", DEFAULT_WARM: "default", XMODEL: "prior"}  # what each warm row runs
# the target checks compare these
UNCAPPED = ("default", "model", "prior", "hybrid", "random", WARM, DEFAULT_WARM, XMODEL)
# rows the target check holds against random
CHECKED = ("default", "model", "prior", "hybrid", WARM, DEFAULT_WARM)
# The recordings the prior set-up's constants (tuner.search.prior, GROUP_TRIES, …) were
# chosen on: its rows there are in-sample (docs/search.md, "How the search is measured").
DESIGN_RECORDINGS = ("h100-warptile+vectorized-2048x2048x2048+1024x1024x1024.json.gz",
                     "h100-warptile+vectorized-1023x1025x999.json.gz")
KT = "kt:"  # prefix of the Kernel Tuner rows' sampler names
# Kernel Tuner strategies run by default (its classic single-objective ones); --kernel-tuner
# all adds the rest Kernel Tuner 1.5 offers: brute_force (a fixed walk), minimize, greedy_mls,
# ordered_greedy_mls, hybrid_vndx, adaptive_tabu_greywolf, nsga2/3 (pymoo), skopt and
# pyatf_strategies (these two need packages Kernel Tuner does not install).
KT_DEFAULT = ("random_sample", "genetic_algorithm", "dual_annealing", "simulated_annealing",
              "greedy_ils", "mls", "pso", "diff_evo", "firefly_algorithm", "basinhopping",
              "bayes_opt")
KT_NO_MAX_FEVALS = ("brute_force",)  # refuses the option; it walks the whole space anyway
# A run that keeps re-serving known configs (greedy_ils needs a new config for every unique
# evaluation and may loop on repeats) is cut after this many served results per config.
KT_SERVED_PER_CONFIG = 50
DEFAULT_OUT = ROOT / "bench" / "results" / "search_efficiency.json.gz"
RECORDINGS = BUNDLED_RECORDINGS


@dataclass(frozen=True)
class Job:
    recording: str  # path
    family: str
    problem: Problem
    sampler: str
    seed: int
    max_evals: int
    # recordings of the searched GPU model: a WARM run's seed, the model's training
    others: tuple[str, ...] = ()
    other_models: tuple[str, ...] = ()  # recordings of other GPU models: an XMODEL run's seed
    batch: int = 1  # candidates asked ahead of the results (the live tuner's compile window)
    prior_compiles: int | None = None  # the prior's compile bound (None: the tuner's default)


class _StopNearOptimum:
    """The replay evaluator, plus: ask the search loop to stop once a result is within the
    tightest threshold (the loop stops after recording that trial)."""

    def __init__(self, inner: Any, target_gflops: float, stop: Any) -> None:
        self.inner, self.target, self.stop = inner, target_gflops, stop

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Any:
        measurement = self.inner.evaluate(family, config, problem)
        if measurement.usable and measurement.gflops >= self.target:
            self.stop.request()
        return measurement

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_WORKER: dict[str, Any] = {}


def _worker_state(recording_path: str) -> tuple[Any, Recording]:
    import db

    if "database" not in _WORKER:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None  # no fsync cost
        _WORKER["dir"] = tempfile.TemporaryDirectory(prefix="gemmtune-bench-", dir=folder)
        _WORKER["database"] = db.open_database(f"sqlite:///{_WORKER['dir'].name}/bench.sqlite")
        _WORKER["recordings"] = {}
    if recording_path not in _WORKER["recordings"]:
        _WORKER["recordings"][recording_path] = load(recording_path)
    return _WORKER["database"], _WORKER["recordings"][recording_path]


def run_one(job: Job) -> dict[str, Any]:
    """One study; returns the best-so-far curve over measured candidates."""
    if job.sampler.startswith(KT):
        return run_kernel_tuner(job)
    import db
    import optuna

    from tuner.lifetime import StopRequest
    from tuner.measure.replay import ReplayEvaluator
    from tuner.search.study import Budget, Session, run_study

    database, recording = _worker_state(job.recording)
    replay = ReplayEvaluator(recording)
    import kernels

    family = replay.family(kernels.get_family(job.family))
    _, optimum = recording.optimum(job.family, job.problem)  # type: ignore[misc]
    stop = StopRequest()
    evaluator = _StopNearOptimum(replay, optimum * (1 - min(THRESHOLDS)), stop)
    info = replay.info()
    warm = job.sampler in WARM_SETUPS
    sampler = WARM_SETUPS.get(job.sampler, job.sampler)  # the set-up the row runs
    scratch, warm_from = None, []
    if warm:  # a database of its own: only what the row may know, nothing of this problem
        scratch = tempfile.TemporaryDirectory(prefix="gemmtune-warm-", dir=_WORKER["dir"].name)
        database = db.open_database(f"sqlite:///{scratch.name}/warm.sqlite")
        if job.sampler in (WARM, DEFAULT_WARM):
            _seed_other_optima(database, job, info)
        else:
            warm_from = _seed_other_models(database, job)
    training = training_for(job, str(info["name"])) if sampler in LEARNING else None
    session = Session(
        database=database, evaluator=evaluator, storage=optuna.storages.InMemoryStorage(),
        training=training,
        gpu_id=database.ensure_gpu(db.GpuInfo(**info)), gpu_name=info["name"],
        sampler=sampler, seed=job.seed, batch=job.batch, warm_start=warm,
        progress=False, command="bench/search_efficiency.py", stop=stop,
        **({} if job.prior_compiles is None else {"prior_compiles": job.prior_compiles}),
    )
    started = time.perf_counter()
    outcome = run_study(session, family, job.problem,
                        Budget(trials=job.max_evals, timeout_s=None, patience=None))
    seconds = time.perf_counter() - started
    trials = database.run_history(outcome.run_id)
    if scratch is not None:
        database.close()
        scratch.cleanup()
    best, curve = 0.0, []
    for trial in trials:
        if trial.state in COSTLESS:
            continue
        if trial.state == "ok" and trial.gflops:
            best = max(best, trial.gflops)
        curve.append(best / optimum)
    # What costs GPU time is what reached the evaluator: it must be exactly what is counted.
    if len(curve) != replay.evaluations:
        raise AssertionError(f"{job}: counted {len(curve)} evaluations but the evaluator "
                             f"measured {replay.evaluations} configs")
    return {"recording": canonical_name(job.recording), "family": job.family,
            "shape": job.problem.shape, "sampler": job.sampler, "seed": job.seed,
            "batch": job.batch,
            "evaluations": len(curve), "max_evals": job.max_evals, "asked": len(trials), "seconds": seconds,
            "reached": {f"{t:.0%}": _first_reach(curve, t) for t in THRESHOLDS},
            **({"warm_from": warm_from} if job.sampler == XMODEL else {})}


def training_for(job: Job, gpu: str) -> list[Any]:
    """What the model sampler learns from in ``job``: every measured config of every recorded
    problem of the searched GPU model except the one searched (all its families: leave-one-out).
    Only that model's: problem_held_out holds out the searched shape on ``gpu`` alone, so another
    model's recording of the same problem would reach the fit."""
    from tuner.search.learned import examples_from_recordings, problem_held_out

    return examples_from_recordings(_same_model(job), problem_held_out(gpu, job.problem.shape))


def _gpu_model(recording: Recording) -> str:
    return str(recording.gpu["name"])


def _same_model(job: Job) -> list[Recording]:
    """job.others, loaded; each must be of the searched GPU model (a plain row's whole world)."""
    model = _gpu_model(_worker_state(job.recording)[1])
    recordings = [_worker_state(path)[1] for path in job.others]
    strays = sorted({_gpu_model(r) for r in recordings} - {model})
    if strays:
        raise ValueError(f"{job}: others of another GPU model ({', '.join(strays)}) than {model}")
    return recordings


def fit_kind(sampler: str, recording: str, warm_from: list[str] | None = None) -> str:
    """Whether a row's sampler was fitted on the recording it is measured on (an XMODEL row:
    which GPU models' optima it started from, ``warm_from``)."""
    if sampler == XMODEL:
        return f"warm-started from {', '.join(warm_from or ['-'])}"
    if sampler in ("default", "model", DEFAULT_WARM, "hybrid"):
        # fitted leave-one-out, but one of the model's features is the static prior's estimate
        # (costmodel's prior_rate), whose constants were chosen on DESIGN_RECORDINGS
        return "in-sample" if canonical_name(recording) in DESIGN_RECORDINGS else "leave-one-out"
    if sampler in ("prior", WARM):
        return ("in-sample" if canonical_name(recording) in DESIGN_RECORDINGS
                else "not fitted on it")
    return "-"


def _seed_other_optima(database: Any, job: Job, info: dict[str, Any]) -> None:
    """Store, as finished runs, the recorded optimum of job.family on every other recorded
    problem of the searched GPU model (``info``): what a service that had tuned those shapes on
    it would know."""
    import db

    gpu_id = database.ensure_gpu(db.GpuInfo(**info))
    for path, recording in zip(job.others, _same_model(job)):
        _store_optima(database, gpu_id, path, recording, job.family, skip=job.problem)


def _seed_other_models(database: Any, job: Job) -> list[str]:
    """Store the recorded optimum of job.family on every problem each other GPU model's
    recording holds (the searched one included: a service that tuned it on that model knows
    it), under that recording's own GPU; returns those GPU models."""
    import db

    models = []
    for path in job.other_models:
        recording = _worker_state(path)[1]
        if _gpu_model(recording) == _gpu_model(_worker_state(job.recording)[1]):
            raise ValueError(f"{job}: {Path(path).name} is of the searched GPU model")
        gpu_id = database.ensure_gpu(db.GpuInfo(**recording.gpu))
        if _store_optima(database, gpu_id, path, recording, job.family):
            models.append(_gpu_model(recording))
    return sorted(set(models))


def _store_optima(database: Any, gpu_id: int, path: str, recording: Recording, family: str,
                  skip: Problem | None = None) -> int:
    """Store, as one finished run each, the recorded optimum of ``family`` on every problem of
    ``recording`` but ``skip``, under ``gpu_id``; returns how many."""
    import db

    header = recording.families.get(family)
    if header is None:
        return 0
    stored = 0
    for recorded, problem in recording.pairs():
        if recorded != family or problem == skip:
            continue
        config, _ = recording.optimum(family, problem)  # type: ignore[misc]
        result = recording.result(family, problem, config)
        run_id = database.start_run(
            gpu_id=gpu_id, problem_id=database.ensure_problem(problem.m, problem.n, problem.k),
            family_id=database.ensure_family(family, header.source_hash), sampler="recorded",
            seed=None, budget={}, host="bench", command=f"recorded optimum ({Path(path).name})",
            study_name=None)
        database.add_trial(run_id, db.TrialRecord(
            number=0, params=config, state="ok", time_median_ms=result.time_median_ms,
            gflops=result.gflops))
        database.finish_run(run_id, "finished")
        stored += 1
    return stored


def _first_reach(curve: list[float], threshold: float) -> int | None:
    for index, fraction in enumerate(curve, start=1):
        if fraction >= 1 - threshold - 1e-12:
            return index
    return None


# ------------------------------------------------------------------ Kernel Tuner reference rows


def kernel_tuner_strategies() -> tuple[list[str], dict[str, str]]:
    """Kernel Tuner's strategies that import here, and why the others do not (absent optional
    packages); both empty with a reason under '*' when kernel_tuner itself is absent."""
    try:
        from kernel_tuner.interface import strategy_map
    except ImportError as error:
        return [], {"*": f"kernel_tuner is not importable ({error})"}
    usable, broken = [], {}
    for name, module in strategy_map.items():
        try:
            module.tune  # the lazy module imports on first attribute access
        except ImportError as error:
            broken[name] = str(error).split("Original error: ")[-1]
        else:
            usable.append(name)
    return usable, broken


def _kt_cache_file(job: Job, recording: Recording) -> Path:
    """The pair as a Kernel Tuner cache file, written once per worker (simulation mode only
    reads it)."""
    from tuner.measure.kerneltuner import cache_from_recording

    _worker_state(job.recording)  # the worker's scratch folder
    name = f"kt-{Path(job.recording).name}-{job.family}-{job.problem.shape}.json"
    path = Path(_WORKER["dir"].name) / name
    if not path.exists():
        path.write_text(json.dumps(cache_from_recording(recording, job.family, job.problem)))
    return path


class _ServedOrder:
    """Kernel Tuner's runner, watched: records every result it serves (first visits and
    repeats, in order) and, once one is within the tightest threshold, declares the run's
    budget spent, which Kernel Tuner's strategies obey as their own stop."""

    def __init__(self, inner: Any, target_ms: float, cut: int) -> None:
        self.inner, self.target_ms, self.cut = inner, target_ms, cut
        self.served: list[dict[str, Any]] = []
        self.reached = self.was_cut = False

    def run(self, parameter_space: Any, tuning_options: Any) -> list[Any]:
        results = self.inner.run(parameter_space, tuning_options)
        self.served += [r for r in results if r is not None]
        self.reached = self.reached or any(_kt_time(r) <= self.target_ms for r in results if r)
        self.was_cut = self.was_cut or (not self.reached and len(self.served) >= self.cut)
        if self.reached or self.was_cut:
            budget = tuning_options.budget
            budget.max_fevals = budget.num_fevals
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Watched:
    """A Kernel Tuner strategy run unchanged (through tune_kernel's user-strategy hook) on the
    watched runner; keeps the budget so the count can be checked against it."""

    def __init__(self, name: str, make_runner: Any) -> None:
        from kernel_tuner.interface import strategy_map

        self.name, self.module, self.make_runner = name, strategy_map[name], make_runner
        self.runner: _ServedOrder | None = None
        self.budget: Any = None

    def tune(self, searchspace: Any, runner: Any, tuning_options: Any) -> Any:
        self.runner, self.budget = self.make_runner(runner), tuning_options.budget
        tuning_options["strategy"] = self.name  # as with a named strategy (pymoo's read it)
        return self.module.tune(searchspace, self.runner, tuning_options)


def _kt_time(result: dict[str, Any]) -> float:
    """A served result's time in ms; inf for a failed config (Kernel Tuner marks those with
    '__error__' and the marker string in 'time')."""
    value = result.get("time")
    if "__error__" in result or not isinstance(value, (int, float)):
        return math.inf
    return float(value)


def _kt_restriction(recorded: set[str]) -> Any:
    """Kernel Tuner's restriction admitting the recorded configs only, as a python-constraint
    FunctionConstraint (called with the values in tune_params order). Not a plain function:
    Kernel Tuner 1.5 reads a callable restriction's source text from disk to look for lambdas
    (a closure's captured names are lost, and a source file edited while the benchmark runs
    yields the wrong lines), and calls a list of callables with the values positionally."""
    from constraint import FunctionConstraint

    def recorded_only(*values: int) -> bool:
        return ",".join(str(v) for v in values) in recorded

    return FunctionConstraint(recorded_only)


def _kt_key(result: dict[str, Any], keys: list[str]) -> str:
    return ",".join(str(result[k]) for k in keys)


def kt_measured(served: list[dict[str, Any]], keys: list[str]) -> list[tuple[str, float]]:
    """(config key, time ms) of each config in the order first served: what costs GPU time.
    Repeats are answered from the cache; Kernel Tuner's InvalidConfig never ran."""
    from kernel_tuner.util import InvalidConfig

    first: dict[str, float] = {}
    for result in served:
        if isinstance(result.get("__error__"), InvalidConfig):
            continue
        first.setdefault(_kt_key(result, keys), _kt_time(result))
    return list(first.items())


@dataclass
class KtSearch:
    """What one Kernel Tuner run measured: (config key, time ms; inf if it failed) in the order
    first served, with what the check needs."""
    measured: list[tuple[str, float]]
    served: int  # results served, repeats included
    spent: int  # unique evaluations by Kernel Tuner's own budget
    returned: list[str]  # unique configs of tune_kernel's results list, in its order
    best_ms: float  # the recorded optimum's time
    cut: bool
    seconds: float


def kt_search(job: Job) -> KtSearch:
    """One Kernel Tuner search in simulation mode over the recorded (family, problem)."""
    import warnings

    import kernel_tuner
    import numpy

    recording = _worker_state(job.recording)[1]
    header = recording.families[job.family]
    keys = list(header.params)
    recorded = _kt_recorded(recording, job)
    best_ms = min(r.time_median_ms for r in recorded.values() if r.usable)
    strategy = job.sampler[len(KT):]
    watched = _Watched(strategy, lambda runner: _ServedOrder(
        runner, best_ms / (1 - min(THRESHOLDS)), KT_SERVED_PER_CONFIG * len(recorded)))
    options = {} if strategy in KT_NO_MAX_FEVALS else {"max_fevals": job.max_evals}
    random.seed(job.seed)
    numpy.random.seed(job.seed)  # Kernel Tuner's strategies draw from the global RNGs
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = kernel_tuner.tune_kernel(
            job.family, "", [job.problem.m, job.problem.n, job.problem.k], [],
            {k: list(header.grid[k]) for k in keys},
            restrictions=[_kt_restriction(set(recorded))],
            cache=str(_kt_cache_file(job, recording)), simulation_mode=True,
            strategy=watched, strategy_options=options, objective="time",
            objective_higher_is_better=False, seed=job.seed, quiet=True)
    runner = watched.runner
    assert runner is not None
    return KtSearch(measured=kt_measured(runner.served, keys), served=len(runner.served),
                    spent=watched.budget.num_fevals,
                    returned=[k for k, _ in kt_measured([r for r in results if r], keys)],
                    best_ms=best_ms, cut=runner.was_cut, seconds=time.perf_counter() - started)


def _kt_recorded(recording: Recording, job: Job) -> dict[str, Any]:
    """The recorded results by Kernel Tuner's cache key (comma-joined values)."""
    keys = recording.families[job.family].params
    return {",".join(str(c[k]) for k in keys): r
            for c, r in recording.results(job.family, job.problem)}


def run_kernel_tuner(job: Job) -> dict[str, Any]:
    """One Kernel Tuner run as a row's run: the best-so-far curve over what it measured."""
    import kernels

    search = kt_search(job)
    recording = _worker_state(job.recording)[1]
    _check_kt_count(job, search, _kt_recorded(recording, job))
    flops = kernels.get_family(job.family).flops(job.problem.m, job.problem.n, job.problem.k)
    optimum = recording.optimum(job.family, job.problem)[1]  # type: ignore[index]
    # our rows' optimum is the best GFLOP/s, Kernel Tuner's the least time: the same config
    if not math.isclose(flops / search.best_ms / 1e6, optimum, rel_tol=1e-9):
        raise AssertionError(f"{job}: GFLOP/s {optimum} is not flops / {search.best_ms} ms")
    curve, best = [], math.inf
    for _, ms in search.measured:
        best = min(best, ms)
        curve.append(search.best_ms / best if math.isfinite(best) else 0.0)
    return {"recording": canonical_name(job.recording), "family": job.family,
            "shape": job.problem.shape, "sampler": job.sampler, "seed": job.seed,
            "evaluations": len(curve), "max_evals": job.max_evals, "asked": search.served,
            "seconds": search.seconds, "cut": search.cut,
            "order": _order_digest([key for key, _ in search.measured]),
            "reached": {f"{t:.0%}": _first_reach(curve, t) for t in THRESHOLDS}}


def _check_kt_count(job: Job, search: KtSearch, recorded: dict[str, Any]) -> None:
    """What is counted must be what Kernel Tuner ran: recorded configs, each once, as many as
    its budget counted, in the order of its own results list, at the recorded times."""
    order = [key for key, _ in search.measured]
    stray = [key for key in order if key not in recorded]
    if stray:
        raise AssertionError(f"{job}: Kernel Tuner ran configs the recording lacks: {stray[:3]}")
    if len(order) != search.spent:
        raise AssertionError(f"{job}: counted {len(order)} configs, Kernel Tuner's budget "
                             f"counted {search.spent} evaluations")
    if search.returned != order:
        raise AssertionError(f"{job}: Kernel Tuner's results list differs from what it served")
    for key, ms in search.measured:
        result = recorded[key]
        if result.usable != math.isfinite(ms) or (result.usable and ms != result.time_median_ms):
            raise AssertionError(f"{job}: config {key}: served {ms} ms, recorded "
                                 f"{result.state} {result.time_median_ms} ms")


def _order_digest(order: list[str]) -> str:
    """A short fingerprint of a run's order: equal for every seed = the strategy ignores it."""
    import hashlib

    return hashlib.sha1("|".join(order).encode()).hexdigest()[:12]


def _unreached(value: float | None) -> float:
    """A count where None (never reached; null in the JSON, ``_finite``) is +inf."""
    return math.inf if value is None else value


def _percentile(values: list[int | None], q: float) -> float:
    """Nearest-rank percentile with runs that never reached as +inf."""
    ranked = sorted(_unreached(v) for v in values)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def _median(values: list[int | None]) -> float:
    finite = [_unreached(v) for v in values]
    return statistics.median(finite) if finite else math.inf


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["recording"], r["family"], r["shape"], r["sampler"]), []).append(r)
    rows = []
    # one block per pair (in the order first seen), samplers in the CLI's order within it
    pairs = list(dict.fromkeys(key[:3] for key in groups))
    order = sorted(groups, key=lambda k: (pairs.index(k[:3]), SAMPLERS.index(k[3])
                                          if k[3] in SAMPLERS else len(SAMPLERS)))
    for recording, family, shape, sampler in order:
        runs = groups[(recording, family, shape, sampler)]
        row: dict[str, Any] = {"recording": recording, "family": family, "shape": shape,
                               "sampler": sampler,
                               "fit": fit_kind(sampler, recording, runs[0].get("warm_from")),
                               "runs": len(runs),
                               "max_evals": max(r["max_evals"] for r in runs),
                               "seconds_per_run": statistics.mean(r["seconds"] for r in runs)}
        for t in THRESHOLDS:
            key = f"{t:.0%}"
            reached = [r["reached"][key] for r in runs]
            row[key] = {"median": _median(reached), "p90": _percentile(reached, 0.9),
                        "not_reached": sum(v is None for v in reached)}
        if sampler.startswith(KT):
            # one order for every seed: the strategy ignores the seeding (or is deterministic)
            row["distinct_orders"] = len({r["order"] for r in runs})
            row["cut"] = sum(bool(r.get("cut")) for r in runs)
        rows.append(row)
    return rows


def best_kernel_tuner(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pair, the Kernel Tuner strategy with the lowest median to 3% (ties: lower p90).
    A strategy that took one order for every seed (brute_force's fixed walk) is left out: its
    figure says where the optimum sits in that walk, not how well it searches."""
    return lowest_per_pair([
        {"recording": row["recording"], "family": row["family"], "shape": row["shape"],
         "strategy": row["sampler"], "median": row["3%"]["median"], "p90": row["3%"]["p90"],
         "runs": row["runs"], "max_evals": row["max_evals"]}
        for row in rows if row["sampler"].startswith(KT)
        and not (row["runs"] > 1 and row["distinct_orders"] == 1)])


def lowest_per_pair(best: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pair, the Kernel Tuner row with the lowest median to 3% (ties: lower p90, then the
    first), e.g. this run's best rows followed by earlier outputs' (``--kernel-tuner-from``)."""
    lowest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in best:
        pair = (row["recording"], row["family"], row["shape"])
        if pair not in lowest or ((row["median"], row["p90"])
                                  < (lowest[pair]["median"], lowest[pair]["p90"])):
            lowest[pair] = row
    return list(lowest.values())


def _cell(value: float, cap: int) -> str:
    return f">{cap}" if math.isinf(value) else f"{value:g}"


def target_check(rows: list[dict[str, Any]], kernel_tuner: list[dict[str, Any]] | None = None
                 ) -> list[dict[str, Any]]:
    """Issue 15's targets at 3% for the default (cold, and warm-started where run) and the
    model: median at most a third of random's, p90 at most random's median, and — where
    Kernel Tuner rows ran (or ``kernel_tuner``, best rows per pair, says) — median at most half
    the best Kernel Tuner strategy's. ``all_met``: all of those that were checked."""
    checks = []
    by_key = {(r["recording"], r["family"], r["shape"], r["sampler"]): r for r in rows}
    best_kt = {(b["recording"], b["family"], b["shape"]): b
               for b in (best_kernel_tuner(rows) if kernel_tuner is None else kernel_tuner)}
    for (recording, family, shape, sampler), row in by_key.items():
        if sampler not in CHECKED or (recording, family, shape, "random") not in by_key:
            continue
        random_row = by_key[(recording, family, shape, "random")]
        d, r = row["3%"]["median"], random_row["3%"]["median"]
        p90 = row["3%"]["p90"]
        checks.append({"recording": recording, "family": family, "shape": shape, "sampler": sampler,
                       "fit": row["fit"], "default_median": d, "random_median": r,
                       "ratio": (d / r) if math.isfinite(d) and math.isfinite(r) else None,
                       "p90": p90, "p90_met": math.isfinite(p90) and p90 <= r,
                       "met": math.isfinite(d) and d * 3 <= r})
        kt = best_kt.get((recording, family, shape))
        if kt is not None:
            checks[-1].update(kt_strategy=kt["strategy"], kt_median=kt["median"],
                              kt_met=math.isfinite(d) and d * 2 <= kt["median"])
        checks[-1]["all_met"] = all(checks[-1][k] for k in ("met", "p90_met", "kt_met")
                                    if k in checks[-1])
    return checks


# Outputs of this script are written as recordings are: gzipped where the name ends in .gz (a
# replay of every recorded pair writes megabytes of runs, a tenth of that gzipped).
read_output = read_json


def write_output(path: Path, document: dict[str, Any]) -> None:
    write_json(path, document, indent=1)


def earlier_kernel_tuner(paths: list[str]) -> list[dict[str, Any]]:
    """The ``kernel_tuner_best`` rows of earlier outputs of this script, each marked with the
    file it came from (a row that an earlier merge took from another output keeps that one's
    name), under the recordings' current names (``canonical_name``)."""
    rows = []
    for path in paths:
        document = read_output(path)
        if "kernel_tuner_best" not in document:
            raise ValueError(f"{path}: not an output of this script (no kernel_tuner_best)")
        rows += [{**row, "recording": canonical_name(row["recording"]),
                  "median": _unreached(row["median"]), "p90": _unreached(row["p90"]),
                  "from": row.get("from", Path(path).name)}
                 for row in document["kernel_tuner_best"]]
    return rows


def current_names(document: dict[str, Any]) -> dict[str, Any]:
    """An earlier output with its runs' recordings under their current names: outputs written
    before a bundled recording was renamed name it as it was (``canonical_name``)."""
    return {**document,
            "runs": [{**r, "recording": canonical_name(r["recording"])} for r in document["runs"]],
            **{key: [canonical_name(name) for name in document[key]]
               for key in ("recordings", "learned_from") if key in document}}


def cross_model_check(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 17 part 2's target at 3%, per pair with an XMODEL row: warm-started from other GPU
    models, median at most half the cold prior set-up's."""
    checks = []
    by_key = {(r["recording"], r["family"], r["shape"], r["sampler"]): r for r in rows}
    for (recording, family, shape, sampler), row in by_key.items():
        cold = by_key.get((recording, family, shape, "prior"))
        if sampler != XMODEL or cold is None:
            continue
        x, d = row["3%"]["median"], cold["3%"]["median"]
        checks.append({"recording": recording, "family": family, "shape": shape,
                       "sampler": sampler, "fit": row["fit"], "xmodel_median": x,
                       "cold_median": d, "ratio": (x / d) if math.isfinite(x) and
                       math.isfinite(d) else None,
                       "met": math.isfinite(x) and x * 2 <= d})
    return checks


def _finite(value: Any) -> Any:
    """JSON has no infinity: a threshold never reached is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def report(results: list[dict[str, Any]], meta: dict[str, Any], out: Path,
           earlier_kt: list[dict[str, Any]] | None = None) -> None:
    """Print the table and the target check, and write them with every run as JSON.
    ``earlier_kt``: best Kernel Tuner rows of earlier outputs, for the target check."""
    rows = summarize(results)
    best_kt = lowest_per_pair([*best_kernel_tuner(rows), *(earlier_kt or [])])
    checks = target_check(rows, best_kt)
    cross_checks = cross_model_check(rows)
    # the recording names the GPU model: H100 and H200 rows of one shape differ only there
    table = [[r["recording"].removesuffix(".json.gz"), r["family"], r["shape"], r["sampler"],
              r.get("fit", "-"),
              *(f"{_cell(r[f'{t:.0%}']['median'], r['max_evals'])} / "
                f"{_cell(r[f'{t:.0%}']['p90'], r['max_evals'])}" for t in THRESHOLDS),
              f"{r['seconds_per_run']:.1f}"] for r in rows]
    seeds = sorted({r["runs"] for r in rows})
    print(f"Measured configs (each one costs GPU time; rejected and repeated proposals cost "
          f"nothing and are not counted) until within 1/3/5% of the recorded optimum, "
          f"{'/'.join(map(str, seeds))} seeds per row. '>N': not reached within N measured "
          f"configs in at least that share of the runs; N is the whole accepted space for "
          f"default, model, prior, random and Kernel Tuner's strategies (kt:), and the "
          f"--reference-max-evals cap for Optuna's own samplers:")
    print(format_table(["recording", "family", "shape", "sampler", "fitted on it",
                        *(f"within {t:.0%} (median / p90)" for t in THRESHOLDS), "s/run"], table))
    for best in best_kt:
        print(f"best Kernel Tuner strategy (lowest median to 3%): {best['family']} "
              f"{best['shape']}: {best['strategy']} {_cell(best['median'], best['max_evals'])} / "
              f"{_cell(best['p90'], best['max_evals'])} "
              f"(median / p90{', from ' + best['from'] if 'from' in best else ''})")
    for check in checks:
        p90 = (f"; p90 {check['p90']:g} <= random's median: "
               f"{'met' if check['p90_met'] else 'NOT met'}" if "p90" in check else "")
        kt = (f"; <= best Kernel Tuner/2 ({check['kt_strategy']} {check['kt_median']:g}): "
              f"{'met' if check['kt_met'] else 'NOT met'}" if "kt_met" in check else "")
        print(f"target ({check.get('sampler', 'default')} <= random/3 at 3%, "
              f"{check.get('fit', '-')}): {check['family']} {check['shape']}: "
              f"{check['default_median']:g} vs {check['random_median']:g} -> "
              f"{'met' if check['met'] else 'NOT met'}{p90}{kt}")
    for sampler in dict.fromkeys(c["sampler"] for c in checks):
        mine = [c for c in checks if c["sampler"] == sampler]
        print(f"{sampler}: {sum(c['all_met'] for c in mine)} of {len(mine)} pairs meet every "
              f"target checked")
    for check in cross_checks:
        print(f"target ({XMODEL} <= prior/2 at 3%, {check['fit']}): {check['recording']} "
              f"{check['family']} {check['shape']}: {check['xmodel_median']:g} vs "
              f"{check['cold_median']:g} -> "
              f"{'met' if check['met'] else 'NOT met'}")
    for name, why in meta.get("skipped_samplers", {}).items():
        print(f"sampler {name} skipped: {why}")
    for text in meta.get("skipped_pairs", []):
        print(f"skipped {text}")
    for name, why in meta.get("failed_samplers", {}).items():
        print(f"sampler {name} FAILED: {why}")
    write_output(out, _finite({
        "what": "evaluations (measured candidates; rejected and repeated proposals cost "
                "nothing and are not counted) needed to reach within 1/3/5% of the recorded "
                "optimum; one tuner search loop per run, cold (no warm start) except the "
                "prior+warm rows (warm-started from the family's recorded optima on the other "
                "recorded problems of the same GPU model) and the prior+xmodel rows "
                "(warm-started from the family's recorded optima of other GPU models, the "
                "searched problem included; cross_model_target: their median to 3% at most "
                "half the cold prior's); null: not reached within "
                "the row's max_evals (the whole space for default, model, prior, random and "
                "the kt: rows, "
                "the --reference-max-evals cap for tpe, gp and cmaes); kt:STRATEGY rows: "
                "Kernel Tuner's strategy in simulation mode on the recording written as its "
                "cache, counting the unique configs its runner served; kernel_tuner_best: "
                "per pair, the kt: row with the lowest median to 3% (among this run's and, "
                "marked 'from', those of the kernel_tuner_from outputs); target: all_met is "
                "every target checked",
        **meta, "kernel_tuner_from": sorted({r["from"] for r in earlier_kt or []}),
        "summary": rows, "target": checks, "cross_model_target": cross_checks,
        "kernel_tuner_best": best_kt,
        "runs": results,
    }))
    print(f"wrote {out}", file=sys.stderr)


def merge(paths: list[str], out: Path, earlier_kt: list[dict[str, Any]] | None = None,
          keep: list[str] | None = None, recordings: list[str] | None = None) -> None:
    """One table from several earlier outputs (e.g. default+random uncapped, then Optuna's
    own samplers capped, run separately to fit a time budget); with ``keep``, only those
    samplers' runs (e.g. the random runs of a random + Kernel Tuner output, whose Kernel Tuner
    rows join the check through ``earlier_kt`` instead); with ``recordings``, only the runs
    and Kernel Tuner rows of those recordings (by file name), so one removed from the tree
    leaves the table."""
    documents = [current_names(read_output(p)) for p in paths]
    if recordings is not None:
        documents, earlier_kt = _of_recordings(documents, earlier_kt, recordings)
    if keep:
        held = {r["sampler"] for d in documents for r in d["runs"]}
        absent = [name for name in keep if name not in held]
        if absent:
            raise SystemExit(f"--merge-samplers: no run of {', '.join(absent)} in the merged "
                             f"outputs; they hold {', '.join(sorted(held))}")
        documents = [_only(d, set(keep)) for d in documents]
    results = [run for d in documents for run in d["runs"]]
    # runs of one row may come from several outputs (--first-seed), but each seed only once
    runs = Counter((r["recording"], r["family"], r["shape"], r["sampler"], r["seed"])
                   for r in results)
    twice = [key for key, count in runs.items() if count > 1]
    if twice:
        raise SystemExit(f"--merge: {len(twice)} runs are in more than one output, e.g. "
                         f"{' '.join(map(str, twice[0]))} (recording, family, shape, sampler, "
                         f"seed); merge outputs of different seeds or rows")
    per_row = Counter(key[:4] for key in runs)
    samplers = list(dict.fromkeys(s for d in documents for s in d["samplers"]))
    meta = {"seeds": max(per_row.values(), default=0), "samplers": samplers,
            "skipped_samplers": {k: v for d in documents
                                 for k, v in d.get("skipped_samplers", {}).items()
                                 if k not in samplers},
            "skipped_pairs": sorted({t for d in documents for t in d.get("skipped_pairs", [])}),
            # a failure is stale when its output has no run of that sampler and another has
            "failed_samplers": {k: v for d in documents
                                for k, v in d.get("failed_samplers", {}).items()
                                if k in {r["sampler"] for r in d["runs"]}
                                or k not in {r["sampler"] for r in results}},
            "recordings": sorted({r for d in documents for r in d["recordings"]}),
            "learned_from": sorted({r for d in documents for r in d.get("learned_from", [])}),
            "seconds": sum(d["seconds"] for d in documents),
            "merged_from": [Path(p).name for p in paths]}
    report(results, meta, out, earlier_kt)


def _of_recordings(documents: list[dict[str, Any]], earlier_kt: list[dict[str, Any]] | None,
                   recordings: list[str]) -> tuple[list[dict[str, Any]],
                                                   list[dict[str, Any]] | None]:
    """Outputs and Kernel Tuner rows cut to the runs of these recordings' file names; what is
    dropped is said on stderr (a recording named in no output is an error: a typo)."""
    names = {canonical_name(r) for r in recordings}
    held = {r["recording"] for d in documents for r in d["runs"]}
    absent = sorted(names - held)
    if absent:
        raise SystemExit(f"--merge-recordings: no run of {', '.join(absent)} in the merged "
                         f"outputs")
    dropped = sorted(held - names)
    if dropped:
        print(f"--merge-recordings: left out the runs of {len(dropped)} recording(s) not "
              f"named: {', '.join(dropped)}", file=sys.stderr)
    documents = [{**d, "runs": [r for r in d["runs"] if r["recording"] in names],
                  "recordings": [r for r in d["recordings"] if r in names]}
                 for d in documents]
    kept_kt = None if earlier_kt is None else [r for r in earlier_kt if r["recording"] in names]
    return documents, kept_kt


def _only(document: dict[str, Any], samplers: set[str]) -> dict[str, Any]:
    """An output cut to the runs, and the skipped or failed notes, of these samplers."""
    return {**document,
            "runs": [r for r in document["runs"] if r["sampler"] in samplers],
            "samplers": [s for s in document["samplers"] if s in samplers],
            **{key: {k: v for k, v in document.get(key, {}).items() if k in samplers}
               for key in ("skipped_samplers", "failed_samplers")}}


def _quiet_worker() -> None:
    """A pool worker logs only errors (thousands of studies). Set per worker process, not in
    run_one: a caller running a job in its own process (a test) keeps its logging as it was."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("tuner").setLevel(logging.ERROR)


def _run_or_fail(job: Job) -> dict[str, Any]:
    """run_one; a Kernel Tuner strategy that raises is reported, not fatal to the others."""
    if not job.sampler.startswith(KT):
        return run_one(job)
    try:
        return run_one(job)
    except AssertionError:
        raise  # a counting check: the benchmark itself is wrong
    except Exception as error:  # noqa: BLE001 - Kernel Tuner's own failure, reported
        return {"sampler": job.sampler, "failed": f"{type(error).__name__}: {error}"[:300],
                "where": f"{job.family} {job.problem.shape} seed {job.seed}",
                "pair": [canonical_name(job.recording), job.family, job.problem.shape]}


def _kernel_tuner_choice(requested: list[str] | None) -> tuple[list[str], dict[str, str]]:
    """The kt: rows to run and the requested ones skipped (with why)."""
    if requested == ["none"]:
        return [], {}
    usable, broken = kernel_tuner_strategies()
    if "*" in broken:
        print(f"Kernel Tuner rows skipped: {broken['*']} (pip install -e '.[bench]')",
              file=sys.stderr)
        return [], ({} if requested is None else {f"{KT}*": broken["*"]})
    if requested is None:
        wanted = list(KT_DEFAULT)
    elif requested == ["all"]:
        wanted = usable + list(broken)
    else:
        wanted = requested
    chosen, skipped = [], {}
    for name in wanted:
        if name in usable:
            chosen.append(KT + name)
        else:
            skipped[KT + name] = broken.get(name, "not a Kernel Tuner strategy")
    return chosen, skipped


def plan(paths: list[str], samplers: list[str], args: argparse.Namespace,
         learn_from: Sequence[str] = ()
         ) -> tuple[list[Job], dict[tuple[str, str, str], int], list[str]]:
    """The runs, each pair's cap, and the pairs (or rows) skipped with why. A row's others are
    the recordings of the searched GPU model only (leave-one-out stays within the model: no
    other model's measurements of the same problem reach a plain row), ``learn_from`` ones
    included (recordings that are learned from and warm-started from, never searched); an
    XMODEL row's other_models are the other models' recordings that hold its family."""
    # an old name of a bundled recording stands for its current one
    paths = [str(resolve(path)) for path in paths]
    learn_from = [str(resolve(path)) for path in learn_from]
    recordings = {path: load(path) for path in paths}
    # a file named twice (e.g. a relative --recording inside an absolute glob) loads once:
    # twice in the others would count its measurements twice in every fit
    seen = {Path(path).resolve() for path in paths}
    every = dict(recordings)
    for path in learn_from:
        if Path(path).resolve() not in seen:
            seen.add(Path(path).resolve())
            every[path] = load(path)
    jobs: list[Job] = []
    caps: dict[tuple[str, str, str], int] = {}
    unusable: list[str] = []
    for path, recording in recordings.items():
        model = _gpu_model(recording)
        same = tuple(p for p, r in every.items() if _gpu_model(r) == model)
        for family, problem in recording.pairs():
            if args.family and family not in args.family:
                continue
            header = recording.families[family]
            where = f"{Path(path).name} {family} {problem.shape}"
            if header.selection.mode != "full":
                unusable.append(f"{where}: {header.selection.text}; its optimum is not the space's")
                continue
            space = sum(1 for _ in recording.results(family, problem))
            cap = min(space, args.max_evals or space)
            caps[(Path(path).name, family, problem.shape)] = cap
            other = tuple(p for p, r in every.items()
                          if _gpu_model(r) != model and family in r.families)
            runs = samplers + ([WARM, DEFAULT_WARM] if args.warm_start else [])
            if args.cross_model and other:
                runs.append(XMODEL)
            elif args.cross_model:
                unusable.append(f"{where}: no {XMODEL} row: no recording of another GPU model "
                                f"than {model} holds {family}")
            jobs += [Job(path, family, problem, s, seed,
                         cap if s in UNCAPPED or s.startswith(KT)
                         else min(cap, args.reference_max_evals or cap),
                         same, other if s == XMODEL else (), args.batch, args.prior_compiles)
                     for s in runs
                     for seed in range(args.first_seed, args.first_seed + args.seeds)]
    return jobs, caps, unusable


def arguments() -> argparse.ArgumentParser:
    """The command line (its defaults are what ``plan`` reads where an option is not given)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recording", action="append", default=[], metavar="FILE",
                        help=f"recording(s) to use (default: every *.json.gz in {RECORDINGS})")
    parser.add_argument("--samplers", nargs="*", default=list(SAMPLERS), choices=SAMPLERS,
                        help="samplers to run (none: only the --warm-start and --cross-model rows)")
    parser.add_argument("--learn-from", action="extend", nargs="+", default=[], metavar="FILE",
                        help="recordings the searches learn and warm-start from as from "
                             "--recording's, without searching their pairs (e.g. a fresh "
                             "recording with every bundled one to learn from: --recording "
                             "NEW.json.gz --learn-from tuner/recordings/*.json.gz)")
    parser.add_argument("--family", action="append", default=[], metavar="NAME",
                        help="only these kernel families of the recordings (default: all)")
    parser.add_argument("--seeds", type=int, default=20, help="runs per sampler (default: 20)")
    parser.add_argument("--first-seed", type=int, default=0, metavar="S",
                        help="the runs' seeds are S, S+1, ... (default: 0); runs of one pair "
                             "split this way --merge into the rows of one run")
    parser.add_argument("--max-evals", type=int, default=None, metavar="N",
                        help="measured candidates per run at most (default: the whole space)")
    parser.add_argument("--reference-max-evals", type=int, default=None, metavar="N",
                        help="cap for Optuna's own samplers (tpe, gp, cmaes) only: they are "
                             "reference points and slow per ask; default and random stay "
                             "uncapped so the target check always has both medians")
    parser.add_argument("--warm-start", action="store_true",
                        help=f"add '{WARM}' and '{DEFAULT_WARM}' rows per pair: the prior "
                             "set-up and the default (the model, learning leave-one-out) "
                             "warm-started from the family's recorded optima on the other "
                             "recorded problems (leave-one-out), as the tuner starts in a "
                             "service that has tuned other shapes")
    parser.add_argument("--cross-model", action="store_true",
                        help=f"add a '{XMODEL}' row per pair that another GPU model's recording "
                             "holds the family of: the prior set-up warm-started from that "
                             "model's recorded optima of the family (the searched problem "
                             "included), as the tuner starts on a new GPU model in a service "
                             "that has tuned another (issue 17: target <= half the cold "
                             "prior set-up's measurements to 3%%)")
    parser.add_argument("--kernel-tuner", nargs="+", default=None, metavar="STRATEGY",
                        help="Kernel Tuner strategies to add as kt:STRATEGY rows: names, 'all' "
                             "(every strategy Kernel Tuner offers), or 'none'; default: "
                             f"{' '.join(KT_DEFAULT)} when kernel_tuner is importable")
    parser.add_argument("--batch", type=int, default=1, metavar="N",
                        help="candidates the search asks ahead of the results, as the live tuner "
                             "does while compiles run (its window: compile workers + queue depth, "
                             "17 on the H100 host); default 1")
    parser.add_argument("--prior-compiles", type=int, default=None, metavar="N",
                        help="the static prior's compile bound per study (a replay reads the "
                             "recorded resources instead of compiling); default: the tuner's")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=str(DEFAULT_OUT), metavar="FILE",
                        help="the output (JSON; gzipped where FILE ends in .gz, as the files "
                             "--merge and --kernel-tuner-from read may be)")
    parser.add_argument("--kernel-tuner-from", nargs="+", default=[], metavar="JSON",
                        help="earlier outputs of this script whose best Kernel Tuner strategy "
                             "per pair joins the target check (Kernel Tuner's rows do not depend "
                             "on this tree: run them once per recording, e.g. --samplers "
                             "--kernel-tuner all, and reuse them); per pair the lowest median "
                             "to 3%% wins")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="run nothing: one table (printed and written to --out) from the "
                             "runs of earlier outputs of this script")
    parser.add_argument("--merge-samplers", nargs="+", default=None, metavar="NAME",
                        help="with --merge: only these samplers' runs, e.g. 'default random' to "
                             "take the random runs of a random + Kernel Tuner output whose "
                             "Kernel Tuner rows join through --kernel-tuner-from (default: "
                             "every run)")
    parser.add_argument("--merge-recordings", nargs="+", default=None, metavar="FILE",
                        help="with --merge: only the runs and Kernel Tuner rows of these "
                             "recordings (matched by file name; a bundled recording's old name "
                             "stands for its current one), e.g. tuner/recordings/*.json.gz so a "
                             "recording since removed leaves the table (default: every run)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    try:
        earlier_kt = earlier_kernel_tuner(args.kernel_tuner_from)
    except (OSError, ValueError) as error:
        parser.error(f"--kernel-tuner-from: {error}")
    if args.merge_samplers and not args.merge:
        parser.error("--merge-samplers needs --merge (it picks runs of the merged outputs)")
    if args.merge_recordings and not args.merge:
        parser.error("--merge-recordings needs --merge (it picks runs of the merged outputs)")
    if args.merge:
        merge(args.merge, Path(args.out), earlier_kt, args.merge_samplers,
              args.merge_recordings)
        return 0

    paths = args.recording or [str(p) for p in sorted(RECORDINGS.glob("*.json.gz"))]
    if not paths:
        parser.error(f"no recordings given and none in {RECORDINGS}")
    samplers, skipped = [], {}
    for name in args.samplers:
        missing = missing_packages(name)
        if missing:
            skipped[name] = f"needs {', '.join(missing)} (not installed)"
        else:
            samplers.append(name)

    strategies, kt_skipped = _kernel_tuner_choice(args.kernel_tuner)
    skipped |= kt_skipped
    samplers += strategies

    jobs, caps, unusable = plan(paths, samplers, args, args.learn_from)
    print(f"{len(jobs)} runs ({len(caps)} family/shape pairs, {args.seeds} seeds per row) on "
          f"{args.workers} processes", file=sys.stderr)
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    failures: dict[str, int] = {}
    broken_rows: set[tuple[str, ...]] = set()
    with ProcessPoolExecutor(max_workers=args.workers, initializer=_quiet_worker) as pool:
        for index, result in enumerate(pool.map(_run_or_fail, jobs, chunksize=1), start=1):
            if "failed" in result:
                name = result["sampler"]
                failures[name] = failures.get(name, 0) + 1
                broken_rows.add((*result["pair"], name))
                failed.setdefault(name, f"{result['failed']} (first: {result['where']})")
            else:
                results.append(result)
            if index % max(1, len(jobs) // 20) == 0:
                print(f"  {index}/{len(jobs)} runs, {time.monotonic() - started:.0f} s",
                      file=sys.stderr)
    # no row for a (pair, strategy) with a failed run: a row over the other seeds would mislead
    failed = {name: f"{failures[name]} of {sum(j.sampler == name for j in jobs)} runs raised "
                    f"{why}; no row for "
                    + ", ".join(" ".join(row[1:3]) for row in sorted(broken_rows)
                                if row[3] == name)
              for name, why in failed.items()}
    results = [r for r in results
               if (r["recording"], r["family"], r["shape"], r["sampler"]) not in broken_rows]
    report(results, {"seeds": args.seeds, "batch": args.batch, "prior_compiles": args.prior_compiles,
                     "samplers": samplers, "skipped_samplers": skipped,
                     "failed_samplers": failed,
                      "skipped_pairs": unusable, "recordings": [canonical_name(p) for p in paths],
                      "learned_from": [canonical_name(p) for p in args.learn_from],
                      "seconds": time.monotonic() - started},
           Path(args.out), earlier_kt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
