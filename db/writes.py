"""Database methods that write. Each is one short transaction, committed before it returns."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from . import validate
from .core import DatabaseCore
from .errors import InvalidInputError, bad_value
from .models import (BaselineRow, FamilyRow, GpuRow, ProblemRow, RunRow, TrialRow, utcnow)
from .records import GpuInfo, TrialRecord
from .states import DEFAULT_STALE_AFTER_S, END_STATES

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class Writes(DatabaseCore):
    def _ensure(self, find: Callable[[Session], int | None],
                create: Callable[[Session], int]) -> int:
        """Get-or-create that survives a concurrent creator (PostgreSQL has no BEGIN IMMEDIATE)."""
        for _ in range(3):
            try:
                with self._writing() as session:
                    found = find(session)
                    return found if found is not None else create(session)
            except IntegrityError:
                continue  # someone else inserted the same key first: read theirs
        with self._reading() as session:
            found = find(session)
        if found is None:
            raise RuntimeError("get-or-create lost a race three times without seeing the winner")
        return found

    def ensure_gpu(self, info: GpuInfo) -> int:
        """The id of the GPU with info.uuid; its driver, CUDA and NVRTC versions are refreshed."""
        if not isinstance(info, GpuInfo):
            raise bad_value("gpu info", info, "a db.GpuInfo")

        def find(session: Session) -> int | None:
            row = session.scalar(select(GpuRow).where(GpuRow.uuid == info.uuid))
            if row is None:
                return None
            # The same board gets new drivers; identity (name, UUID) does not change.
            for field in ("max_sm_clock_mhz", "driver_version", "cuda_version", "nvrtc_version"):
                value = getattr(info, field)
                if value is not None and getattr(row, field) != value:
                    setattr(row, field, value)
            return row.id

        def create(session: Session) -> int:
            row = GpuRow(**{f: getattr(info, f) for f in (
                "name", "uuid", "compute_capability", "sm_count", "memory_bytes",
                "max_sm_clock_mhz", "driver_version", "cuda_version", "nvrtc_version")})
            session.add(row)
            session.flush()
            return row.id

        return self._ensure(find, create)

    def ensure_problem(self, m: int, n: int, k: int, dtype: str = "fp32",
                       layout: str = "nn", general_alpha_beta: bool = True, batch: int = 1) -> int:
        validate.shape(m, n, k)
        validate.batch(batch)
        validate.problem_kind(dtype, layout, general_alpha_beta)
        key = dict(m=m, n=n, k=k, batch=batch, dtype=dtype, layout=layout,
                   general_alpha_beta=general_alpha_beta)

        def find(session: Session) -> int | None:
            return session.scalar(select(ProblemRow.id).filter_by(**key))

        def create(session: Session) -> int:
            row = ProblemRow(**key)
            session.add(row)
            session.flush()
            return row.id

        return self._ensure(find, create)

    def ensure_family(self, name: str, source_hash: str) -> int:
        """One id per (family, source version): results of an edited kernel stay apart."""
        validate.text("family name", name)
        if not isinstance(source_hash, str) or not SHA256_HEX.fullmatch(source_hash.lower()):
            raise bad_value("source_hash", source_hash, "a sha256 hex digest (64 hex digits)")
        source_hash = source_hash.lower()

        def find(session: Session) -> int | None:
            return session.scalar(select(FamilyRow.id).filter_by(name=name,
                                                                 source_hash=source_hash))

        def create(session: Session) -> int:
            row = FamilyRow(name=name, source_hash=source_hash)
            session.add(row)
            session.flush()
            return row.id

        return self._ensure(find, create)

    def start_run(self, *, gpu_id: int, problem_id: int, family_id: int, sampler: str,
                  seed: int | None, budget: dict[str, Any], host: str, command: str,
                  study_name: str | None, stale_after_s: float | None = None) -> int:
        """A new run in state "running"; returns its id. stale_after_s: the heartbeat age after
        which readers take its tuner as dead (None: DEFAULT_STALE_AFTER_S)."""
        validate.text("sampler", sampler)
        validate.text("host", host)
        if not isinstance(command, str):
            raise bad_value("command", command, "a string (the command line)")
        validate.text("study_name", study_name, optional=True)
        validate.json_dict("budget", budget)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise bad_value("seed", seed, "an int or None")
        if stale_after_s is not None:
            validate.stale_after(stale_after_s)
        with self._writing() as session:
            for what, model, ident in (("gpu_id", GpuRow, gpu_id),
                                       ("problem_id", ProblemRow, problem_id),
                                       ("family_id", FamilyRow, family_id)):
                _require(session, what, model, ident)
            row = RunRow(gpu_id=gpu_id, problem_id=problem_id, family_id=family_id,
                         sampler=sampler, seed=seed, budget=budget, host=host, command=command,
                         study_name=study_name, state="running", stale_after_s=stale_after_s)
            session.add(row)
            session.flush()
            return row.id

    def add_trial(self, run_id: int, record: TrialRecord) -> int:
        """Store one trial (one INSERT, committed before returning); returns the trial id."""
        if not isinstance(record, TrialRecord):
            raise bad_value("trial record", record, "a db.TrialRecord")
        if isinstance(run_id, bool) or not isinstance(run_id, int):
            raise bad_value("run id", run_id, "an int (the id start_run returned)")
        row = TrialRow(
            run_id=run_id, number=record.number, params=dict(record.params),
            state=record.state, error=record.error, compile_seconds=record.compile_seconds,
            registers=record.registers, shared_bytes=record.shared_bytes,
            spill_bytes=record.spill_bytes, occupancy=record.occupancy,
            time_min_ms=record.time_min_ms, time_median_ms=record.time_median_ms,
            time_max_ms=record.time_max_ms, launches=record.launches, gflops=record.gflops,
            sm_clock_mhz=record.sm_clock_mhz, started_at=_aware(record.started_at),
            recorded_at=utcnow(),
        )
        try:
            with self._writing() as session:
                session.add(row)
                session.flush()
                return row.id
        except IntegrityError as exc:
            # The cheap path has no pre-checks; find out which rule the row broke.
            with self._reading() as session:
                self._run_row(session, run_id)
                taken = session.scalar(select(TrialRow.id).filter_by(run_id=run_id,
                                                                     number=record.number))
            if taken is not None:
                raise InvalidInputError(
                    f"run {run_id} already has trial number {record.number}; "
                    "allowed: a number not yet used in this run"
                ) from exc
            raise

    def retime_trial(self, trial_id: int, *, timings: int, time_median_ms: float,
                     gflops: float, time_min_ms: float | None = None,
                     time_max_ms: float | None = None, launches: int | None = None,
                     sm_clock_mhz: int | None = None) -> None:
        """Replace a verified trial's timing by the median of ``timings`` timings of its config
        (one of them, whole: its times, launches, clock and GFLOP/s; tuner.run.retime). Its
        config, state and compile report stay."""
        if isinstance(timings, bool) or not isinstance(timings, int) or timings < 2:
            raise bad_value("timings", timings, "an int >= 2 (the first timing and more)")
        validate.positive_number("time_median_ms", time_median_ms)
        validate.positive_number("gflops", gflops)
        with self._writing() as session:
            row = session.get(TrialRow, trial_id)
            if row is None:
                raise InvalidInputError(f"no trial with id {trial_id}; allowed: a stored trial's id")
            if row.state != "ok":
                raise InvalidInputError(
                    f"trial {trial_id} is {row.state!r}; only a verified ('ok') trial has a "
                    "timing to replace")
            row.timings, row.time_median_ms, row.gflops = timings, time_median_ms, gflops
            row.time_min_ms, row.time_max_ms = time_min_ms, time_max_ms
            row.launches, row.sm_clock_mhz = launches, sm_clock_mhz

    def finish_run(self, run_id: int, state: str) -> None:
        """End a running run as "finished", "interrupted" or "failed" and stamp ended_at."""
        validate.run_state(state, END_STATES)
        with self._writing() as session:
            row = self._run_row(session, run_id)
            if row.state != "running":
                raise InvalidInputError(
                    f"run {run_id} already ended as {row.state!r} at {row.ended_at}; "
                    "only a 'running' run can be finished"
                )
            row.state = state
            row.ended_at = utcnow()

    def heartbeat_run(self, run_id: int) -> bool:
        """A running run's tuner is alive: refresh its heartbeat_at. Returns False (and changes
        nothing) when the run is no longer "running", e.g. marked interrupted as stale."""
        with self._writing() as session:
            row = self._run_row(session, run_id)
            if row.state != "running":
                return False
            row.heartbeat_at = utcnow()
            return True

    def interrupt_stale_runs(self, default_stale_after_s: float = DEFAULT_STALE_AFTER_S) -> list[int]:
        """Mark "interrupted" every running run whose heartbeat is older than its stale-after time
        (the one its tuner was started with; default_stale_after_s for runs that have none): its
        tuner died without saying so (SIGKILL, power loss). ended_at is set to the last
        heartbeat, the last moment it was known alive. Returns the ids marked. Cheap where
        nothing is stale: one read, and a write only for what it marks."""
        validate.stale_after(default_stale_after_s)
        now = utcnow()

        def stale(run: RunRow) -> bool:
            seen = run.heartbeat_at or run.started_at
            return seen < now - timedelta(seconds=run.stale_after_s or default_stale_after_s)

        with self._reading() as session:
            candidates = [run.id for run in session.scalars(select(RunRow).where(RunRow.state == "running"))
                          if stale(run)]
        if not candidates:
            return []
        with self._writing() as session:  # checked again under the write lock: a beat may have come
            rows = [run for run in session.scalars(select(RunRow).where(RunRow.id.in_(candidates),
                                                                          RunRow.state == "running"))
                    if stale(run)]
            for row in rows:
                row.state = "interrupted"
                row.ended_at = row.heartbeat_at or row.started_at
            return sorted(row.id for row in rows)

    def add_baseline(self, *, gpu_id: int, problem_id: int, library: str = "cublas",
                     time_median_ms: float, gflops: float, sm_clock_mhz: int | None = None,
                     run_id: int | None = None) -> int:
        """A library's time for this GPU and problem (the denominator of fraction_of_cublas)."""
        validate.text("library", library)
        for what, value in (("time_median_ms", time_median_ms), ("gflops", gflops)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise bad_value(what, value, "a positive number")
        if sm_clock_mhz is not None and (isinstance(sm_clock_mhz, bool)
                                         or not isinstance(sm_clock_mhz, int)):
            raise bad_value("sm_clock_mhz", sm_clock_mhz, "an int or None")
        with self._writing() as session:
            _require(session, "gpu_id", GpuRow, gpu_id)
            _require(session, "problem_id", ProblemRow, problem_id)
            if run_id is not None:
                self._run_row(session, run_id)
            row = BaselineRow(gpu_id=gpu_id, problem_id=problem_id, run_id=run_id,
                              library=library, time_median_ms=float(time_median_ms),
                              gflops=float(gflops), sm_clock_mhz=sm_clock_mhz,
                              measured_at=utcnow())
            session.add(row)
            session.flush()
            return row.id


def _require(session: Session, what: str, model: type, ident: Any) -> None:
    if isinstance(ident, bool) or not isinstance(ident, int) or session.get(model, ident) is None:
        raise bad_value(what, ident, f"the id of an existing row in {model.__tablename__}")


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        raise bad_value("started_at", value, "a timezone-aware datetime (e.g. UTC) or None")
    return value
