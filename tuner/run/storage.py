"""The Optuna storage: an RDBStorage with heartbeats, safe to open from several processes at once.

Optuna creates its tables on first use without a lock; processes opening a fresh PostgreSQL
database together race in CREATE TABLE (UniqueViolation on pg_type_typname_nsp_index). On
PostgreSQL the construction therefore runs under an advisory lock; on every backend a failed
construction is retried a few times, by which time the winner has created the tables.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import db
import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

log = logging.getLogger(__name__)

# Any constant works as long as every gemmtune process uses the same one; it differs from the
# results database's migration lock (db.schema.PG_MIGRATION_LOCK).
PG_STORAGE_LOCK = 0x6F70744E  # "optN"
CREATE_ATTEMPTS = 4
# A candidate whose worker died is retried this often before it is left failed: a config that
# kills every worker that measures it should not take the whole fleet down in turn.
MAX_RETRIES = 2


def storage_url(url: str) -> str:
    """The SQLAlchemy URL for an Optuna storage given as on the command line: a bare path is a
    SQLite file, postgresql:// uses psycopg 3 (the driver installed), as for --db."""
    return db.resolve_url(url)


def is_server(url: str) -> bool:
    """Whether the storage lives on a database server, where workers on other hosts share it."""
    return make_url(storage_url(url)).get_backend_name() != "sqlite"


@contextmanager
def _creation_lock(url: str) -> Iterator[None]:
    if make_url(url).get_backend_name() != "postgresql":
        yield
        return
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_STORAGE_LOCK})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_STORAGE_LOCK})
                conn.commit()
    finally:
        engine.dispose()


def open_storage(url: str, *, heartbeat_s: float, stale_after_s: float) -> RDBStorage:
    """An RDBStorage whose running trials go stale after ``stale_after_s`` without a heartbeat;
    a stale trial is failed (``optuna.storages.fail_stale_trials``) and queued again as a
    WAITING copy (``RetryHeartbeatStaleTrialCallback``, at most MAX_RETRIES times)."""
    if not 0 < heartbeat_s < stale_after_s:
        raise ValueError(f"heartbeat {heartbeat_s} s and stale-after {stale_after_s} s: the "
                         "heartbeat must be positive and shorter than the stale-after time")
    resolved = storage_url(url)
    last_error: Exception | None = None
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with _creation_lock(resolved), warnings.catch_warnings():
                # heartbeats are "experimental" in Optuna's words, stable since 2.x in fact
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    resolved,
                    heartbeat_interval=heartbeat_s,  # type: ignore[arg-type]  # float works
                    grace_period=stale_after_s,  # type: ignore[arg-type]
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES),
                )
        except (ArgumentError, NoSuchModuleError):
            raise  # a malformed URL or unknown driver: no second try will help
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:
            last_error = error
            log.debug("opening the Optuna storage failed (attempt %d): %s", attempt + 1, error)
            time.sleep(0.2 * (attempt + 1))
    assert last_error is not None
    raise last_error
