"""Alembic environment for gemmtune's own tables (gt_*).

open_database() runs this with its own connection (config.attributes["connection"]), inside a
transaction it already holds. From the command line (`alembic -c db/alembic.ini ...`) it
connects to db.resolve_url(), i.e. --db's environment variable GEMMTUNE_DB or the default file.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection

from db.models import Base
from db.schema import VERSION_TABLE, is_ours

config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        # Optuna's tables live in the same database; autogenerate must not touch them.
        include_name=_include_name,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
    )


def _include_name(name: str | None, type_: str, _parent: Any) -> bool:
    return type_ != "table" or is_ours(name)


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return

    from db.engine import make_engine
    from db.urls import resolve_url
    from sqlalchemy.engine import make_url

    engine = make_engine(make_url(resolve_url()))
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("gemmtune migrations run online only (they need the live database)")
run()
