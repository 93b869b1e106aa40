"""`Database`: the one object the tuner and the API use, and `open_database` to get it."""

from __future__ import annotations

from sqlalchemy.engine import make_url

from .engine import make_engine
from .jobs import Jobs
from .listing import Listings
from .queries import Queries
from .schema import prepare_schema
from .urls import resolve_url
from .workloads import Workloads
from .writes import Writes


class Database(Writes, Queries, Listings, Jobs, Workloads):
    """Results of tuning runs. Methods return frozen dataclasses; no session outlives a call.

    Writes live in db/writes.py, "what is best" in db/queries.py, listings in db/listing.py,
    the tuning-job queue in db/jobs.py, recorded workloads in db/workloads.py.
    """


def open_database(url: str | None = None) -> Database:
    """Open (creating and migrating on first use) the results database.

    url: None → $GEMMTUNE_DB → default_url(). Raises NotADatabaseError for a file that is not a
    SQLite database and SchemaTooNewError for a schema from a newer gemmtune; neither touches
    the file.
    """
    resolved = resolve_url(url)
    engine = make_engine(make_url(resolved))
    where = make_url(resolved).render_as_string(hide_password=True)
    try:
        prepare_schema(engine, where)
    except BaseException:
        engine.dispose()
        raise
    return Database(engine, resolved)
