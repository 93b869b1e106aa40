"""Create or migrate gemmtune's schema on first use, and refuse databases we must not touch."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DatabaseError as SADatabaseError
from sqlalchemy.exc import OperationalError

from .engine import WRITE_OPTION
from .errors import NotADatabaseError, SchemaTooNewError, StorageError

TABLE_PREFIX = "gt_"
VERSION_TABLE = "gt_alembic_version"
MIGRATIONS = Path(__file__).with_name("migrations")
# Any constant works; it only has to be the same in every gemmtune process.
PG_MIGRATION_LOCK = 0x67656D6D  # "gemm"


def is_ours(table_name: str | None) -> bool:
    return bool(table_name) and table_name.startswith(TABLE_PREFIX)


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "db/migrations has no revisions"
    return head


def current_revision(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def prepare_schema(engine: Engine, where: str) -> None:
    """Bring the schema at `where` (a URL for messages) to head, or raise a StorageError.

    Cheap when already current (one read). Otherwise migrates under a database-wide write lock
    (BEGIN IMMEDIATE on SQLite, an advisory lock on PostgreSQL) and checks again inside it, so
    processes opening a fresh database together migrate it once.
    """
    head = head_revision()
    try:
        with engine.connect() as conn:
            current = current_revision(conn)
        if current == head:
            return
        _refuse_unknown(current, head, where)
        with engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK})
                current = current_revision(conn)
                if current == head:
                    return
                _refuse_unknown(current, head, where)
                if current is None:
                    _refuse_unversioned_tables(conn, where)
                command.upgrade(alembic_config(conn), "head")
    except OperationalError as exc:
        # No server, wrong password, unwritable folder, … : say which database and why.
        raise StorageError(f"cannot open {where}: {str(exc.orig).strip()}") from exc
    except SADatabaseError as exc:
        if "file is not a database" in str(exc.orig):
            raise NotADatabaseError(
                f"{where} is not a SQLite database (sqlite says: {exc.orig}); "
                "it was left untouched: point --db / GEMMTUNE_DB at another file"
            ) from exc
        raise


def _refuse_unknown(current: str | None, head: str, where: str) -> None:
    if current is None:
        return
    try:
        known = ScriptDirectory.from_config(alembic_config()).get_revision(current)
    except CommandError:
        known = None
    if known is None:
        raise SchemaTooNewError(
            f"{where} has gemmtune schema revision {current!r} (in table {VERSION_TABLE}), "
            f"which this gemmtune does not know (its newest is {head!r}); the database was "
            "written by a newer gemmtune: upgrade gemmtune, or use another database"
        )


def _refuse_unversioned_tables(conn: Connection, where: str) -> None:
    ours = sorted(t for t in inspect(conn).get_table_names() if is_ours(t))
    if ours:
        raise StorageError(
            f"{where} has gemmtune tables ({', '.join(ours)}) but no {VERSION_TABLE} record, "
            "so their schema version is unknown; left untouched"
        )
