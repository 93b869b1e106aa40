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


def test_a_repeated_query_is_answered_with_the_routes_bytes_without_reaching_it(url, tmp_path):
    copy = tmp_path / "copy.sqlite"
    fill(f"sqlite:///{copy}", [Row("naive", (512, 512, 512), 100.0), Row("smem", (256, 256, 256), 50.0)])
    app = create_app(f"sqlite:///{copy}", api_token="", best_refresh_s=60)
    q = {"gpu": H100, "m": 512, "n": 512, "k": 512}
    with TestClient(app, raise_server_exceptions=False) as client:
        client.get("/api/best", params={**q, "m": 8})  # loads the snapshot
        first = client.get("/api/best", params=q)
        assert first.status_code == 200

        def reached(*args, **kwargs):
            raise AssertionError("the route was reached")

        app.state.reads.best_from = reached
        again = client.get("/api/best", params=q)
        assert again.status_code == 200 and again.content == first.content
        assert again.headers["content-type"] == first.headers["content-type"]
        # a new query, a write (tune) and an authorised request all reach the route
        assert client.get("/api/best", params={**q, "m": 256}).status_code == 500
        assert client.get("/api/best", params={**q, "tune": "true"}).status_code == 403
        assert client.get("/api/best", params=q, headers={"Authorization": "Bearer x"}).status_code == 500
        # an error is never kept
        assert client.get("/api/best", params={**q, "m": 0}).status_code == 422
        assert client.get("/api/best", params={**q, "m": 0}).status_code == 422


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


def test_a_gpu_never_seen_is_404_unless_the_request_names_a_fallback_gpu(tmp_path):
    """The rule for GPU models without results of their own: a name never seen is refused (404
    listing the known ones), never silently answered from another GPU; with fallback_gpu it is
    answered from that GPU, and the answer says so (match other_gpu, both GPUs named)."""
    a100, h200, b200 = "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA B200"
    url = f"sqlite:///{tmp_path / 'models.sqlite'}"
    fill(url, [Row("naive", (1024, 1024, 1024), 900.0), Row("smem", (256, 256, 256), 300.0),
               Row("naive", (512, 512, 512), 77.0, gpu=a100, uuid="GPU-a100")])
    with db.open_database(url) as d:
        d.ensure_gpu(db.GpuInfo(h200, "GPU-h200", "9.0", 132, 141 << 30))  # a worker registered it: no results
    reads = Reads(db.open_database(url))
    snap = BestCache(reads.db).refresh()
    with TestClient(create_app(url, api_token="")) as c:
        def best(**q):
            return c.get("/api/best", params={"m": 1024, "n": 1024, "k": 1024} | q)

        for q in ({}, {"nearest": "false"}, {"kernel": "naive"}):
            r = best(gpu=b200, **q)
            assert r.status_code == 404, r.text
            assert "unknown GPU 'NVIDIA B200'" in r.json()["detail"] and H100 in r.json()["detail"]
        refused = best(gpu=b200, fallback_gpu="NVIDIA V100")  # the fallback must be known too
        assert refused.status_code == 404 and "unknown GPU 'NVIDIA V100'" in refused.json()["detail"]

        for fallback, shape, distance in ((H100, (1024, 1024, 1024), 0.0), (a100.lower(), (512, 512, 512), 3 ** 0.5)):
            r = best(gpu=b200, fallback_gpu=fallback)
            assert r.status_code == 200, r.text
            out = r.json()
            assert (out["match"], out["gpu"], out["requested_gpu"]) == ("other_gpu", H100 if fallback == H100 else a100, b200)
            assert (out["shape"]["m"], out["shape"]["n"], out["shape"]["k"]) == shape
            assert out["distance"] == pytest.approx(distance)
            own = best(gpu=fallback).json()  # the fallback's own answer, relabelled and nothing else
            assert out == own | {"match": "other_gpu", "requested_gpu": b200}
            for found in (reads.best(fallback, 1024, 1024, 1024, None), reads.best_from(snap, fallback, 1024, 1024, 1024, None)):
                assert found.best.model_dump(mode="json") == out["best"]
        exact_only = best(gpu=b200, fallback_gpu=a100, nearest="false").json()
        assert (exact_only["match"], exact_only["gpu"], exact_only["requested_gpu"], exact_only["best"]) == \
            ("none", a100, b200, None)

        # a known GPU is answered from its own results, fallback or not, even when it has none
        for gpu, match in ((H100, "exact"), ("gpu-h200", "none"), (h200, "none")):
            own, with_fallback = best(gpu=gpu).json(), best(gpu=gpu, fallback_gpu=a100).json()
            assert own == with_fallback and own["match"] == match and own["requested_gpu"] is None
        assert best(gpu=h200, nearest="false").json()["gpu"] == h200

        # a GPU registered after the snapshot was taken is known at once (the database says so)
        with db.open_database(url) as d:
            d.ensure_gpu(db.GpuInfo(b200, "GPU-b200", "10.0", 148, 180 << 30))
        assert best(gpu=b200, fallback_gpu=H100).json()["match"] == "none"
    reads.db.close()


def test_fallback_gpu_is_documented_in_the_openapi_schema(client):
    spec = client.get("/openapi.json").json()
    params = {p["name"]: p for p in spec["paths"]["/api/best"]["get"]["parameters"]}
    assert "never seen" in params["fallback_gpu"]["description"]
    assert "other_gpu" in params["fallback_gpu"]["description"]
    assert "other_gpu" in spec["components"]["schemas"]["BestOut"]["properties"]["match"]["enum"]
    assert "fallback_gpu" in spec["paths"]["/api/best"]["get"]["description"]
