"""The write-token dependency every future writing endpoint (POST /api/jobs, …) will carry.

No product endpoint writes yet, so the test mounts the dependency on a route of its own app
instance; the configuration path (GEMMTUNE_API_TOKEN, read at app creation) is the real one.
"""

from __future__ import annotations

import pytest
from fastapi import Depends
from fastapi.testclient import TestClient

from api import create_app, routes_jobs
from api.auth import require_write_token


def client_with_write_route(tmp_path, monkeypatch, token: str | None) -> TestClient:
    if token is None:
        monkeypatch.delenv("GEMMTUNE_API_TOKEN", raising=False)
    else:
        monkeypatch.setenv("GEMMTUNE_API_TOKEN", token)
    app = create_app(f"sqlite:///{tmp_path}/results.sqlite")

    @app.post("/api/_test_write", dependencies=[Depends(require_write_token)])
    def write() -> dict[str, bool]:
        return {"written": True}

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("token", [None, ""])
def test_no_token_configured_means_read_only(tmp_path, monkeypatch, token):
    client = client_with_write_route(tmp_path, monkeypatch, token)
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer anything"}):
        r = client.post("/api/_test_write", headers=headers)
        assert r.status_code == 403 and "GEMMTUNE_API_TOKEN" in r.json()["detail"]
    assert client.get("/api/gpus").status_code == 200  # reads are unaffected


def test_configured_token_is_required_and_checked(tmp_path, monkeypatch):
    client = client_with_write_route(tmp_path, monkeypatch, "s3cret-token")
    missing = client.post("/api/_test_write")
    assert missing.status_code == 401 and "Authorization" in missing.json()["detail"]
    scheme = client.post("/api/_test_write", headers={"Authorization": "Basic s3cret-token"})
    assert scheme.status_code == 401 and "Bearer" in scheme.json()["detail"]
    wrong = client.post("/api/_test_write", headers={"Authorization": "Bearer s3cret-tokeN"})
    assert wrong.status_code == 403 and wrong.json()["detail"] == "wrong API token"
    right = client.post("/api/_test_write", headers={"Authorization": "Bearer s3cret-token"})
    assert right.status_code == 200 and right.json() == {"written": True}


def test_explicit_token_argument_overrides_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMTUNE_API_TOKEN", "from-env")
    app = create_app(f"sqlite:///{tmp_path}/results.sqlite", api_token="")
    app.post("/api/_test_write", dependencies=[Depends(require_write_token)])(lambda: {"written": True})
    r = TestClient(app).post("/api/_test_write", headers={"Authorization": "Bearer from-env"})
    assert r.status_code == 403 and "read-only" in r.json()["detail"]


def test_the_only_writing_route_carries_the_token_check(tmp_path):
    """POST /api/jobs is the one route that is not a GET, and it depends on require_write_token
    (so does /api/best with tune=true: tests/test_jobs_api.py)."""
    client = TestClient(create_app(f"sqlite:///{tmp_path}/results.sqlite"))
    writes = {(path, m) for path, ops in client.get("/openapi.json").json()["paths"].items() for m in ops if m != "get"}
    assert writes == {("/api/jobs", "post")}
    [route] = [r for r in routes_jobs.router.routes if r.path == "/api/jobs" and "POST" in r.methods]
    assert require_write_token in [d.call for d in route.dependant.dependencies]
    assert client.post("/api/runs").status_code == 405
