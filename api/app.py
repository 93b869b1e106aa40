"""The FastAPI application: JSON API under /api, dashboard pages at /, offline /docs."""

from __future__ import annotations

import os

import db
from fastapi import FastAPI, Request
from fastapi.responses import Response

from . import routes_api, routes_jobs, routes_pages
from .assets import install_assets
from .bestcache import BestCache, BestResponses
from .errors import install_error_handlers
from .jobs import JobQueue
from .reads import Reads

TOKEN_ENV = "GEMMTUNE_API_TOKEN"
TITLE = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 405: "Method not allowed",
         422: "Invalid parameter", 503: "Database unavailable"}  # fmt: skip


def _error_page(request: Request, status: int, detail: str, allowed: list[str] | None) -> Response:
    return routes_pages.render(
        request, "error.html", status_code=status, code=status, title=TITLE.get(status, "Error"), detail=detail,
        allowed=allowed,
    )


def create_app(database: db.Database | str | None = None, *, api_token: str | None = None,
               best_refresh_s: float = 0.5) -> FastAPI:
    """Build the app over a database (an open `Database`, a URL, or None: GEMMTUNE_DB, then the default).

    api_token: the write token; None reads GEMMTUNE_API_TOKEN. Empty or unset: writes answer 403.
    best_refresh_s: how often /api/best checks the database for new results (api/bestcache.py).
    """
    if not isinstance(database, db.Database):
        database = db.open_database(database)
    app = FastAPI(
        title="gemmtune",
        summary="Autotuned CUDA SGEMM configs: best config per GPU and shape, runs, trials.",
        version="0.1.0",
        docs_url=None,  # served by install_assets with local Swagger UI files
        redoc_url=None,  # ReDoc would need a CDN
    )
    app.state.database = database
    app.state.reads = Reads(database)
    app.state.best_cache = BestCache(database, best_refresh_s)
    app.state.jobs = JobQueue(database)
    token = api_token if api_token is not None else os.environ.get(TOKEN_ENV)
    app.state.api_token = token or None  # "" counts as unset: writes stay off
    install_error_handlers(app, _error_page)
    install_assets(app)
    app.include_router(routes_api.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_pages.router)
    app.include_router(routes_jobs.pages)
    app.add_middleware(BestResponses, cache=app.state.best_cache)
    return app


def app_from_env() -> FastAPI:
    """The app over $GEMMTUNE_DB: the factory each uvicorn worker process calls (python -m api --workers N)."""
    return create_app(None)
