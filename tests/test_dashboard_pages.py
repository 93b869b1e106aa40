"""Dashboard pages, server-rendered, over a database written by the tuner's search (no browser)."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import db
import pytest
from fastapi.testclient import TestClient
from test_api_support import STANDIN_GPU, tune_into

import api
from api import create_app

SHAPE = (128, 128, 128)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('pages')}/results.sqlite"
    return tune_into(url, [("naive", SHAPE), ("smem", SHAPE)], trials=10)


@pytest.fixture(scope="module")
def client(tuned):
    with TestClient(create_app(tuned.url, api_token=""), raise_server_exceptions=False) as c:
        yield c


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def test_overview_shows_best_per_gpu_and_problem_and_the_runs(client, tuned):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = text_of(page.text)
    with db.open_database(tuned.url) as database:
        cell = database.overview()[0]
    assert STANDIN_GPU in text and "128×128×128" in text
    assert f"{cell.best_gflops:,.0f}" in text and f"{100 * cell.fraction_of_cublas:.1f}% cuBLAS" in text
    for run_id in tuned.run_ids:
        assert f'href="/runs/{run_id}"' in page.text
    assert "GFLOP/s" in text and "of cuBLAS" in text


def test_run_page_has_plots_top_configs_and_failures(client, tuned):
    run_id = tuned.run_ids[0]
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    for plot in ("plot-progress", "plot-occupancy", "plot-params"):
        assert f'id="{plot}"' in page.text
    with db.open_database(tuned.url) as database:
        run = database.get_run(run_id)
        failed = [t for t in database.trials(run_id, limit=1000) if t.state != "ok"]
        top = database.top_k_for_run(run_id, limit=1)[0]
    text = text_of(page.text)
    assert f"{run.best_gflops:,.0f}" in text
    assert failed and all(" ".join(t.error.splitlines()[0].split()) in text for t in failed if t.error)
    assert all(f"{k} = {v}" in text for k, v in top.params.items())
    assert f"/api/runs/{run_id}/trials/export?format=csv" in page.text


def test_problem_page_compares_families(client, tuned):
    with db.open_database(tuned.url) as database:
        pid = database.list_problems()[0].id
    page = client.get(f"/problems/{pid}")  # one GPU measured it: no need to name it
    assert page.status_code == 200
    text = text_of(page.text)
    assert "naive" in text and "smem" in text and "cuBLAS" in text
    assert client.get(f"/problems/{pid}", params={"gpu": "gpu-00000000-stand-in"}).status_code == 200


def test_unknown_pages_answer_a_readable_html_404(client):
    for path in ("/runs/424242", "/problems/424242", "/problems/1?gpu=Voodoo"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), path
        assert "Not found" in r.text and "Back to the overview" in r.text
    bad = client.get("/runs/abc")
    assert bad.status_code == 422 and "run_id" in bad.text


def test_nothing_is_loaded_from_outside_the_app():
    """No CDN anywhere: every src/href in the templates is local, and the JS fetches only /api."""
    root = Path(api.__file__).parent
    for f in list((root / "templates").glob("*.html")) + list((root / "static").glob("*.js")):
        for ref in re.findall(r'(?:src|href)=["\']([^"\'{]+)', f.read_text()):
            assert ref.startswith(("/", "#")), (f.name, ref)
        assert "//cdn" not in f.read_text() and "https://" not in f.read_text(), f.name


def test_empty_database_renders(tmp_path):
    client = TestClient(create_app(f"sqlite:///{tmp_path}/empty.sqlite"))
    page = client.get("/")
    assert page.status_code == 200 and "Nothing tuned yet" in page.text and "No runs recorded yet" in page.text
    assert client.get("/api/best", params={"gpu": "x", "m": 1, "n": 1, "k": 1}).json()["detail"].endswith(
        "(none recorded yet)"
    )


def test_problem_page_compares_the_gpu_models_side_by_side(tmp_path):
    url = f"sqlite:///{tmp_path}/models.sqlite"
    other = "Stand-in GPU B"
    tune_into(url, [("naive", SHAPE)], trials=8)
    tune_into(url, [("smem", SHAPE), ("naive", SHAPE)], trials=8, gpu_name=other, gpu_uuid="GPU-00000000-stand-in-b")
    tune_into(url, [("naive", (64, 64, 64))], trials=4)  # another problem: not in this one's comparison
    with db.open_database(url) as database:
        pid = database.ensure_problem(*SHAPE)
        cells = sorted((c for c in database.overview() if c.problem.id == pid), key=lambda c: -c.best_gflops)
    assert sorted(c.gpu_name for c in cells) == sorted([STANDIN_GPU, other])
    with TestClient(create_app(url, api_token="")) as client:
        picker = client.get(f"/problems/{pid}")  # two GPUs measured it: pick one, the comparison beside
        chosen = client.get(f"/problems/{pid}", params={"gpu": other})
        overlaid = client.get(f"/api/problems/{pid}/models").json()  # what the overlay chart draws
    assert [(c["gpu"], c["best_gflops"], c["run_id"], c["cublas_gflops"]) for c in overlaid] == [
        (c.gpu_name, c.best_gflops, c.run_id, c.baseline_gflops) for c in cells]  # fastest first
    for page in (picker, chosen):
        assert page.status_code == 200
        # both pages overlay the models in one chart, drawn in the browser from the endpoint above
        assert 'id="plot-models"' in page.text and f"gemmtune.modelsOverlay({pid})" in page.text
        assert "models-overlay-note" not in page.text
        table = page.text.split('id="models-table"', 1)[1].split("</table>", 1)[0]
        rows = [text_of(r) for r in table.split("<tr")[2:]]
        assert len(rows) == 2, rows
        for row, cell in zip(rows, cells):  # fastest first
            assert cell.gpu_name in row and f"{cell.best_gflops:,.0f}" in row and cell.family in row
            assert f"{100 * cell.fraction_of_cublas:.1f}%" in row and f"#{cell.run_id}" in row
        assert "1.00×" in rows[0] and f"{cells[1].best_gflops / cells[0].best_gflops:.2f}×" in rows[1]
    # on a model's own page that model is in bold, the other one a link to its page
    raw = {r.split("</td>", 1)[0]: r for r in chosen.text.split('id="models-table"', 1)[1].split("</table>")[0].split("<tr")[2:]}
    [mine] = [r for r in raw.values() if other in r]
    [theirs] = [r for r in raw.values() if STANDIN_GPU in r]
    assert f"<b>{other}</b>" in mine and "?gpu=" not in mine.split("</td>", 1)[0]
    assert f'<a href="/problems/{pid}?gpu=Stand-in%20GPU' in theirs.split("</td>", 1)[0]
    assert "GPU models compared" in chosen.text and "GPU models compared" not in client_single_page(url)


def client_single_page(url: str) -> str:
    """A problem measured on one GPU only: no comparison panel."""
    with db.open_database(url) as database:
        pid = database.ensure_problem(64, 64, 64)
    with TestClient(create_app(url, api_token="")) as client:
        page = client.get(f"/problems/{pid}")
    assert page.status_code == 200 and "naive" in page.text
    # one model: a sentence instead of the overlay chart
    assert f"Only {STANDIN_GPU} has measured this problem" in text_of(page.text)
    assert 'id="plot-models"' not in page.text and "modelsOverlay" not in page.text
    return page.text


def test_a_re_timed_figure_says_of_how_many_timings_it_is_the_median(tmp_path, client, tuned):
    with db.open_database(tuned.url) as database:
        pid = database.list_problems()[0].id
    assert "median of" not in text_of(client.get(f"/runs/{tuned.run_ids[0]}").text)
    url = f"sqlite:///{tmp_path}/results.sqlite"
    retuned = tune_into(url, [("naive", SHAPE)], trials=4)
    with db.open_database(url) as database:
        top = database.top_k_for_run(retuned.run_ids[0], limit=1)[0]
        database.retime_trial(top.trial_id, timings=4, time_median_ms=top.time_median_ms,
                              gflops=top.gflops)
        pid = database.list_problems()[0].id
    with TestClient(create_app(url, api_token="")) as fresh:
        for page in (f"/runs/{retuned.run_ids[0]}", f"/problems/{pid}"):
            text = text_of(fresh.get(page).text)
            assert f"{top.gflops:,.0f} median of 4" in text, page
