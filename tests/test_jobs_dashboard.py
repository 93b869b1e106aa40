"""The /jobs dashboard page: server-rendered (TestClient), and live in headless Chromium on a real
uvicorn server, where it follows a job from queued to running to done without a reload."""

from __future__ import annotations

import os
import re
import shutil
from html import unescape
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_api_support import STANDIN_GPU, Server, tune_into

import db
from api import create_app

SHAPE = (128, 128, 128)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('jobs-pages')}/results.sqlite"
    return tune_into(url, [("naive", SHAPE)], trials=6)


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def test_jobs_page_lists_every_state_with_its_outcome_and_runs(tuned, tmp_path):
    url = f"sqlite:///{tmp_path}/jobs.sqlite"
    with db.open_database(url) as database, TestClient(create_app(url, api_token="")) as client:
        empty = text_of(client.get("/jobs").text)
        assert "No jobs" in empty and "python -m tuner --worker" in empty
        database.ensure_gpu(db.GpuInfo(STANDIN_GPU, "GPU-00000000-stand-in", "9.0", 132, 80 << 30))
        done, _ = database.enqueue_job(STANDIN_GPU, 1024, 1024, 1024, families=["warptile"],
                                       budget={"trials": 7})
        failed, _ = database.enqueue_job(STANDIN_GPU, 512, 512, 512, origin="best")
        queued, _ = database.enqueue_job(STANDIN_GPU, 4096, 2048, 1024)
        database.claim_job(STANDIN_GPU, "host-a/pid1")
        database.finish_job(done.id, "host-a/pid1", "done", reason="best warptile 12,000 GFLOP/s", run_ids=[3, 4])
        database.claim_job(STANDIN_GPU, "host-b/pid2")
        database.finish_job(failed.id, "host-b/pid2", "failed", reason="cannot run it here: no such shape")
        running = database.claim_job(STANDIN_GPU, "host-c/pid3")
        assert running.id == queued.id

        page = client.get("/jobs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        text = text_of(page.text)
        for words in ("1024×1024×1024", "warptile", "trials=7", "best warptile 12,000 GFLOP/s", "host-a/pid1",
                      "512×512×512", "/api/best?tune=true", "cannot run it here: no such shape",
                      "4096×2048×1024", "host-c/pid3", STANDIN_GPU):
            assert words in text, words
        assert '<a href="/runs/3">#3</a>' in page.text and '<a href="/runs/4">#4</a>' in page.text
        assert re.search(r'id="jobs-running">\s*1<', page.text) and re.search(r'id="jobs-done">\s*1<', page.text)
        assert "gemmtuneJobs(1)" in page.text  # an open job: the page keeps itself fresh

        only_failed = text_of(client.get("/jobs", params={"state": "failed"}).text)
        assert "512×512×512" in only_failed and "1024×1024×1024" not in only_failed
        bad = client.get("/jobs", params={"state": "paused"})
        assert bad.status_code == 422 and "text/html" in bad.headers["content-type"]
        assert '<a href="/jobs">Jobs</a>' in client.get("/").text  # reachable from every page


# ---------------------------------------------------------------- in Chromium

CHROMIUM = os.environ.get("GEMMTUNE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.mark.browser
def test_jobs_page_follows_a_job_live_in_chromium(tuned, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    server = Server(tuned.url)
    try:
        with db.open_database(tuned.url) as database, sync_api.sync_playwright() as p:
            job, _ = database.enqueue_job(STANDIN_GPU, 2048, 256, 64, families=["naive"])
            browser = p.chromium.launch_persistent_context(
                str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                headless=True, viewport={"width": 1400, "height": 900},
            )  # fmt: skip
            try:
                page = browser.new_page()
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(server.base + "/")
                page.click('nav a[href="/jobs"]')
                page.wait_for_url("**/jobs")
                row = f"#job-{job.id}"
                assert "queued" in page.inner_text(f"{row} .job-state")
                assert page.is_visible("#live-indicator")
                page.evaluate("window.__marker = 1")  # survives only if the page is not reloaded

                claimed = database.claim_job(STANDIN_GPU, "chromium-test-worker")
                page.wait_for_function(
                    f"document.querySelector('{row} .job-state').textContent.includes('running')", timeout=15_000)
                assert "chromium-test-worker" in page.inner_text(row)
                database.finish_job(claimed.id, "chromium-test-worker", "done", reason="best naive 321 GFLOP/s",
                                    run_ids=tuned.run_ids)
                page.wait_for_function(
                    f"document.querySelector('{row} .job-state').textContent.includes('done')", timeout=15_000)
                assert "best naive 321 GFLOP/s" in page.inner_text(f"{row} .job-reason")
                page.wait_for_selector("#live-indicator", state="hidden", timeout=15_000)  # nothing open: stops
                assert page.evaluate("window.__marker") == 1
                page.click(f'{row} a[href="/runs/{tuned.run_ids[0]}"]')
                page.wait_for_url(f"**/runs/{tuned.run_ids[0]}")
                assert errors == []
            finally:
                browser.close()
    finally:
        server.stop()
