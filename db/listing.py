"""Database methods that list what is stored, for the API and the dashboard."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Select, func, or_, select, true
from sqlalchemy.orm import Session

from . import convert, validate
from .core import DatabaseCore
from .models import BaselineRow, FamilyRow, GpuRow, ProblemRow, RunRow, TrialRow
from .records import FamilyVersion, Gpu, MeasuredConfig, OverviewCell, Problem, Run, Trial
from .states import TRIAL_STATES


def _run_stats() -> Any:
    """Per run: number of trials, number of ok trials, best ok gflops."""
    is_ok = (TrialRow.state == "ok")
    return (
        select(
            TrialRow.run_id.label("run_id"),
            func.count(TrialRow.id).label("n_trials"),
            func.count(TrialRow.id).filter(is_ok).label("n_ok"),
            func.max(TrialRow.gflops).filter(is_ok).label("best_gflops"),
        )
        .group_by(TrialRow.run_id)
        .subquery()
    )


def _runs_query() -> Select[Any]:
    stats = _run_stats()
    return (
        select(RunRow, GpuRow, ProblemRow, FamilyRow, stats.c.n_trials, stats.c.n_ok,
               stats.c.best_gflops)
        .join(GpuRow, RunRow.gpu_id == GpuRow.id)
        .join(ProblemRow, RunRow.problem_id == ProblemRow.id)
        .join(FamilyRow, RunRow.family_id == FamilyRow.id)
        .outerjoin(stats, stats.c.run_id == RunRow.id)
    )


def _run(row: Any) -> Run:
    run, gpu, problem, family, n_trials, n_ok, best_gflops = row
    return Run(
        id=run.id, gpu_id=gpu.id, gpu_name=gpu.name, gpu_uuid=gpu.uuid,
        problem=convert.problem(problem), family_id=family.id, family=family.name,
        source_hash=family.source_hash, sampler=run.sampler, seed=run.seed,
        budget=dict(run.budget), host=run.host, command=run.command,
        study_name=run.study_name, state=run.state, started_at=run.started_at,
        ended_at=run.ended_at, n_trials=n_trials or 0, n_ok=n_ok or 0,
        best_gflops=None if best_gflops is None else float(best_gflops),
        heartbeat_at=run.heartbeat_at, stale_after_s=run.stale_after_s,
    )


class Listings(DatabaseCore):
    def list_gpus(self) -> list[Gpu]:
        with self._reading() as session:
            rows = session.scalars(select(GpuRow).order_by(GpuRow.name, GpuRow.uuid))
            return [convert.gpu(r) for r in rows]

    def find_gpus(self, gpu: str) -> list[Gpu]:
        """GPUs whose name or UUID equals `gpu`, ignoring case; [] when none."""
        validate.text("gpu", gpu)
        key = gpu.strip().lower()
        with self._reading() as session:
            rows = session.scalars(
                select(GpuRow).where(or_(func.lower(GpuRow.name) == key,
                                         func.lower(GpuRow.uuid) == key)).order_by(GpuRow.uuid))
            return [convert.gpu(r) for r in rows]

    def list_problems(self) -> list[Problem]:
        with self._reading() as session:
            rows = session.scalars(select(ProblemRow).order_by(
                ProblemRow.m, ProblemRow.n, ProblemRow.k, ProblemRow.id))
            return [convert.problem(r) for r in rows]

    def list_families(self) -> list[FamilyVersion]:
        with self._reading() as session:
            rows = session.scalars(select(FamilyRow).order_by(FamilyRow.name,
                                                              FamilyRow.first_seen))
            return [convert.family(r) for r in rows]

    def list_runs(self, *, gpu: str | None = None, problem_id: int | None = None,
                  family: str | None = None, state: str | None = None, offset: int = 0,
                  limit: int = 100) -> list[Run]:
        """Runs, newest first, optionally only of one GPU (name or UUID), problem, family, state."""
        validate.run_state(state, optional=True)
        validate.text("family", family, optional=True)
        offset, limit = validate.paging(offset, limit)
        if problem_id is not None:
            validate.positive_int("problem_id", problem_id)
        query = _runs_query()
        with self._reading() as session:
            if gpu is not None:
                query = query.where(RunRow.gpu_id.in_(self._gpu_ids(session, gpu)))
            if problem_id is not None:
                query = query.where(RunRow.problem_id == problem_id)
            if family is not None:
                query = query.where(FamilyRow.name == family)
            if state is not None:
                query = query.where(RunRow.state == state)
            query = query.order_by(RunRow.started_at.desc(), RunRow.id.desc())
            return [_run(r) for r in session.execute(query.offset(offset).limit(limit))]

    def get_run(self, run_id: int) -> Run:
        with self._reading() as session:
            self._run_row(session, run_id)
            return _run(session.execute(_runs_query().where(RunRow.id == run_id)).one())

    def run_history(self, run_id: int) -> list[Trial]:
        """Every trial of the run, in trial-number order."""
        with self._reading() as session:
            self._run_row(session, run_id)
            rows = session.scalars(select(TrialRow).where(TrialRow.run_id == run_id)
                                   .order_by(TrialRow.number))
            return [convert.trial(r) for r in rows]

    def measured_configs(self, families: Collection[str]) -> list[MeasuredConfig]:
        """Every measured trial (any state that cost GPU time: not rejected, not missing) of
        the named families, on every GPU and problem, with the GPU's model, compute
        capability and SM count; in run and trial order."""
        query = (
            select(GpuRow.name, GpuRow.compute_capability, GpuRow.sm_count, FamilyRow.name,
                   TrialRow.params, ProblemRow.m, ProblemRow.n, ProblemRow.k, TrialRow.state,
                   TrialRow.gflops)
            .join(RunRow, TrialRow.run_id == RunRow.id)
            .join(GpuRow, RunRow.gpu_id == GpuRow.id)
            .join(ProblemRow, RunRow.problem_id == ProblemRow.id)
            .join(FamilyRow, RunRow.family_id == FamilyRow.id)
            .where(FamilyRow.name.in_(list(families)),
                   TrialRow.state.not_in(("rejected", "missing")))
            .order_by(RunRow.id, TrialRow.number)
        )
        with self._reading() as session:
            return [MeasuredConfig(gpu_name=row[0], compute_capability=row[1], sm_count=row[2],
                                   family=row[3], params=dict(row[4]), m=row[5], n=row[6],
                                   k=row[7], state=row[8],
                                   gflops=None if row[9] is None else float(row[9]))
                    for row in session.execute(query)]

    def trials(self, run_id: int, state: str | None = None, offset: int = 0,
               limit: int = 100) -> list[Trial]:
        """One page of a run's trials in trial-number order, optionally of one state."""
        validate.trial_state(state, optional=True)
        offset, limit = validate.paging(offset, limit)
        with self._reading() as session:
            self._run_row(session, run_id)
            query = select(TrialRow).where(TrialRow.run_id == run_id)
            if state is not None:
                query = query.where(TrialRow.state == state)
            query = query.order_by(TrialRow.number).offset(offset).limit(limit)
            return [convert.trial(r) for r in session.scalars(query)]

    def count_trials(self, run_id: int) -> dict[str, int]:
        """Trials of the run per state; every state in TRIAL_STATES is present."""
        with self._reading() as session:
            self._run_row(session, run_id)
            counts = dict.fromkeys(TRIAL_STATES, 0)
            for state, count in session.execute(
                select(TrialRow.state, func.count()).where(TrialRow.run_id == run_id)
                .group_by(TrialRow.state)
            ):
                counts[state] = count
            return counts

    def overview(self, *, families: Collection[str] | None = None) -> list[OverviewCell]:
        """The best verified trial of every (GPU name, problem) pair, with its fraction of cuBLAS.

        A GPU name covers every board of that name; the cuBLAS baseline is the latest one
        measured on the winning trial's own board. `families`: only these family names count
        (e.g. one precision class); None: all.
        """
        names = validate.names("families", families)
        rank = func.row_number().over(
            partition_by=(GpuRow.name, ProblemRow.id),
            order_by=(TrialRow.gflops.desc(), TrialRow.id),
        ).label("rank")
        ranked = (
            select(TrialRow.id.label("trial_id"), rank)
            .join(RunRow, TrialRow.run_id == RunRow.id)
            .join(GpuRow, RunRow.gpu_id == GpuRow.id)
            .join(ProblemRow, RunRow.problem_id == ProblemRow.id)
            .join(FamilyRow, RunRow.family_id == FamilyRow.id)
            .where(TrialRow.state == "ok",
                   FamilyRow.name.in_(sorted(names)) if names is not None else true())
            .subquery()
        )
        query = (
            select(TrialRow, RunRow, GpuRow, ProblemRow, FamilyRow)
            .join(ranked, (ranked.c.trial_id == TrialRow.id) & (ranked.c.rank == 1))
            .join(RunRow, TrialRow.run_id == RunRow.id)
            .join(GpuRow, RunRow.gpu_id == GpuRow.id)
            .join(ProblemRow, RunRow.problem_id == ProblemRow.id)
            .join(FamilyRow, RunRow.family_id == FamilyRow.id)
            .order_by(GpuRow.name, ProblemRow.m, ProblemRow.n, ProblemRow.k, ProblemRow.id)
        )
        with self._reading() as session:
            rows = session.execute(query).all()
            baselines = _latest_baselines(session)
            cells = []
            for trial, run, gpu, problem, family in rows:
                base = baselines.get((gpu.id, problem.id))
                cells.append(OverviewCell(
                    gpu_name=gpu.name, problem=convert.problem(problem),
                    best_gflops=trial.gflops,
                    fraction_of_cublas=None if base is None else trial.gflops / base,
                    family=family.name, source_hash=family.source_hash, gpu_uuid=gpu.uuid,
                    run_id=run.id, trial_id=trial.id, baseline_gflops=base,
                ))
            return cells


def _latest_baselines(session: Session, library: str = "cublas") -> dict[tuple[int, int], float]:
    """(gpu_id, problem_id) → gflops of the latest baseline."""
    rank = func.row_number().over(
        partition_by=(BaselineRow.gpu_id, BaselineRow.problem_id),
        order_by=(BaselineRow.measured_at.desc(), BaselineRow.id.desc()),
    ).label("rank")
    ranked = (select(BaselineRow.gpu_id, BaselineRow.problem_id, BaselineRow.gflops, rank)
              .where(BaselineRow.library == library).subquery())
    rows = session.execute(select(ranked.c.gpu_id, ranked.c.problem_id, ranked.c.gflops)
                           .where(ranked.c.rank == 1))
    return {(g, p): gflops for g, p, gflops in rows}
