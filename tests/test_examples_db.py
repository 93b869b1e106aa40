"""The committed two-model results (examples/pack-h100-h200.json): the best measured config per
problem and arithmetic class of the speed suites on an H100 and an H200, imported into a results
database as a fresh checkout does (`python -m gemmtune import-pack`). The API and dashboard show both models;
/api/best answers each model from its own results, where they differ too, and a model never seen
only through fallback_gpu."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import db
import pytest
from fastapi.testclient import TestClient

from api import create_app

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "examples" / "pack-h100-h200.json"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
# the speed suite's shapes (bench/speed.py)
SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (4096, 4096, 1024),
          (256, 256, 16384), (16, 4096, 4096), (128, 4096, 4096), (4096, 11008, 4096), (1023, 1025, 999)]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A results database made from the pack by the README's command."""
    url = f"sqlite:///{tmp_path_factory.mktemp('examples') / 'results.sqlite'}"
    done = subprocess.run([sys.executable, "-m", "gemmtune", "import-pack", str(PACK), "--db", url],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "stored 40 entries" in done.stdout
    return url


@pytest.fixture(scope="module")
def client(url: str):
    with TestClient(create_app(url, api_token="")) as c:
        yield c


def test_both_models_were_measured_on_every_suite_shape(url: str) -> None:
    with db.open_database(url) as database:
        assert {g.name for g in database.list_gpus()} == {H100, H200}
        for model in (H100, H200):
            for m, n, k in SHAPES:
                assert database.best(model, m, n, k, nearest=False) is not None, (model, m, n, k)


def test_each_model_is_answered_from_its_own_results(client: TestClient, url: str) -> None:
    answers = {}
    with db.open_database(url) as database:
        for model in (H100, H200):
            for m, n, k in SHAPES:
                r = client.get("/api/best", params={"gpu": model, "m": m, "n": n, "k": k})
                assert r.status_code == 200, r.text
                body = r.json()
                stored = database.best(model, m, n, k, nearest=False)
                assert body["match"] == "exact" and body["gpu"] == model
                best = body["best"]
                assert (best["family"], best["config"]) == (stored.family, stored.params)
                answers[model, (m, n, k)] = (best["family"], best["config"])
    # the models' answers differ where their measurements did (docs/fleet.md, "Two GPU models
    # in one database")
    assert any(answers[H100, s] != answers[H200, s] for s in SHAPES)


def test_a_model_never_seen_gets_no_answer_unless_it_names_a_fallback(client: TestClient) -> None:
    query = {"gpu": "NVIDIA H20", "m": 4096, "n": 4096, "k": 4096}
    refused = client.get("/api/best", params=query)
    assert refused.status_code == 404 and H100 in refused.json()["detail"]
    fallback = client.get("/api/best", params=query | {"fallback_gpu": H200})
    assert fallback.status_code == 200
    body = fallback.json()
    assert body["match"] == "other_gpu" and body["gpu"] == H200
    assert body["requested_gpu"] == "NVIDIA H20"


def test_the_dashboard_overview_shows_both_models(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert H100 in page.text and H200 in page.text
    cells = client.get("/api/overview").json()
    assert {c["gpu"] for c in cells} == {H100, H200}


def test_the_committed_pack_holds_both_models() -> None:
    pack = json.loads(PACK.read_text())
    assert {e["gpu"] for e in pack["entries"]} == {H100, H200}


def test_a_pack_without_gpu_records_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    pack = json.loads(PACK.read_text())
    del pack["gpus"]  # as older export-pack wrote them
    old = tmp_path / "old-pack.json"
    old.write_text(json.dumps(pack))
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    done = subprocess.run([sys.executable, "-m", "gemmtune", "import-pack", str(old), "--db", url],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no GPU record for" in done.stderr and "export it again" in done.stderr
    with db.open_database(url) as database:
        assert database.list_gpus() == [] and database.list_runs() == []


# Entries whose family's source changed while no host of their GPU model was lent: they keep the
# source they were measured with (gemmtune.matmul skips them, "other version") until
# bench/refresh_pack.py runs on such a host. wgmma.cu's sum order changed (docs/kernels.md, "A
# model of the tensor core's accumulation") when only H200s were lent.
AWAITING_REMEASURE = {(H100, "wgmma"), (H100, "skinny")}


def test_the_committed_pack_was_measured_with_the_installed_kernel_sources() -> None:
    # A pack entry of another source version is skipped by gemmtune.matmul ("other version"):
    # a change to a family's source (comments included) must come with the pack re-measured
    # (bench/refresh_pack.py on each GPU model) -- on every model a host of which is lent.
    from kernels import get_family

    stale = {(e["gpu"], e["family"]) for e in json.loads(PACK.read_text())["entries"]
             if get_family(e["family"]).source_hash != e["source_hash"]}
    assert stale == AWAITING_REMEASURE, (
        f"re-measure the pack (bench/refresh_pack.py) and keep AWAITING_REMEASURE to what is still "
        f"stale: stale {sorted(stale)}, listed {sorted(AWAITING_REMEASURE)}")
