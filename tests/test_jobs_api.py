"""POST /api/jobs, GET /api/jobs[/{id}], /api/best?tune=true: token, validation, deduplication.

The database is a real SQLite file filled by the tuner's own search loop (test_api_support)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from test_api_support import STANDIN_GPU, tune_into

import db
import kernels
from api import create_app, reads, schemas

TOKEN = "job-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TUNED = (128, 128, 128)


@pytest.fixture(scope="module")
def tuned_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('jobs-api')}/results.sqlite"
    return tune_into(url, [("naive", TUNED)], trials=6).url


@pytest.fixture
def client(tuned_url, tmp_path):
    # each test gets a copy, so the jobs one test queues do not leak into another's
    with db.open_database(tuned_url) as source, db.open_database(f"sqlite:///{tmp_path}/copy.sqlite") as copy:
        for gpu in source.list_gpus():
            copy.ensure_gpu(db.GpuInfo(gpu.name, gpu.uuid, gpu.compute_capability, gpu.sm_count, gpu.memory_bytes))
    with TestClient(create_app(f"sqlite:///{tmp_path}/copy.sqlite", api_token=TOKEN)) as c:
        yield c


@pytest.fixture
def tuned_client(tuned_url):
    with TestClient(create_app(tuned_url, api_token=TOKEN)) as c:
        yield c
        with db.open_database(tuned_url) as database:  # leave the shared file as found: no open jobs
            for job in database.list_jobs(limit=1000):
                if job.state == "queued":
                    claimed = database.claim_job(job.gpu_name, "cleanup")
                    database.finish_job(claimed.id, "cleanup", "failed", reason="test cleanup")


def post(client, body, headers=AUTH):
    return client.post("/api/jobs", json=body, headers=headers)


def test_a_posted_job_is_queued_and_a_repeat_returns_it(client):
    body = {"gpu": STANDIN_GPU.upper(), "m": 1000, "n": 700, "k": 900, "families": ["Warptile", "naive"],
            "budget": {"trials": 12, "patience": 0, "total_seconds": 60}}
    first = post(client, body)
    assert first.status_code == 201, first.text
    job = first.json()
    assert first.headers["location"] == f"/api/jobs/{job['id']}"
    assert (job["state"], job["gpu"], job["m"], job["n"], job["k"]) == ("queued", STANDIN_GPU, 1000, 700, 900)
    assert job["families"] == ["warptile", "naive"] and job["origin"] == "request"
    assert job["budget"] == {"trials": 12, "patience": 0, "total_seconds": 60.0}
    assert job["attempts"] == 0 and job["worker"] is None and job["run_ids"] == []

    again = post(client, {"gpu": "GPU-00000000-stand-in", "m": 1000, "n": 700, "k": 900})
    assert again.status_code == 200 and again.json() == job  # the open job, nothing new
    other = post(client, {"gpu": STANDIN_GPU, "m": 1000, "n": 700, "k": 901})
    assert other.status_code == 201 and other.json()["families"] == [] and other.json()["budget"] == {}

    assert [j["id"] for j in client.get("/api/jobs").json()] == [other.json()["id"], job["id"]]
    assert client.get(f"/api/jobs/{job['id']}").json() == job
    assert client.get("/api/jobs", params={"state": "done"}).json() == []
    assert len(client.get("/api/jobs", params={"gpu": STANDIN_GPU.lower(), "limit": 1}).json()) == 1


def test_writes_need_the_token_and_a_read_only_server_refuses_them(client, tuned_url):
    body = {"gpu": STANDIN_GPU, "m": 64, "n": 64, "k": 64}
    assert post(client, body, headers={}).status_code == 401
    wrong = post(client, body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and wrong.json()["detail"] == "wrong API token"
    with TestClient(create_app(tuned_url, api_token="")) as read_only:
        refused = post(read_only, body)
        assert refused.status_code == 403 and "read-only" in refused.json()["detail"]
        tune = read_only.get("/api/best", params={"gpu": STANDIN_GPU, "m": 64, "n": 64, "k": 64, "tune": "true"})
        assert tune.status_code == 403
        assert read_only.get("/api/jobs").json() == []
    assert client.get("/api/jobs").json() == []


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"gpu": "H100"}, 422, "unknown GPU model 'H100'; known: " + STANDIN_GPU),
        ({"gpu": ""}, 422, "body parameter 'gpu'"),
        ({"m": 0}, 422, "body parameter 'm': Input should be greater than or equal to 1 (got 0)"),
        ({"k": (1 << 20) + 1}, 422, "body parameter 'k': Input should be less than or equal to 1048576"),
        ({"n": "64x"}, 422, "body parameter 'n'"),
        ({"families": ["warptile", "fastest"]}, 422, "unknown kernel family 'fastest' in 'families'; allowed: naive, smem"),
        ({"budget": {"trials": 0}}, 422, "'budget.trials': Input should be greater than or equal to 1"),
        ({"budget": {"trials": 10_001}}, 422, "'budget.trials': Input should be less than or equal to 10000"),
        ({"budget": {"patience": -1}}, 422, "'budget.patience'"),
        ({"budget": {"total_seconds": 0.5}}, 422, "'budget.total_seconds'"),
        ({"budget": {"trails": 5}}, 422, "'budget.trails': Extra inputs are not permitted"),
        ({"priority": 1}, 422, "'priority': Extra inputs are not permitted"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_problem_and_queue_nothing(client, change, status, words):
    r = post(client, {"gpu": STANDIN_GPU, "m": 64, "n": 64, "k": 64} | change)
    assert r.status_code == status and words in r.json()["detail"], r.text
    if "GPU model" in words:
        assert r.json()["allowed"] == [STANDIN_GPU] and "--worker" in r.json()["detail"]
    if "kernel family" in words:
        assert r.json()["allowed"] == list(kernels.FAMILIES)
    assert client.get("/api/jobs").json() == []


def test_bad_reads_are_4xx(client):
    assert client.post("/api/jobs", content=b"not json", headers=AUTH | {"Content-Type": "application/json"}).status_code == 422
    missing = client.get("/api/jobs/42")
    assert missing.status_code == 404 and "unknown job id 42" in missing.json()["detail"]
    state = client.get("/api/jobs", params={"state": "paused"})
    assert state.status_code == 422 and "'queued', 'running', 'done' or 'failed'" in state.json()["detail"]
    gpu = client.get("/api/jobs", params={"gpu": "H100"})
    assert gpu.status_code == 404 and gpu.json()["allowed"] == [STANDIN_GPU]


def test_best_with_tune_queues_a_job_only_on_a_miss(tuned_client):
    exact = {"gpu": STANDIN_GPU, "m": TUNED[0], "n": TUNED[1], "k": TUNED[2], "tune": "true"}
    hit = tuned_client.get("/api/best", params=exact, headers=AUTH).json()
    assert hit["match"] == "exact" and hit["job"] is None
    assert tuned_client.get("/api/jobs").json() == []

    miss = {"gpu": STANDIN_GPU, "m": 512, "n": 256, "k": 128, "kernel": "NAIVE"}
    plain = tuned_client.get("/api/best", params=miss).json()  # tune defaults to false: no job
    assert plain["match"] == "nearest" and plain["job"] is None and tuned_client.get("/api/jobs").json() == []
    assert tuned_client.get("/api/best", params=miss | {"tune": "true"}).status_code == 401
    answer = tuned_client.get("/api/best", params=miss | {"tune": "true"}, headers=AUTH).json()
    assert answer["match"] == "nearest" and answer["best"] is not None  # the answer is still given
    job = answer["job"]
    assert (job["state"], job["origin"], job["families"]) == ("queued", "best", ["naive"])
    assert (job["m"], job["n"], job["k"], job["gpu"]) == (512, 256, 128, STANDIN_GPU)
    again = tuned_client.get("/api/best", params=miss | {"tune": "true"}, headers=AUTH).json()
    assert again["job"] == job
    assert [j["id"] for j in tuned_client.get("/api/jobs").json()] == [job["id"]]
    unknown = tuned_client.get("/api/best", params=miss | {"gpu": "H100", "tune": "true"}, headers=AUTH)
    assert unknown.status_code == 404


def test_documented_limits_are_the_databases(client):
    assert schemas.JOB_MAX_DIM == reads.MAX_DIM  # the same sizes /api/best accepts
    components = client.get("/openapi.json").json()["components"]["schemas"]
    for key, (low, high) in db.JOB_BUDGET_LIMITS.items():
        field = components["JobBudgetIn"]["properties"][key]["anyOf"][0]
        assert (field["minimum"], field["maximum"]) == (low, high), key
