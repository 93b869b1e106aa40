"""The search loop: one Optuna study per (GPU model, family + source hash, problem)."""

from __future__ import annotations

import itertools
import logging
import random
import math
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import db
import optuna
from optuna.trial import FrozenTrial, Trial, TrialState
from tqdm import tqdm

from tuner import space
from tuner.evaluator import OK, REJECTED, Evaluator, Measurement
from tuner.interrupt import StopRequest
from tuner.problem import Problem
from tuner.samplers import CONSTRAINT, make_sampler
from tuner.warmstart import warm_start_configs

log = logging.getLogger(__name__)

# A new best must beat the old one by this fraction to reset the patience count: timing noise
# alone should not keep a converged study alive.
MIN_GAIN = 0.005
# Asks in a row that bring nothing new to measure (rejected or already measured) before the
# study is called exhausted: the sampler keeps circling a space it has covered.
MAX_FRUITLESS_ASKS = 200
# Spaces up to this size are enumerated once: the study then knows exactly when every accepted
# config has been measured, and when the sampler circles it is handed an unmeasured config.
ENUMERABLE_SPACE = 20_000
NUDGE_AFTER_FRUITLESS_ASKS = 20
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
    number: int
    state: str
    value: float
    violation: float


@dataclass
class _Pending:
    trial: Trial
    config: dict[str, int]
    key: tuple[tuple[str, int], ...]
    alias: bool = False  # same config as an earlier pending candidate: answered from it


def study_name(gpu_name: str, family: Any, problem: Problem) -> str:
    return (
        f"gemmtune/{gpu_name}/{family.name}@{family.source_hash[:16]}/"
        f"{problem.shape}/{problem.dtype}/{problem.layout}"
        f"{'' if problem.general_alpha_beta else '/alpha1beta0'}"
    )


def _known_from_trials(trials: list[FrozenTrial]) -> dict[tuple[tuple[str, int], ...], _Known]:
    known: dict[tuple[tuple[str, int], ...], _Known] = {}
    for trial in trials:
        state = trial.user_attrs.get("state")
        if state is None or "duplicate_of" in trial.user_attrs:
            continue
        key = space.config_key(space.config_from_params(trial.params))
        known.setdefault(
            key,
            _Known(trial.number, state, float(trial.value or 0.0),
                   sum(max(0.0, v) for v in trial.constraints.values())),
        )
    return known


def _fail_stale_trials(study: optuna.Study) -> None:
    """Trials left RUNNING by a process that died; left alone, constant liar would treat them
    as in flight forever."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        log.info("marking stale running trial %d of %s as failed", trial.number, study.study_name)
        study.tell(trial.number, state=TrialState.FAIL)


def _seed_for(seed: int | None, n_trials: int) -> int | None:
    # A resumed study must not replay the first run's random proposals.
    return None if seed is None else seed + n_trials


def _accepted_configs(family: Any, arch: str) -> list[dict[str, int]] | None:
    names = [param.name for param in family.params]
    total = math.prod(len(param.values) for param in family.params)
    if total > ENUMERABLE_SPACE:
        return None
    configs = (dict(zip(names, values))
               for values in itertools.product(*(sorted(p.values) for p in family.params)))
    return [config for config in configs if not family.reject_reasons(config, arch)]


def _config_text(config: dict[str, int]) -> str:
    return " ".join(f"{name}={value}" for name, value in config.items())


def run_study(
    session: Session,
    family: Any,
    problem: Problem,
    budget: Budget,
    baseline_gflops: float | None = None,
) -> StudyOutcome:
    name = study_name(session.gpu_name, family, problem)
    distributions = space.distributions(family)
    # The study lives in the storage; the search runs on an in-memory copy, and each finished
    # trial is written back in one transaction. Asking and telling through an RDB storage costs
    # a commit per parameter and attribute (a quarter second per trial on a slow disk), and
    # trials still in flight when the process dies never reach the storage.
    stored = optuna.create_study(
        storage=session.storage, study_name=name, direction="maximize", load_if_exists=True
    )
    _fail_stale_trials(stored)
    stored_id = session.storage.get_study_id_from_name(name)
    history = stored.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    study = optuna.create_study(
        direction="maximize",
        sampler=make_sampler(session.sampler, _seed_for(session.seed, len(history))),
    )
    study.add_trials(history)
    known = _known_from_trials(history)  # numbered as stored

    if session.warm_start and not history:
        for config in warm_start_configs(session.database, session.gpu_name, family, problem):
            log.info("%s: warm start with %s", name, _config_text(config))
            study.enqueue_trial(config, user_attrs={"warm_start": True}, skip_if_exists=True)

    problem_id = session.database.ensure_problem(
        problem.m, problem.n, problem.k, dtype=problem.dtype, layout=problem.layout,
        general_alpha_beta=problem.general_alpha_beta,
    )
    family_id = session.database.ensure_family(family.name, family.source_hash)
    run_id = session.database.start_run(
        gpu_id=session.gpu_id, problem_id=problem_id, family_id=family_id,
        sampler=session.sampler, seed=session.seed, budget=budget.as_dict(),
        host=session.host, command=session.command, study_name=name,
    )

    # What the study already knows, in trial order: count, best, and trials since the best.
    measured = 0
    best: _Known | None = None
    best_config: dict[str, int] | None = None
    since_best = 0
    for key, entry in sorted(known.items(), key=lambda item: item[1].number):
        if entry.state == REJECTED:
            continue
        measured += 1
        since_best += 1
        if entry.state == OK and (best is None or entry.value > best.value * (1 + MIN_GAIN)):
            best, best_config, since_best = entry, dict(key), 0

    arch = session.evaluator.arch()
    accepted_all = _accepted_configs(family, arch)
    nudges = random.Random(session.seed)
    deadline = None if budget.timeout_s is None else time.monotonic() + budget.timeout_s
    pending: deque[_Pending] = deque()
    measured_now = 0
    fruitless = 0
    run_state, stop_reason = "failed", "error"

    bar = tqdm(
        total=budget.trials, initial=min(measured, budget.trials), unit="trial",
        desc=f"{family.name} {problem.shape}", disable=not session.progress, leave=True,
        dynamic_ncols=True,
    )

    def show_best() -> None:
        if best is None:
            return
        postfix = {"best": f"{best.value:,.0f} GFLOP/s"}
        if baseline_gflops:
            postfix["cuBLAS"] = f"{best.value / baseline_gflops:.2f}"
        bar.set_postfix(postfix, refresh=False)

    def tell(trial: Trial, state: str, value: float, violation: float, **attrs: Any) -> int:
        """Tell the in-memory study, write the finished trial to the storage; returns the
        trial's number there (the number the results database uses too)."""
        trial.set_user_attr("state", state)
        trial.set_constraint(CONSTRAINT, violation)
        for attr, attr_value in attrs.items():
            trial.set_user_attr(attr, attr_value)
        finished = study.tell(trial, value)
        trial_id = session.storage.create_new_trial(stored_id, template_trial=finished)
        return session.storage.get_trial_number_from_id(trial_id)

    def record(trial: Trial, config: dict[str, int], measurement: Measurement,
               started_at: datetime, violation: float = 1.0) -> _Known:
        fields = _record_fields(measurement)
        usable = measurement.usable
        value = float(measurement.gflops) if usable else 0.0  # type: ignore[arg-type]
        violation = 0.0 if usable else violation
        attrs = {"error": fields["error"][:ERROR_ATTR_LIMIT]} if fields["error"] else {}
        number = tell(trial, fields["state"], value, violation, **attrs)
        session.database.add_trial(
            run_id,
            db.TrialRecord(number=number, params=config, started_at=started_at, **fields),
        )
        return _Known(number, fields["state"], value, violation)

    def tell_duplicate(trial: Trial, earlier: _Known) -> None:
        tell(trial, earlier.state, earlier.value, earlier.violation, duplicate_of=earlier.number)

    def ask() -> bool:
        """Ask for one candidate; returns whether it needs measuring (it was added to pending)."""
        trial = study.ask(distributions)
        config = space.config_from_params(trial.params)
        key = space.config_key(config)
        if key in known:
            tell_duplicate(trial, known[key])
            return False
        if any(item.key == key and not item.alias for item in pending):
            pending.append(_Pending(trial, config, key, alias=True))
            return False
        try:
            reasons = family.reject_reasons(config, arch)
        except ValueError as error:  # kernels.ConfigError: a value the family does not allow
            reasons = [str(error)]
        if reasons:
            rejected = Measurement(state=REJECTED, error="; ".join(reasons))
            known[key] = record(trial, config, rejected, datetime.now(timezone.utc),
                                violation=float(len(reasons)))
            log.debug("trial %d rejected: %s (%s)", known[key].number, _config_text(config),
                      rejected.error)
            return False
        session.evaluator.prepare(family, config)
        pending.append(_Pending(trial, config, key))
        return True

    def stop_reason_now() -> str | None:
        if session.stop.requested:
            return "interrupted"
        if measured >= budget.trials:
            return "trial budget"
        if deadline is not None and time.monotonic() >= deadline:
            return "time budget"
        if budget.patience is not None and best is not None and since_best >= budget.patience:
            return "patience"
        if not pending and covered():
            return "search space exhausted"
        return None

    def covered() -> bool:
        """Every accepted config measured or in flight (only known for enumerable spaces)."""
        if accepted_all is None:
            return False
        in_flight = {item.key for item in pending}
        return all(space.config_key(c) in known or space.config_key(c) in in_flight
                   for c in accepted_all)

    def nudge() -> None:
        """Hand a circling sampler an accepted config it has not measured yet."""
        if accepted_all is None:
            return
        in_flight = {item.key for item in pending}
        fresh = [c for c in accepted_all
                 if space.config_key(c) not in known and space.config_key(c) not in in_flight]
        if fresh:
            study.enqueue_trial(nudges.choice(fresh), user_attrs={"nudge": True})

    try:
        session.evaluator.set_problem(problem)
        while True:
            reason = stop_reason_now()
            if reason is not None:
                stop_reason = reason
                break
            # Keep up to `batch` candidates in flight so compiles run ahead of the GPU.
            while (
                sum(not item.alias for item in pending) < session.batch
                and measured + sum(not item.alias for item in pending) < budget.trials
                and fruitless < MAX_FRUITLESS_ASKS
                and not covered()
            ):
                fruitless = 0 if ask() else fruitless + 1
                if fruitless and fruitless % NUDGE_AFTER_FRUITLESS_ASKS == 0:
                    nudge()
            if not pending:
                stop_reason = "search space exhausted"
                break
            item = pending.popleft()
            if item.alias:
                tell_duplicate(item.trial, known[item.key])
                continue
            started_at = datetime.now(timezone.utc)
            measurement = session.evaluator.evaluate(family, item.config, problem)
            result = record(item.trial, item.config, measurement, started_at)
            known[item.key] = result
            measured += 1
            measured_now += 1
            since_best += 1
            if result.state == OK and (best is None or result.value > best.value * (1 + MIN_GAIN)):
                best, best_config, since_best = result, item.config, 0
            bar.update(1)
            show_best()
            _log_trial(result.number, item.config, measurement, baseline_gflops)
        run_state = "interrupted" if stop_reason == "interrupted" else "finished"
    except KeyboardInterrupt:
        run_state, stop_reason = "interrupted", "interrupted"
        raise
    finally:
        for item in pending:  # asked but never measured: not a result, just let go
            study.tell(item.trial, state=TrialState.FAIL)
        pending.clear()
        bar.close()
        session.database.finish_run(run_id, run_state)
        log.info("%s: %s after %d new measurements (%s)", name, run_state, measured_now,
                 stop_reason)

    return StudyOutcome(
        study_name=name, run_id=run_id, run_state=run_state, stop_reason=stop_reason,
        measured=measured, measured_now=measured_now, best_config=best_config,
        best_gflops=None if best is None else best.value,
        best_number=None if best is None else best.number,
    )


def _record_fields(measurement: Measurement) -> dict[str, Any]:
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
        fields["error"] = fields["error"] or "evaluator returned ok without a positive GFLOP/s"
    return fields


def _log_trial(number: int, config: dict[str, int], measurement: Measurement,
               baseline_gflops: float | None) -> None:
    if measurement.usable:
        fraction = (f" ({measurement.gflops / baseline_gflops:.2f} of cuBLAS)"  # type: ignore[operator]
                    if baseline_gflops else "")
        log.info("trial %d ok %.0f GFLOP/s%s  %s", number, measurement.gflops, fraction,
                 _config_text(config))
    else:
        log.info("trial %d %s  %s  %s", number, measurement.state, _config_text(config),
                 (measurement.error or "").splitlines()[0][:200] if measurement.error else "")
