"""`python -m api` as deployed: real uvicorn in a subprocess, database chosen by --db or GEMMTUNE_DB."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from test_api_support import ROOT, STANDIN_GPU, Server, tune_into


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('server')}/results.sqlite"
    return tune_into(url, [("naive", (64, 64, 64))], trials=5)


def test_serves_api_pages_docs_and_assets(tuned):
    server = Server(tuned.url)
    try:
        with httpx.Client(base_url=server.base, timeout=10) as http:
            best = http.get("/api/best", params={"gpu": STANDIN_GPU, "m": 64, "n": 64, "k": 64}).json()
            assert best["match"] == "exact" and best["best"]["gflops"] > 0
            assert http.get("/").status_code == 200
            assert http.get(f"/runs/{tuned.run_ids[0]}").status_code == 200
            assert http.get("/docs").status_code == 200
            assert http.get("/static/swagger/swagger-ui.css").status_code == 200
            assert http.get("/vendor/plotly.min.js").status_code == 200
    finally:
        server.stop()


def test_db_defaults_to_gemmtune_db(tuned):
    # No --db: GEMMTUNE_DB names the database (ARCHITECTURE.md, Settings).
    server = Server(None, env={"GEMMTUNE_DB": tuned.url})
    try:
        gpus = httpx.get(f"{server.base}/api/gpus", timeout=10).json()
        assert [g["name"] for g in gpus] == [STANDIN_GPU]
    finally:
        server.stop()


def test_unusable_database_is_a_clear_exit(tmp_path):
    not_db = tmp_path / "notes.txt"
    not_db.write_text("this is not a database\n" * 50)
    r = subprocess.run(
        [sys.executable, "-m", "api", "--db", f"sqlite:///{not_db}", "--port", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "cannot open the results database" in r.stderr
    assert not_db.read_text().startswith("this is not a database")  # left as found
