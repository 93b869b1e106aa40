"""The connection core shared by the Database mixins: engine, short sessions, GPU and run lookup."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine, func, or_, select
from sqlalchemy.orm import Session

from .engine import WRITE_OPTION
from .errors import UnknownGpuError, UnknownRunError, bad_value
from .models import GpuRow, RunRow


class DatabaseCore:
    def __init__(self, engine: Engine, url: str) -> None:
        self._engine = engine
        self.url = url

    def __repr__(self) -> str:
        return f"Database({self._engine.url.render_as_string(hide_password=True)!r})"

    # -- lifetime
    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- sessions: one short transaction per public method, nothing held between calls
    @contextmanager
    def _reading(self) -> Iterator[Session]:
        with Session(self._engine) as session:
            yield session

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        """A transaction that commits on success and takes the write lock up front (SQLite)."""
        with self._engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with Session(bind=conn) as session, session.begin():
                yield session

    # -- lookups used by several mixins
    @staticmethod
    def _gpu_ids(session: Session, gpu: str) -> list[int]:
        """Ids of every GPU whose name or UUID equals `gpu`, ignoring case."""
        if not isinstance(gpu, str) or not gpu.strip():
            raise bad_value("gpu", gpu, "a GPU name or UUID")
        key = gpu.strip().lower()
        ids = list(session.scalars(
            select(GpuRow.id).where(or_(func.lower(GpuRow.name) == key,
                                        func.lower(GpuRow.uuid) == key)).order_by(GpuRow.id)
        ))
        if not ids:
            known = sorted(set(session.scalars(select(GpuRow.name))))
            raise UnknownGpuError(
                f"unknown gpu {gpu!r}; known GPU names: {', '.join(map(repr, known)) or 'none yet'}"
                " (a UUID works too)"
            )
        return ids

    @staticmethod
    def _row_by_id(session: Session, model: Any, row_id: int, what: str,
                   error: type[Exception]) -> Any:
        """The row of ``model`` with this id, else ``error`` naming the newest id there is."""
        row = None
        if isinstance(row_id, int) and not isinstance(row_id, bool):
            row = session.get(model, row_id)
        if row is None:
            last = session.scalar(select(func.max(model.id)))
            allowed = (f"an existing {what} id (the newest is {last})" if last
                       else f"an existing {what} id (none yet)")
            raise error(f"unknown {what} id {row_id!r}; allowed: {allowed}")
        return row

    @staticmethod
    def _run_row(session: Session, run_id: int) -> RunRow:
        return DatabaseCore._row_by_id(session, RunRow, run_id, "run", UnknownRunError)
