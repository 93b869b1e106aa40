"""/api/best from memory: the snapshot answers exactly as the database does (exact, nearest,
family, precision and version filters, several boards of one model), picks up new trials, and the
precision filter, /api/pack, the 405 Allow header and `python -m api --workers` work."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time

import db
import httpx
import kernels
import pytest
from fastapi.testclient import TestClient
from results_support import H100, ROOT, Row, fill
from test_api_support import free_port

from api import create_app
from api.bestcache import BestCache
from api.reads import Reads
from gemmtune.pack import build_pack

OLD = hashlib.sha256(b"an older naive.cu").hexdigest()
FAMILIES = ["naive", "smem", "blocktile2d", "tf32x3"]
SECOND_BOARD = "GPU-99999999-2222-3333-4444-555555555555"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    rng = random.Random(16)
    rows, baselines = [], {}
    shapes = [(rng.choice([64, 256, 1000, 1024, 4096]), rng.choice([128, 512, 1024]), rng.choice([256, 1024, 8192]))
              for _ in range(14)]
    for shape in shapes:
        for family in rng.sample(FAMILIES, 2):
            uuid = rng.choice([Row.uuid, SECOND_BOARD])  # two boards of one model
            rows.append(Row(family, shape, float(rng.randint(100, 40_000)), OLD if rng.random() < 0.2 else None,
                            uuid=uuid))
        if rng.random() < 0.5:
            baselines[shape] = float(rng.randint(1000, 30_000))
    rows.append(Row("naive", (32, 32, 32), 10.0, gpu="NVIDIA A100-SXM4-80GB", uuid="GPU-a100"))
    url = f"sqlite:///{tmp_path_factory.mktemp('cache')}/r.sqlite"
    fill(url, rows, baselines)
    return url


@pytest.fixture(scope="module")
def database(url):
    with db.open_database(url) as d:
        yield d


def test_snapshot_answers_exactly_as_the_database(database):
    reads, snap = Reads(database), BestCache(database).refresh()
    current = sorted({f.source_hash for f in kernels.FAMILIES.values()})
    rng = random.Random(3)
    checked = 0
    for _ in range(300):
        m, n, k = (rng.choice([32, 64, 100, 256, 1000, 1024, 3000, 4096]) for _ in range(3))
        gpu = rng.choice([H100, H100.lower(), SECOND_BOARD, "NVIDIA A100-SXM4-80GB"])
        kernel = rng.choice([None, None, *FAMILIES])
        precision = rng.choice(["fp32", "ffma"])
        if precision == "ffma" and kernel == "tf32x3":
            continue
        nearest = rng.random() < 0.8
        hashes = current if rng.random() < 0.3 else None
        want = reads.best(gpu, m, n, k, kernel, nearest, precision, hashes)
        got = reads.best_from(snap, gpu, m, n, k, kernel, nearest, precision, hashes)
        assert got == want, (gpu, m, n, k, kernel, precision, nearest, hashes)
        checked += want.match != "none"
    assert checked > 100


def test_new_trials_show_up_after_the_refresh_interval(url, tmp_path):
    copy = tmp_path / "copy.sqlite"
    fill(f"sqlite:///{copy}", [Row("naive", (512, 512, 512), 100.0)])
    app = create_app(f"sqlite:///{copy}", api_token="", best_refresh_s=0.2)
    q = {"gpu": H100, "m": 512, "n": 512, "k": 512}
    with TestClient(app) as client:
        assert client.get("/api/best", params=q).json()["best"]["family"] == "naive"
        fill(f"sqlite:///{copy}", [Row("smem", (512, 512, 512), 900.0)])
        time.sleep(0.25)
        assert client.get("/api/best", params=q).json()["best"]["family"] == "smem"
        reloads = app.state.best_cache.reloads
        for _ in range(20):  # nothing changed: no reload
            client.get("/api/best", params=q)
        assert app.state.best_cache.reloads == reloads == 2


@pytest.fixture(scope="module")
def client(database):
    with TestClient(create_app(database, api_token=""), raise_server_exceptions=False) as c:
        yield c


def test_precision_parameter(client, database):
    ffma = {n for n, f in kernels.FAMILIES.items() if f.precision == "ffma"}
    for m, n, k in {(r.problem.m, r.problem.n, r.problem.k) for r in database.best_table()}:
        q = {"gpu": H100, "m": m, "n": n, "k": k}
        out = client.get("/api/best", params=q | {"precision": "ffma"}).json()
        assert out["best"] is None or out["best"]["family"] in ffma
    bad = client.get("/api/best", params={"gpu": H100, "m": 1, "n": 1, "k": 1, "precision": "tf32"})
    assert bad.status_code == 422 and "precision" in bad.json()["detail"]
    refused = client.get("/api/best", params={"gpu": H100, "m": 1, "n": 1, "k": 1, "precision": "ffma",
                                               "kernel": "tf32x3"})
    assert refused.status_code == 422 and "not a ffma family" in refused.json()["detail"]
    cells = client.get("/api/overview", params={"precision": "ffma"}).json()
    assert cells and all(c["family"] in ffma for c in cells)
    assert "FFMA kernels only" in client.get("/?precision=ffma").text


def test_pack_route_is_the_cli_pack(client, database):
    out = client.get("/api/pack", params={"gpu": H100}).json()
    want = build_pack(database, gpus=[H100])
    assert out["entries"] == want["entries"] and out["entries"]
    assert {e["gpu"] for e in out["entries"]} == {H100}
    assert client.get("/api/pack", params={"gpu": "nope"}).status_code == 404


def test_405_lists_every_method_of_the_path(client):
    r = client.options("/api/jobs")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST" and r.json()["allowed"] == ["GET", "POST"]
    assert client.delete("/api/best").headers["allow"] == "GET"


def test_several_workers(url):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "api", "--port", str(port), "--db", url, "--workers", "2",
                             "--log-level", "warning"], cwd=ROOT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/best", params={"gpu": H100, "m": 64, "n": 128, "k": 256},
                              timeout=2)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["match"] in ("exact", "nearest")
        children = subprocess.run(["ps", "--ppid", str(proc.pid), "-o", "pid="], capture_output=True, text=True)
        assert len(children.stdout.split()) >= 2, children.stdout  # uvicorn's worker processes
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    bad = subprocess.run([sys.executable, "-m", "api", "--workers", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--workers must be 1..64" in bad.stderr


def test_tune_on_a_miss_with_precision_queues_that_precisions_families(url, tmp_path):
    copy = tmp_path / "tune.sqlite"
    fill(f"sqlite:///{copy}", [Row("naive", (512, 512, 512), 100.0)])
    with TestClient(create_app(f"sqlite:///{copy}", api_token="sesame")) as c:
        q = {"gpu": H100, "m": 300, "n": 300, "k": 300, "precision": "ffma", "tune": "true"}
        assert c.get("/api/best", params=q).status_code == 401
        out = c.get("/api/best", params=q, headers={"Authorization": "Bearer sesame"}).json()
    assert out["match"] == "nearest" and out["job"]["origin"] == "best"
    assert set(out["job"]["families"]) == {n for n, f in kernels.FAMILIES.items() if f.precision == "ffma"}
