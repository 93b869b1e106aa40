"""Which database to use: one URL shared by the tuner (--db) and the API (GEMMTUNE_DB)."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url

ENV_VAR = "GEMMTUNE_DB"


def default_url() -> str:
    """sqlite:///$XDG_DATA_HOME/gemmtune/gemmtune.sqlite (XDG_DATA_HOME defaults to ~/.local/share)."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(data_home) / 'gemmtune' / 'gemmtune.sqlite'}"


def resolve_url(url: str | None = None) -> str:
    """The URL open_database(url) connects to: url, else $GEMMTUNE_DB, else default_url().

    A bare path (no "scheme://") is taken as a SQLite file; postgresql:// and postgres:// are
    mapped to the psycopg 3 driver, which is the one installed.
    """
    chosen = url or os.environ.get(ENV_VAR) or default_url()
    if "://" not in chosen:
        chosen = f"sqlite:///{Path(chosen).expanduser().absolute()}"
    parsed = make_url(chosen)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def sqlite_file(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for other backends and in-memory databases."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)
