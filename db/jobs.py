"""Tuning jobs: a queue of (GPU model, problem, budget) requests that tuner workers take.

A job is enqueued by the API (POST /api/jobs, or a miss on /api/best with tune=true) and claimed
by `python -m tuner --worker` running on a GPU of that model. Claiming is one conditional UPDATE
(`... WHERE state = 'queued'`, checked by its row count), after a `FOR UPDATE SKIP LOCKED` pick
on PostgreSQL, so two workers never hold the same job. A claimed job carries its worker's name
and a heartbeat; one whose heartbeat is older than the caller's grace period belongs to a dead
worker and may be claimed again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernels.layout import problem_label, shape_text

from . import validate
from .core import DatabaseCore
from .errors import InvalidInputError, UnknownGpuError, bad_value
from .models import GpuRow, JobRow, utcnow
from .states import DEFAULT_STALE_AFTER_S, JOB_STATES

OPEN_STATES: tuple[str, ...] = ("queued", "running")
END_STATES: tuple[str, ...] = ("done", "failed")
JOB_ORIGINS: tuple[str, ...] = ("request", "best")  # POST /api/jobs | a miss on /api/best
# Inclusive limits of a job's budget; a key left out means "the worker's default".
JOB_BUDGET_LIMITS: dict[str, tuple[int, int]] = {
    "trials": (1, 10_000),  # measured configs per study (tuner --trials)
    "patience": (0, 10_000),  # measured configs without a new best; 0: never stop on it
    "total_seconds": (1, 7 * 24 * 3600),  # wall time the job's studies share
}
MAX_FAMILIES = 50
# A job whose workers died this many times is failed instead of being claimed again: it is
# probably what kills them.
MAX_JOB_ATTEMPTS = 3


class UnknownJobError(InvalidInputError, LookupError):
    """The job id does not exist in this database."""


@dataclass(frozen=True)
class Job:
    id: int
    gpu_name: str  # the GPU model, as gt_gpus spells it
    m: int
    n: int
    k: int
    dtype: str
    layout: str
    general_alpha_beta: bool
    families: list[str]  # [] : the worker's default families
    budget: dict[str, Any]  # keys of JOB_BUDGET_LIMITS; a missing one: the worker's default
    origin: str  # one of JOB_ORIGINS
    state: str  # one of JOB_STATES
    reason: str | None  # why it failed, or a one-line summary of what it found
    worker: str | None  # who holds (or last held) it
    attempts: int  # times it was claimed
    run_ids: list[int]  # runs it made (set when it ends)
    created_at: datetime
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    ended_at: datetime | None
    batch: int = 1

    @property
    def shape(self) -> str:
        return shape_text(self.m, self.n, self.k, self.batch)

    @property
    def label(self) -> str:
        return problem_label(self.m, self.n, self.k, self.layout, self.batch)


def _job(row: JobRow) -> Job:
    return Job(
        id=row.id, gpu_name=row.gpu_name, m=row.m, n=row.n, k=row.k, dtype=row.dtype,
        layout=row.layout, general_alpha_beta=bool(row.general_alpha_beta),
        families=list(row.families or []), budget=dict(row.budget or {}), origin=row.origin,
        state=row.state, reason=row.reason, worker=row.worker, attempts=row.attempts,
        run_ids=list(row.run_ids or []), created_at=row.created_at, claimed_at=row.claimed_at,
        heartbeat_at=row.heartbeat_at, ended_at=row.ended_at, batch=row.batch,
    )


def check_budget(budget: Any) -> dict[str, Any]:
    """A copy of `budget` if every key is known and every value within JOB_BUDGET_LIMITS."""
    if budget is None:
        return {}
    if not isinstance(budget, dict):
        raise bad_value("job budget", budget, f"a dict with keys among {', '.join(JOB_BUDGET_LIMITS)}")
    for key, value in budget.items():
        if key not in JOB_BUDGET_LIMITS:
            raise bad_value("job budget key", key, JOB_BUDGET_LIMITS)
        low, high = JOB_BUDGET_LIMITS[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        whole = isinstance(value, int) or key == "total_seconds"
        if not (number and whole and math.isfinite(value) and low <= value <= high):
            kind = "a number" if key == "total_seconds" else "an int"
            raise bad_value(f"job budget {key}", value, f"{kind} in {low}..{high}")
    return dict(budget)


def _check_families(families: Any) -> list[str]:
    if families is None:
        return []
    if not isinstance(families, (list, tuple)) or len(families) > MAX_FAMILIES or not all(
            isinstance(f, str) and f.strip() for f in families):
        raise bad_value("job families", families,
                        f"a list of at most {MAX_FAMILIES} family names ([]: the default ones)")
    return list(dict.fromkeys(f.strip() for f in families))


class Jobs(DatabaseCore):
    # ------------------------------------------------------------------ enqueue and read

    def enqueue_job(self, gpu: str, m: int, n: int, k: int, *, families: list[str] | None = None,
                    budget: dict[str, Any] | None = None, origin: str = "request",
                    dtype: str = "fp32", layout: str = "nn",
                    general_alpha_beta: bool = True, batch: int = 1) -> tuple[Job, bool]:
        """Queue a job for a GPU model (name or UUID of a GPU seen before, any case) and problem.

        Returns (job, created). When the same GPU model and problem already have a queued or
        running job, that job is returned with created=False and nothing is written.
        """
        validate.shape(m, n, k)
        validate.batch(batch)
        validate.problem_kind(dtype, layout, general_alpha_beta)
        families = _check_families(families)
        budget = check_budget(budget)
        if origin not in JOB_ORIGINS:
            raise bad_value("job origin", origin, JOB_ORIGINS)
        with self._reading() as session:
            gpu_name = self._gpu_model(session, gpu)
        key = dict(gpu_name=gpu_name, m=m, n=n, k=k, batch=batch, dtype=dtype, layout=layout,
                   general_alpha_beta=general_alpha_beta)
        for _ in range(3):
            try:
                with self._writing() as session:
                    found = self._open_job(session, key)
                    if found is not None:
                        return _job(found), False
                    row = JobRow(**key, families=families, budget=budget, origin=origin,
                                 state="queued", attempts=0, run_ids=[], created_at=utcnow())
                    session.add(row)
                    session.flush()
                    return _job(row), True
            except IntegrityError:
                continue  # PostgreSQL: a concurrent request queued the same problem first
        with self._reading() as session:
            found = self._open_job(session, key)
            if found is None:
                raise RuntimeError("enqueue lost a race three times without seeing the winner")
            return _job(found), False

    def get_job(self, job_id: int) -> Job:
        with self._reading() as session:
            return _job(self._job_row(session, job_id))

    def list_jobs(self, *, state: str | None = None, gpu: str | None = None, offset: int = 0,
                  limit: int = 100) -> list[Job]:
        """Jobs, newest first; gpu: a GPU name or UUID (any case) that names stored GPUs."""
        if state is not None and state not in JOB_STATES:
            raise bad_value("job state", state, JOB_STATES)
        offset, limit = validate.paging(offset, limit)
        with self._reading() as session:
            query = select(JobRow)
            if state is not None:
                query = query.where(JobRow.state == state)
            if gpu is not None:
                ids = self._gpu_ids(session, gpu)
                names = {n.lower() for n in session.scalars(
                    select(GpuRow.name).where(GpuRow.id.in_(ids)))}
                query = query.where(func.lower(JobRow.gpu_name).in_(names))
            rows = session.scalars(query.order_by(JobRow.id.desc()).offset(offset).limit(limit))
            return [_job(r) for r in rows]

    def count_jobs(self) -> dict[str, int]:
        """Jobs per state; every JOB_STATES key, zeros included."""
        with self._reading() as session:
            found = {state: count for state, count in session.execute(
                select(JobRow.state, func.count()).group_by(JobRow.state))}
        return {s: int(found.get(s, 0)) for s in JOB_STATES}

    # ------------------------------------------------------------------ the worker's side

    def claim_job(self, gpu_name: str, worker: str, *,
                  stale_after_s: float = DEFAULT_STALE_AFTER_S) -> Job | None:
        """Take the oldest queued job for this GPU model (or a running one whose heartbeat is
        older than stale_after_s: its worker died), or None. Two callers never get the same job.
        """
        validate.text("gpu_name", gpu_name)
        validate.text("worker", worker)
        stale_after = timedelta(seconds=validate.stale_after(stale_after_s))
        key = gpu_name.strip().lower()
        for _ in range(20):  # each turn either claims, fails a hopeless job, or lost a race
            now = utcnow()
            stale = and_(JobRow.state == "running", JobRow.heartbeat_at < now - stale_after)
            claimable = or_(JobRow.state == "queued", stale)
            with self._writing() as session:
                pick = (select(JobRow.id, JobRow.state, JobRow.attempts, JobRow.worker,
                               JobRow.heartbeat_at)
                        .where(func.lower(JobRow.gpu_name) == key, claimable)
                        .order_by(JobRow.id).limit(1))
                if session.get_bind().dialect.name == "postgresql":
                    # Rows another claimer has locked are skipped, not waited for.
                    pick = pick.with_for_update(skip_locked=True)
                found = session.execute(pick).first()
                if found is None:
                    return None
                guard = JobRow.state == "queued" if found.state == "queued" else stale
                if found.state == "running" and found.attempts >= MAX_JOB_ATTEMPTS:
                    self._conditional(session, found.id, guard, state="failed", ended_at=now,
                                      reason=f"gave up after {found.attempts} claims: each "
                                             "worker stopped sending heartbeats (the last, "
                                             f"{found.worker}, at {found.heartbeat_at})")
                    continue
                if self._conditional(session, found.id, guard, state="running", worker=worker,
                                     claimed_at=now, heartbeat_at=now,
                                     attempts=JobRow.attempts + 1):
                    return _job(session.get(JobRow, found.id, populate_existing=True))
        return None

    def heartbeat_job(self, job_id: int, worker: str) -> bool:
        """Refresh a running job's heartbeat; False when `worker` no longer holds it."""
        validate.text("worker", worker)
        with self._writing() as session:
            return self._conditional(session, job_id, self._held_by(worker),
                                     heartbeat_at=utcnow())

    def finish_job(self, job_id: int, worker: str, state: str, *, reason: str | None = None,
                   run_ids: list[int] | tuple[int, ...] = ()) -> Job:
        """End a job `worker` holds as "done" or "failed" (a failure needs its reason)."""
        if state not in END_STATES:
            raise bad_value("job end state", state, END_STATES)
        validate.text("reason", reason, optional=state == "done")
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in run_ids):
            raise bad_value("run_ids", run_ids, "a list of run ids (ints)")
        return self._change_held(job_id, worker, dict(state=state, reason=reason,
                                                     run_ids=list(run_ids), ended_at=utcnow()))

    def release_job(self, job_id: int, worker: str, *, reason: str | None = None) -> Job:
        """Hand a held job back to the queue (the worker was stopped before finishing it)."""
        validate.text("reason", reason, optional=True)
        return self._change_held(job_id, worker, dict(state="queued", worker=None, claimed_at=None,
                                                      heartbeat_at=None, reason=reason))

    # ------------------------------------------------------------------ helpers

    def _change_held(self, job_id: int, worker: str, values: dict[str, Any]) -> Job:
        validate.text("worker", worker)
        with self._writing() as session:
            row = self._job_row(session, job_id)
            if not self._conditional(session, job_id, self._held_by(worker), **values):
                raise InvalidInputError(
                    f"job {job_id} is not held by worker {worker!r} (it is {row.state!r}"
                    f"{f', held by {row.worker!r}' if row.worker else ''}); "
                    "allowed: a running job this worker claimed")
            return _job(session.get(JobRow, job_id, populate_existing=True))

    @staticmethod
    def _held_by(worker: str) -> Any:
        return and_(JobRow.state == "running", JobRow.worker == worker)

    @staticmethod
    def _conditional(session: Session, job_id: int, condition: Any, **values: Any) -> bool:
        """UPDATE one job only if `condition` still holds; True when it did (row count 1)."""
        result = session.execute(
            update(JobRow).where(JobRow.id == job_id, condition).values(**values)
            .execution_options(synchronize_session=False))
        return result.rowcount == 1

    @staticmethod
    def _open_job(session: Session, key: dict[str, Any]) -> JobRow | None:
        return session.scalar(select(JobRow).filter_by(**key)
                              .where(JobRow.state.in_(OPEN_STATES)).limit(1))

    @staticmethod
    def _job_row(session: Session, job_id: int) -> JobRow:
        return DatabaseCore._row_by_id(session, JobRow, job_id, "job", UnknownJobError)

    def _gpu_model(self, session: Session, gpu: str) -> str:
        """The stored name of the GPU model `gpu` (a name or UUID) names."""
        try:
            ids = self._gpu_ids(session, gpu)
        except UnknownGpuError as error:
            raise UnknownGpuError(
                f"{error}. A GPU model becomes known when a tuner or worker first runs on it "
                "(`python -m tuner --worker` registers its GPU at start)") from None
        row = session.get(GpuRow, ids[0])
        assert row is not None
        return row.name
