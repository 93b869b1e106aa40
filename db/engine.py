"""Engines with the connection settings that make concurrent use safe.

SQLite: WAL (readers never block the writer), a busy timeout (writers queue instead of failing),
foreign keys on. Write transactions start with BEGIN IMMEDIATE: a deferred transaction that
reads and then writes can fail with "database is locked" without waiting, whatever the timeout,
when another writer committed in between.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL

from .urls import sqlite_file

BUSY_TIMEOUT_MS = 60_000
WRITE_OPTION = "gemmtune_write"  # execution option: this connection's transaction will write


def make_engine(url: URL) -> Engine:
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    # pool_pre_ping: the API outlives server restarts
    return create_engine(url, pool_pre_ping=True)


def _sqlite_engine(url: URL) -> Engine:
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module, so our BEGIN is the one used.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _use_wal(cursor)
            # In WAL mode NORMAL still survives a killed process; only power loss can drop
            # the last commits.
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        writes = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")

    return engine


def _use_wal(cursor: Any) -> None:
    """Switch the file to WAL once (the mode is stored in the file). The switch needs the file to
    itself and SQLite can refuse it at once, busy timeout or not, while other processes open a
    fresh database at the same moment (seen as "database is locked" from one of four writers
    opening one file): retry until the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
