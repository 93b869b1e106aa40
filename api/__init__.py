"""HTTP API and dashboard over the results database (reads through `db`, never `tuner`)."""

from .app import create_app

__all__ = ["create_app"]
