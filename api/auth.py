"""Write protection: every endpoint that changes state depends on `require_write_token`.

The token comes from configuration (GEMMTUNE_API_TOKEN, read when the app is created). With no
token configured, writes are disabled outright (403), so a default deployment is read-only.
"""

from __future__ import annotations

import hmac

from fastapi import Header, Request

from .errors import ApiError


def require_write_token(
    request: Request,
    authorization: str | None = Header(default=None, description="`Bearer <GEMMTUNE_API_TOKEN>`"),
) -> None:
    expected: str | None = request.app.state.api_token
    if not expected:
        raise ApiError(403, "this server is read-only: writes need GEMMTUNE_API_TOKEN set on the server")
    if not authorization:
        raise ApiError(401, "missing 'Authorization: Bearer <token>' header")
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "the Authorization header must read 'Bearer <token>'")
    # Constant-time comparison so the token cannot be guessed from response timing.
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise ApiError(403, "wrong API token")
