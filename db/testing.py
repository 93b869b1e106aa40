"""Scratch databases for tests (ours and other layers'): a SQLite file or a fresh PostgreSQL DB.

Free of pytest so any test suite can use it; the caller decides to skip when
GEMMTUNE_TEST_PG_URL (exported by .ci/postgres.sh) is unset.
"""

from __future__ import annotations

import os
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
def scratch_url(backend: str, folder: Path) -> Iterator[str]:
    """A URL to an empty database that is removed afterwards (SQLite: a file under folder)."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'results.sqlite'}"
        return
    if backend != "postgresql":
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    admin = os.environ.get(PG_URL_ENV)
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
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
