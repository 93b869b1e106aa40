"""A shape's fastest configs timed again at its end (docs/measurement.md, "Re-timed at the
shape's end").

A study times each config once, and the SM clock moves between timings: on an H200, f16x3 at
4096³ ran its first config at 1980 MHz and the next 27 at 1485–1875 MHz, and configs timed back
to back read 10–15 % below their timings in the search. So the order of a shape's fastest
configs was partly the clock's. Once a shape's studies are done, its fastest configs (within
RETIME_BAND of the fastest, RETIME_COUNT at most) are timed ``rounds`` more times in shuffled
rounds (``tuner.measure.record.time_in_rounds``: drift and heat fall on all alike), each
reading as the median of its timings; where that leaves a config timed once on top (its one
timing above the others' medians), the new top is timed again the same way, RETIME_PASSES at
most. cuBLAS, the shape's baseline, is timed in the same rounds. Each re-timed trial keeps its
median (``Database.retime_trial``), and the baseline's median is stored as the shape's newest:
the pick the database serves, and the command's table with its fractions of cuBLAS, are then
made on one footing.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from tuner.measure.evaluator import OK, Baseline, Measurement
from tuner.measure.record import median_by, time_in_rounds
from tuner.problem import Problem, config_key
from tuner.search.study import Session, StudyOutcome, record_fields

log = logging.getLogger(__name__)

RETIME_BAND = 0.05  # one config's timings spread by 2–4 % between runs at one clock
RETIME_COUNT = 4
RETIME_PASSES = 3


@dataclass(frozen=True)
class Retimed:
    """One re-timed trial: its first timing and the median of all of its timings."""

    family: str
    params: dict[str, int]
    trial_id: int
    first_gflops: float
    gflops: float
    timings: int


@dataclass(frozen=True)
class Settled:
    """What re-timing a shape changed: its re-timed trials, and cuBLAS's median timing where it
    was timed with them."""

    retimed: list[Retimed]
    baseline: Baseline | None = None


# What a re-timing replaces in a trial (``Database.retime_trial``'s fields)
TIMING_FIELDS = ("time_min_ms", "time_median_ms", "time_max_ms", "launches", "gflops",
                 "sm_clock_mhz")


@dataclass(frozen=True)
class _Timing:
    """One timing of a config, as a trial keeps it."""

    gflops: float  # 0: the measurement failed
    fields: dict[str, Any]

    @classmethod
    def of(cls, measurement: Measurement) -> _Timing:
        """A new timing, its fields as the study would store them (``record_fields``)."""
        fields = record_fields(measurement)
        if fields["state"] != OK or fields["gflops"] is None:
            return cls(0.0, {})
        return cls(float(fields["gflops"]), {name: fields[name] for name in TIMING_FIELDS})

    @classmethod
    def stored(cls, trial: Any) -> _Timing:
        """A db.Trial's timing."""
        return cls(float(trial.gflops), {name: getattr(trial, name) for name in TIMING_FIELDS})


@dataclass
class _Config:
    """A verified config of the shape and its timings so far, the stored one first."""

    family: str
    trial: Any  # db.Trial
    timings: list[_Timing] = field(default_factory=list)

    @property
    def median(self) -> _Timing:
        """The timing with the median GFLOP/s, as a recording's re-timed configs keep theirs."""
        return median_by(self.timings, lambda t: t.gflops)

    @property
    def retimed(self) -> bool:
        return len(self.timings) > 1


def configs_of(trials: Sequence[tuple[str, Any]]) -> list[_Config]:
    """Of (family name, db.Trial) pairs, one per verified config: its fastest trial."""
    chosen: dict[tuple[str, str], _Config] = {}
    for family, trial in sorted(trials, key=lambda ft: -(ft[1].gflops or 0.0)):
        if trial.state == "ok" and trial.gflops:
            chosen.setdefault((family, config_key(trial.params)),
                              _Config(family, trial, [_Timing.stored(trial)]))
    return list(chosen.values())


def top(configs: Sequence[_Config], count: int = RETIME_COUNT,
        band: float = RETIME_BAND) -> list[_Config]:
    """The fastest by their medians so far, those within ``band`` of the first, ``count`` at
    most; a config timed once alone on top comes with the best re-timed one, however far below
    its one timing has put it."""
    ranked = sorted((c for c in configs if c.median.gflops > 0), key=lambda c: -c.median.gflops)
    if not ranked:
        return []
    floor = ranked[0].median.gflops * (1 - band)
    near = [c for c in ranked if c.median.gflops >= floor][:count]
    if len(near) == 1 and not near[0].retimed and any(c.retimed for c in ranked):
        near.append(next(c for c in ranked if c.retimed))
    return near


def settled(near: Sequence[_Config]) -> bool:
    """Nothing to time: no two configs to order, or every one of them re-timed."""
    return len(near) < 2 or all(c.retimed for c in near)


def retime_shape(session: Session, problem: Problem,
                 studies: Sequence[tuple[Any, StudyOutcome]], rounds: int,
                 baseline: Baseline | None = None, rng: random.Random | None = None,
                 passes: int = RETIME_PASSES) -> Settled:
    """Times this shape's fastest configs (``top`` of the trials of ``studies``' runs), and
    cuBLAS where ``baseline`` (its first timing) is given, ``rounds`` more times, pass after
    pass while the top is not ``settled``, and stores each re-timed config's median; returns
    them and cuBLAS's median timing."""
    families = {family.name: family for family, _ in studies}
    configs = configs_of([(family.name, trial) for family, outcome in studies
                          for trial in session.database.run_history(outcome.run_id)])
    rng = rng or random.Random(session.seed)
    evaluator = session.evaluator

    def measure(item: _Config | None) -> _Timing | Baseline:
        if item is None:  # cuBLAS's place in the round
            return evaluator.baseline()
        return _Timing.of(evaluator.evaluate(families[item.family], dict(item.trial.params),
                                             problem))

    cublas: list[Baseline] = []
    for _ in range(passes if rounds > 0 else 0):
        near = top(configs)
        if settled(near):
            break
        items: list[_Config | None] = [*near, *([None] if baseline is not None else [])]
        timed = time_in_rounds(items, rounds, measure, rng)
        for i, config in enumerate(near):
            config.timings += [round_[i] for round_ in timed]  # type: ignore[misc]
        cublas += [round_[-1] for round_ in timed if baseline is not None]  # type: ignore[misc]
    retimed = []
    for config in (c for c in configs if c.retimed):
        trial, median = config.trial, config.median
        if median.gflops <= 0:  # most of its new timings failed: keep its first, say so
            log.warning("%s %s: re-timing failed in most rounds; its first timing stays",
                        config.family, trial.params)
            continue
        session.database.retime_trial(trial.id, timings=len(config.timings), **median.fields)
        retimed.append(Retimed(config.family, dict(trial.params), trial.id, trial.gflops,
                               median.gflops, len(config.timings)))
    if retimed:
        log.info("%s: %d of the fastest configs timed again in shuffled rounds of %d: %s",
                 problem.shape, len(retimed), rounds,
                 "; ".join(f"{r.family} {r.first_gflops:,.0f} → {r.gflops:,.0f} ({r.timings})"
                           for r in retimed))
    if not settled(top(configs)):
        log.warning("%s: after %d passes a config timed once is still among the fastest",
                    problem.shape, passes)
    median_baseline = (median_by([baseline, *cublas], lambda b: b.gflops)
                       if cublas and baseline is not None else None)
    return Settled(retimed, median_baseline)


def refresh_bests(session: Session, studies: Sequence[tuple[Any, StudyOutcome]],
                  retimed: Sequence[Retimed]) -> list[StudyOutcome]:
    """Each study's outcome with its best read again where one of its run's trials was
    re-timed: the fastest of its run's verified trials now, or its earlier best where that came
    from another run (a resumed study, another worker) and is faster."""
    touched = {r.family for r in retimed}
    outcomes = []
    for family, outcome in studies:
        if family.name not in touched:
            outcomes.append(outcome)
            continue
        ok = [t for t in session.database.run_history(outcome.run_id)
              if t.state == "ok" and t.gflops]
        best = max(ok, key=lambda t: t.gflops)
        elsewhere = outcome.best_config not in [t.params for t in ok]
        if elsewhere and outcome.best_gflops is not None and outcome.best_gflops > best.gflops:
            outcomes.append(outcome)
            continue
        outcomes.append(dataclasses.replace(outcome, best_config=dict(best.params),
                                            best_gflops=best.gflops, best_number=best.number))
    return outcomes
