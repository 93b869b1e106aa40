"""The OpenAPI schema tells the truth: schemathesis (`--checks all`, pinned in the test extras)
against a real uvicorn server on 127.0.0.1, once with a write token and once read-only, plus the
three conformance failures it once found, checked directly."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from results_support import ROOT, Row, fill
from test_api_support import Server

CONFIG = ROOT / "tests" / "data" / "schemathesis.toml"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('st')}/r.sqlite"
    fill(url, [Row("naive", (64, 64, 64), 100.0), Row("tf32x3", (128, 128, 128), 1000.0)], {(64, 64, 64): 50.0})
    return url


def schemathesis_cli() -> list[str]:
    pytest.importorskip("schemathesis")
    exe = Path(sys.executable).with_name("schemathesis")
    return [str(exe)] if exe.exists() else [shutil.which("schemathesis") or "schemathesis"]


@pytest.mark.parametrize("token", ["sesame", ""], ids=["write-token", "read-only"])
def test_schemathesis_finds_no_failure(url, token):
    server = Server(url, env={"GEMMTUNE_API_TOKEN": token})
    try:
        cmd = [*schemathesis_cli(), "--config-file", str(CONFIG), "run", f"{server.base}/openapi.json",
               "--checks", "all", "--max-examples", "5", "--seed", "16", "--no-color"]
        if token:
            cmd += ["-H", f"Authorization: Bearer {token}"]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail
    generated = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert generated and int(generated.group(1)) >= 200 and generated.group(1) == generated.group(2), tail


def test_the_three_once_undocumented_answers(url):
    server = Server(url, env={"GEMMTUNE_API_TOKEN": "sesame"})
    try:
        base = server.base
        spec = httpx.get(f"{base}/openapi.json").json()
        best = spec["paths"]["/api/best"]["get"]["responses"]
        assert {"401", "403"} <= set(best)
        r = httpx.get(f"{base}/api/best", params={"gpu": "x", "m": 1, "n": 1, "k": 1, "tune": "true"},
                      headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403
        post = spec["paths"]["/api/jobs"]["post"]["responses"]
        assert "400" in post
        r = httpx.post(f"{base}/api/jobs", content=b"\xff{", headers={"Content-Type": "application/json",
                                                                        "Authorization": "Bearer sesame"})
        assert r.status_code == 400
        r = httpx.options(f"{base}/api/jobs")
        assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    finally:
        server.stop()
