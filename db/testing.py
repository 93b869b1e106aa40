"""Scratch databases for tests (ours and other layers'): a SQLite file or a fresh PostgreSQL DB.

Free of pytest so any test suite can use it; the caller decides to skip when
GEMMTUNE_TEST_PG_URL (exported by .ci/postgres.sh) is unset.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

PG_URL_ENV = "GEMMTUNE_TEST_PG_URL"
BACKENDS = ("sqlite", "postgresql")
PG_MISSING = f"PostgreSQL cases need {PG_URL_ENV} (source .ci/postgres.sh to start a server)"


def postgres_available() -> bool:
    return bool(os.environ.get(PG_URL_ENV))


@contextmanager
def scratch_url(backend: str, folder: Path, admin: str | None = None) -> Iterator[str]:
    """A URL to an empty database that is removed afterwards (SQLite: a file under folder).
    PostgreSQL: created through admin (a role that may CREATE DATABASE; default
    $GEMMTUNE_TEST_PG_URL), as bench/shared_study.py does on a server of its own."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'results.sqlite'}"
        return
    if backend != "postgresql":
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    admin = admin or os.environ.get(PG_URL_ENV)
    if not admin:
        raise RuntimeError(PG_MISSING)
    import psycopg  # only needed here

    name = f"gt_test_{uuid.uuid4().hex[:16]}"
    admin_url = make_url(admin).set(drivername="postgresql")
    conninfo = admin_url.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        _drop(conninfo, name)


def _drop(conninfo: str, name: str, timeout_s: float = 30.0) -> None:
    """Drop a scratch database that leftover sessions may still hold.

    Not `WITH (FORCE)`: for a role without superuser it fails when an autovacuum worker happens
    to be in the database ("must be a member of the role whose process is being terminated").
    So end this role's own sessions, then a plain DROP, which asks autovacuum to leave; retry
    while terminated sessions are still on their way out.
    """
    import psycopg

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid() AND usename = current_user",
                (name,))
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                return
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
