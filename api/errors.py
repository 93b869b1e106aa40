"""Every error the API returns is JSON `{"detail": "<what was wrong>", "allowed": [...]}`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import db

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A request the API understood but cannot answer; carries the status and the allowed values."""

    def __init__(self, status_code: int, detail: str, allowed: Iterable[str] | None = None) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        self.allowed = list(allowed) if allowed is not None else None


def not_found(what: str, value: object, allowed: Sequence[str] | None = None) -> ApiError:
    msg = f"unknown {what} {value!r}"
    if allowed is not None:
        msg += f"; known: {', '.join(allowed) if allowed else '(none yet)'}"
    return ApiError(404, msg, allowed)


def _shorten(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_validation(errors: Sequence[dict[str, Any]]) -> str:
    """Turn pydantic's error list into one line per problem: `query parameter 'm': ... (got '0')`."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        where = f"{loc[0]} parameter {'.'.join(loc[1:])!r}" if len(loc) > 1 else ".".join(loc) or "request"
        msg = err.get("msg", "invalid")
        if err.get("type") != "missing" and "input" in err:
            msg += f" (got {_shorten(err['input'])})"
        parts.append(f"{where}: {msg}")
    return "; ".join(parts) or "invalid request"


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route fully matches on this request's path."""
    return [
        method for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in app.router.routes)
    ]  # fmt: skip


HtmlRenderer = Callable[[Request, int, str, "list[str] | None"], Response]


def wants_html(request: Request) -> bool:
    """Dashboard pages answer errors as pages; the API (and anything asking for JSON) as JSON."""
    path = request.url.path
    return not (path.startswith("/api") or path.startswith("/openapi") or path.startswith("/static"))


def install_error_handlers(app: FastAPI, html: HtmlRenderer) -> None:
    def answer(request: Request, status: int, detail: str, allowed: list[str] | None, **extra: Any) -> Response:
        if wants_html(request):
            return html(request, status, detail, allowed)
        return JSONResponse({"detail": detail, "allowed": allowed, **extra}, status_code=status)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return answer(request, exc.status_code, exc.detail, exc.allowed)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        # pydantic's list carries the raw input, which may not be JSON-able (bytes); keep words only.
        slim = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg"), "type": e.get("type")} for e in errors]
        return answer(request, 422, describe_validation(errors), None, errors=slim)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        headers = dict(exc.headers or {})
        allowed: list[str] | None = None
        if exc.status_code == 405 and (allowed := allowed_methods(app, request)):
            # Starlette names the methods of the first route on this path only (POST /api/jobs
            # hid GET /api/jobs); list every route's.
            headers["Allow"] = ", ".join(allowed)
            detail = f"method {request.method} not allowed on {request.url.path}; allowed: {headers['Allow']}"
        response = answer(request, exc.status_code, detail, allowed)
        for key, value in headers.items():
            response.headers[key] = value
        return response

    @app.exception_handler(db.StorageError)
    async def _storage(request: Request, exc: db.StorageError) -> Response:
        log.error("database unusable: %s", exc)
        return answer(request, 503, f"the results database cannot be read: {exc}", None)

    @app.exception_handler(db.InvalidInputError)
    async def _db_input(request: Request, exc: db.InvalidInputError) -> Response:
        # The API validates first; this is the database's own check, worded by it.
        status = 404 if isinstance(exc, LookupError) else 422
        return answer(request, status, str(exc), None)
