"""SQLAlchemy 2.x ORM models. Private to the db package: callers get records.* dataclasses.

Every table is prefixed `gt_` because Optuna keeps its own `studies`, `trials`, … (and its own
`alembic_version`) in the same database.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from .states import JOB_STATES, RUN_STATES, TRIAL_STATES


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC; always hands back an aware datetime (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def _one_of(column: str, allowed: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(a) for a in allowed)})"


# Named constraints, so later migrations (batch mode on SQLite) can address them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class GpuRow(Base):
    __tablename__ = "gt_gpus"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    uuid: Mapped[str] = mapped_column(String(100), unique=True)
    compute_capability: Mapped[str] = mapped_column(String(10))
    sm_count: Mapped[int] = mapped_column(Integer)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    max_sm_clock_mhz: Mapped[int | None] = mapped_column(Integer)
    driver_version: Mapped[str | None] = mapped_column(String(50))
    cuda_version: Mapped[str | None] = mapped_column(String(50))
    nvrtc_version: Mapped[str | None] = mapped_column(String(50))
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ProblemRow(Base):
    __tablename__ = "gt_problems"
    __table_args__ = (
        UniqueConstraint("m", "n", "k", "batch", "dtype", "layout", "general_alpha_beta", name="uq_gt_problems_shape"),
        CheckConstraint("m > 0 AND n > 0 AND k > 0", name="positive_dims"),
        CheckConstraint("batch > 0", name="positive_batch"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    # independent GEMMs of this shape in one call (a strided batch, as torch.bmm); 1: a single GEMM
    batch: Mapped[int] = mapped_column(Integer, server_default="1")
    dtype: Mapped[str] = mapped_column(String(20))
    layout: Mapped[str] = mapped_column(String(20))
    general_alpha_beta: Mapped[bool] = mapped_column(Boolean)


class FamilyRow(Base):
    """One row per (family name, source hash): an edited kernel is a new row, old results stay."""

    __tablename__ = "gt_families"
    __table_args__ = (UniqueConstraint("name", "source_hash", name="uq_gt_families_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    source_hash: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunRow(Base):
    __tablename__ = "gt_runs"
    __table_args__ = (
        CheckConstraint(_one_of("state", RUN_STATES), name="state"),
        Index("ix_gt_runs_gpu_problem", "gpu_id", "problem_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gt_gpus.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("gt_problems.id"))
    family_id: Mapped[int] = mapped_column(ForeignKey("gt_families.id"))
    sampler: Mapped[str] = mapped_column(String(100))
    seed: Mapped[int | None] = mapped_column(BigInteger)
    budget: Mapped[dict[str, Any]] = mapped_column(JSON)
    host: Mapped[str] = mapped_column(String(255))
    command: Mapped[str] = mapped_column(Text)
    study_name: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(20), default="running")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Refreshed by a live tuner; a "running" run whose heartbeat is older than stale_after_s
    # (its tuner's --stale-after; None: DEFAULT_STALE_AFTER_S) belongs to a dead one.
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=utcnow)
    stale_after_s: Mapped[float | None] = mapped_column(Float)

    gpu: Mapped[GpuRow] = relationship()
    problem: Mapped[ProblemRow] = relationship()
    family: Mapped[FamilyRow] = relationship()


class TrialRow(Base):
    __tablename__ = "gt_trials"
    __table_args__ = (
        UniqueConstraint("run_id", "number", name="uq_gt_trials_run_number"),
        CheckConstraint(_one_of("state", TRIAL_STATES), name="state"),
        # best/top-k: verified trials of a run, fastest first
        Index("ix_gt_trials_run_state_gflops", "run_id", "state", "gflops"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("gt_runs.id"))
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, int]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    registers: Mapped[int | None] = mapped_column(Integer)
    shared_bytes: Mapped[int | None] = mapped_column(Integer)
    spill_bytes: Mapped[int | None] = mapped_column(Integer)
    occupancy: Mapped[float | None] = mapped_column(Float)
    time_min_ms: Mapped[float | None] = mapped_column(Float)
    time_median_ms: Mapped[float | None] = mapped_column(Float)
    time_max_ms: Mapped[float | None] = mapped_column(Float)
    launches: Mapped[int | None] = mapped_column(Integer)
    gflops: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # how many timings of the config the figure is the median of (Database.retime_trial);
    # NULL: its one timing
    timings: Mapped[int | None] = mapped_column(Integer)


class BaselineRow(Base):
    """A library's (cuBLAS) time for the same GPU and problem, so results read as a fraction."""

    __tablename__ = "gt_baselines"
    __table_args__ = (Index("ix_gt_baselines_gpu_problem", "gpu_id", "problem_id", "library"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gt_gpus.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("gt_problems.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("gt_runs.id"))
    library: Mapped[str] = mapped_column(String(50))
    time_median_ms: Mapped[float] = mapped_column(Float)
    gflops: Mapped[float] = mapped_column(Float)
    sm_clock_mhz: Mapped[int | None] = mapped_column(Integer)
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobRow(Base):
    """A request to tune one problem on one GPU model, taken by a `python -m tuner --worker`."""

    __tablename__ = "gt_jobs"
    __table_args__ = (
        CheckConstraint(_one_of("state", JOB_STATES), name="state"),
        CheckConstraint("m > 0 AND n > 0 AND k > 0", name="positive_dims"),
        # At most one open job per (GPU model, problem): a repeated request gets the open one.
        Index("uq_gt_jobs_open_problem", "gpu_name", "m", "n", "k", "batch", "dtype", "layout",
              "general_alpha_beta", unique=True,
              sqlite_where=text("state IN ('queued', 'running')"),
              postgresql_where=text("state IN ('queued', 'running')")),
        # what a worker polls for: the oldest open job of its GPU model
        Index("ix_gt_jobs_state_gpu", "state", "gpu_name", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_name: Mapped[str] = mapped_column(String(200))  # a GPU model, as gt_gpus spells it
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    batch: Mapped[int] = mapped_column(Integer, server_default="1")
    dtype: Mapped[str] = mapped_column(String(20))
    layout: Mapped[str] = mapped_column(String(20))
    general_alpha_beta: Mapped[bool] = mapped_column(Boolean)
    families: Mapped[list[str]] = mapped_column(JSON)  # [] means the worker's default families
    budget: Mapped[dict[str, Any]] = mapped_column(JSON)
    origin: Mapped[str] = mapped_column(String(20))  # "request" (POST /api/jobs) | "best" (a miss)
    state: Mapped[str] = mapped_column(String(20), default="queued")
    reason: Mapped[str | None] = mapped_column(Text)  # why it failed (or how it ended)
    worker: Mapped[str | None] = mapped_column(String(255))  # the claim holder
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims so far
    run_ids: Mapped[list[int]] = mapped_column(JSON)  # the runs it made
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WorkloadRow(Base):
    """The GEMM problems of a recorded program with their shares of its GEMM time (db/workloads.py)."""

    __tablename__ = "gt_workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    gpu_name: Mapped[str | None] = mapped_column(String(200))  # where it was recorded
    problems: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # largest share first
    gemm_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
