"""Junk in every query and path parameter of every route: always an answer, never a 5xx."""

from __future__ import annotations

import random
from urllib.parse import quote

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from test_api_support import STANDIN_GPU, tune_into

from api import create_app, routes_api, routes_jobs, routes_pages

JUNK = [
    "", " ", "0", "-1", "1", "2", "1.5", "1e3", "1e309", "NaN", "inf", "-inf", "0x10", "9" * 40, str(2**63),
    str(2**64), str(-(2**63) - 1), str(1 << 20), str((1 << 20) + 1), "true", "null", "[]", "{}", "ok", "running",
    "naive", STANDIN_GPU, STANDIN_GPU.lower(), "GPU-00000000-stand-in", "'; DROP TABLE gt_runs; --", "%", "_",
    "%00", "\x00", "\x1f", "é", "💥", "a" * 5000, "../../etc/passwd", "<script>alert(1)</script>", "1 OR 1=1",
    "csv", "json", "\\", '"', "１２", "٣",
]  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz')}/results.sqlite"
    tune_into(url, [("naive", (64, 64, 64))], trials=6)
    with TestClient(create_app(url, api_token=""), raise_server_exceptions=False) as c:
        yield c


def params_of(dependant) -> tuple[list[str], list[str]]:
    """Path and query parameter names of a route, its dependencies' included."""
    path = [p.name for p in dependant.path_params]
    query = [p.alias for p in dependant.query_params]
    for sub in dependant.dependencies:
        sub_path, sub_query = params_of(sub)
        path += sub_path
        query += sub_query
    return path, query


def get_routes(app) -> list[tuple[str, list[str], list[str]]]:
    """(path template, path parameter names, query parameter names) of every GET route: the app's
    own and those of the routers it includes (each router's routes carry their full path)."""
    routers = (app.router, routes_api.router, routes_jobs.router, routes_pages.router, routes_jobs.pages)
    routes = [r for router in routers for r in router.routes]
    return [
        (route.path, *params_of(route.dependant))
        for route in routes
        if isinstance(route, APIRoute) and "GET" in route.methods
    ]


def test_routes_are_found(client):
    paths = {p for p, _, _ in get_routes(client.app)}
    assert {"/api/best", "/api/runs/{run_id}/trials", "/", "/runs/{run_id}", "/problems/{problem_id}"} <= paths
    # Every documented route is fuzzed.
    assert set(client.get("/openapi.json").json()["paths"]) <= paths


def test_junk_never_gives_a_5xx(client):
    rng = random.Random(20260601)
    seen_4xx = 0
    for path, path_params, query_params in get_routes(client.app):
        for i in range(60):
            # Half the requests fill every parameter, half leave some out.
            values = {name: rng.choice(JUNK) for name in path_params}
            url = path.format(**{k: quote(v, safe="") if v.strip("/.") else "x" for k, v in values.items()})
            query = {q: rng.choice(JUNK) for q in query_params if i % 2 == 0 or rng.random() < 0.5}
            r = client.get(url, params=query)
            assert r.status_code < 500, (url, query, r.status_code, r.text[:300])
            seen_4xx += 400 <= r.status_code < 500
            if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
                assert r.json()["detail"], (url, query)
    assert seen_4xx > 100  # the junk really was junk for most requests


def test_valid_requests_among_the_junk_still_work(client):
    # The same routes answer 200 to good values: the fuzz above is not passing because everything 4xx's.
    assert client.get("/api/best", params={"gpu": STANDIN_GPU, "m": 64, "n": 64, "k": 64}).status_code == 200
    assert client.get("/runs/1").status_code == 200
    assert client.get("/api/runs/1/trials", params={"state": "ok", "limit": 1}).status_code == 200
