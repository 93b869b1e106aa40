"""The JSON API against a database written by a real (stand-in GPU) tuning search."""

from __future__ import annotations

import csv
import io
import re
import time

import db
import kernels
import pytest
from fastapi.testclient import TestClient
from test_api_support import STANDIN_GPU, tune_into

from api import create_app
from api.reads import MAX_DIM

SHAPE = (256, 256, 256)
OTHER = (512, 512, 512)
CUBLAS = 18_000.0  # tuner.measure.testing.STANDIN_CUBLAS_GFLOPS


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('api')}/results.sqlite"
    result = tune_into(url, [("naive", SHAPE), ("blocktile2d", SHAPE), ("blocktile1d", OTHER)], trials=12)
    # A second GPU that was registered but never tuned on: /api/best must say "none" for it.
    with db.open_database(url) as database:
        database.ensure_gpu(db.GpuInfo("Idle GPU", "GPU-idle-0001", "8.0", 108, 40 << 30, 1410, "x", "x", "x"))
    return result


@pytest.fixture(scope="module")
def database(tuned):
    with db.open_database(tuned.url) as d:
        yield d


@pytest.fixture(scope="module")
def client(database):
    with TestClient(create_app(database, api_token=""), raise_server_exceptions=False) as c:
        yield c


def ok_trials(database, run_id):
    return [t for t in database.trials(run_id, limit=1000) if t.state == "ok"]


def test_gpus_lists_what_the_tuner_registered(client):
    gpus = client.get("/api/gpus").json()
    assert {g["name"] for g in gpus} == {STANDIN_GPU, "Idle GPU"}
    standin = next(g for g in gpus if g["name"] == STANDIN_GPU)
    assert standin["compute_capability"] == "9.0" and standin["sm_count"] == 132


def test_kernels_carry_the_parameter_spaces(client):
    out = client.get("/api/kernels").json()
    assert [k["name"] for k in out] == list(kernels.FAMILIES)
    for k in out:
        fam = kernels.FAMILIES[k["name"]]
        assert k["source_hash"] == fam.source_hash and k["rung"] == fam.rung
        assert [(p["name"], tuple(p["values"])) for p in k["params"]] == [(p.name, p.values) for p in fam.params]
        assert k["space_size"] == fam.space_size()


def test_problems(client):
    shapes = {(p["m"], p["n"], p["k"]) for p in client.get("/api/problems").json()}
    assert shapes == {SHAPE, OTHER}


def test_best_exact_is_the_fastest_verified_trial(client, database, tuned):
    m, n, k = SHAPE
    out = client.get("/api/best", params={"gpu": STANDIN_GPU, "m": m, "n": n, "k": k}).json()
    assert out["match"] == "exact" and out["shape"] == {"m": m, "n": n, "k": k}
    best = out["best"]
    # Independently: the fastest ok trial over the runs on this shape.
    candidates = [(t.gflops, run_id, t) for run_id in tuned.run_ids[:2] for t in ok_trials(database, run_id)]
    top_gflops, top_run, top_trial = max(candidates, key=lambda c: c[0])
    assert best["gflops"] == pytest.approx(top_gflops)
    assert best["run_id"] == top_run and best["trial_number"] == top_trial.number
    assert best["config"] == top_trial.params
    assert best["cublas_gflops"] == pytest.approx(CUBLAS)
    assert best["fraction_of_cublas"] == pytest.approx(top_gflops / CUBLAS)
    assert best["occupancy"] == pytest.approx(top_trial.occupancy) and best["registers"] == top_trial.registers


def test_best_names_the_gpu_by_uuid_or_name_in_any_case(client):
    shape = dict(zip("mnk", SHAPE))
    a = client.get("/api/best", params={"gpu": STANDIN_GPU.upper(), **shape}).json()
    b = client.get("/api/best", params={"gpu": "gpu-00000000-STAND-IN", **shape}).json()
    assert a["best"] == b["best"] and a["match"] == "exact"


def test_best_kernel_filter(client, database, tuned):
    shape = dict(zip("mnk", SHAPE))
    out = client.get("/api/best", params={"gpu": STANDIN_GPU, "kernel": "blocktile2d", **shape}).json()
    assert out["best"]["family"] == "blocktile2d" and out["kernel"] == "blocktile2d"
    assert out["best"]["gflops"] == pytest.approx(max(t.gflops for t in ok_trials(database, tuned.run_ids[1])))


def test_best_nearest_says_which_shape_it_came_from(client):
    out = client.get("/api/best", params={"gpu": STANDIN_GPU, "m": 300, "n": 250, "k": 256}).json()
    assert out["match"] == "nearest"
    assert out["shape"] == {"m": 256, "n": 256, "k": 256} and out["requested"] == {"m": 300, "n": 250, "k": 256}
    assert out["distance"] > 0
    exact_only = client.get("/api/best", params={"gpu": STANDIN_GPU, "m": 300, "n": 250, "k": 256, "nearest": False})
    assert exact_only.json()["match"] == "none" and exact_only.json()["best"] is None


def test_best_none_on_a_gpu_with_nothing_tuned(client):
    r = client.get("/api/best", params={"gpu": "idle gpu", "m": 256, "n": 256, "k": 256})
    assert r.status_code == 200 and r.json()["match"] == "none" and r.json()["best"] is None


@pytest.mark.parametrize(
    ("value", "words"),
    [("0", "greater than or equal to 1"), ("-3", "greater than or equal to 1"), ("abc", "valid integer"),
     ("1.5", "valid integer"), (str(MAX_DIM + 1), f"less than or equal to {MAX_DIM}"), ("", "valid integer")],
)  # fmt: skip
def test_bad_sizes_are_422_naming_the_parameter(client, value, words):
    r = client.get("/api/best", params={"gpu": STANDIN_GPU, "m": 256, "n": value, "k": 256})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "'n'" in detail and words in detail, detail


def test_largest_documented_size_is_accepted(client):
    r = client.get("/api/best", params={"gpu": STANDIN_GPU, "m": MAX_DIM, "n": MAX_DIM, "k": MAX_DIM})
    assert r.status_code == 200 and r.json()["match"] == "nearest"


def test_missing_gpu_is_422(client):
    r = client.get("/api/best", params={"m": 1, "n": 1, "k": 1})
    assert r.status_code == 422 and "'gpu'" in r.json()["detail"] and "required" in r.json()["detail"].lower()


def test_unknown_gpu_lists_the_known_ones(client):
    r = client.get("/api/best", params={"gpu": "RTX 9999", "m": 1, "n": 1, "k": 1})
    assert r.status_code == 404
    body = r.json()
    assert "RTX 9999" in body["detail"] and STANDIN_GPU in body["detail"] and "Idle GPU" in body["detail"]
    assert STANDIN_GPU in body["allowed"] and "GPU-idle-0001" in body["allowed"]


def test_unknown_kernel_lists_the_known_ones(client):
    r = client.get("/api/best", params={"gpu": STANDIN_GPU, "m": 1, "n": 1, "k": 1, "kernel": "cutlass"})
    assert r.status_code == 404
    assert "cutlass" in r.json()["detail"] and r.json()["allowed"] == list(kernels.FAMILIES)


def test_runs_newest_first_with_filters(client, tuned):
    runs = client.get("/api/runs").json()
    assert [r["id"] for r in runs] == sorted(tuned.run_ids, reverse=True)
    assert all(r["state"] == "finished" for r in runs)
    only = client.get("/api/runs", params={"kernel": "naive"}).json()
    assert [r["family"] for r in only] == ["naive"]
    assert client.get("/api/runs", params={"state": "running"}).json() == []
    bad = client.get("/api/runs", params={"state": "done"})
    assert bad.status_code == 422 and "'running'" in bad.json()["detail"] and "'finished'" in bad.json()["detail"]
    assert client.get("/api/runs", params={"gpu": "nope"}).status_code == 404


def test_run_detail_counts_trials_per_state(client, database, tuned):
    run_id = tuned.run_ids[0]
    out = client.get(f"/api/runs/{run_id}").json()
    assert out["state_counts"] == database.count_trials(run_id)
    assert set(out["state_counts"]) == set(db.TRIAL_STATES)
    # the planted faults and the family's constraints show up
    assert out["n_trials"] == sum(out["state_counts"].values()) and out["n_ok"] == out["state_counts"]["ok"]
    assert out["n_ok"] < out["n_trials"]
    assert out["cublas_gflops"] == pytest.approx(CUBLAS)
    assert out["fraction_of_cublas"] == pytest.approx(out["best_gflops"] / CUBLAS)


def test_unknown_run_is_404(client):
    for path in ("/api/runs/999", "/api/runs/999/trials", "/api/runs/999/trials/export"):
        r = client.get(path)
        assert r.status_code == 404 and "999" in r.json()["detail"], path


def test_trials_paged_and_filtered(client, database, tuned):
    run_id = tuned.run_ids[0]
    every = database.trials(run_id, limit=1000)
    first = client.get(f"/api/runs/{run_id}/trials", params={"limit": 4}).json()
    second = client.get(f"/api/runs/{run_id}/trials", params={"limit": 4, "offset": 4}).json()
    assert first["total"] == len(every) and len(first["items"]) == 4
    assert [t["number"] for t in first["items"] + second["items"]] == [t.number for t in every[:8]]
    failed = [t for t in every if t.state not in ("ok", "rejected")]
    assert failed, "the planted faults should have produced failed trials"
    st = failed[0].state
    page = client.get(f"/api/runs/{run_id}/trials", params={"state": st}).json()
    assert page["total"] == sum(t.state == st for t in every)
    assert all(t["state"] == st and t["error"] for t in page["items"])


@pytest.mark.parametrize("query", [{"state": "broken"}, {"limit": 0}, {"limit": 100_000}, {"offset": -1}])
def test_bad_trial_queries_are_422(client, tuned, query):
    r = client.get(f"/api/runs/{tuned.run_ids[0]}/trials", params=query)
    assert r.status_code == 422 and list(query)[0] in r.json()["detail"]


def test_export_csv_has_every_trial_and_a_column_per_parameter(client, database, tuned):
    run_id = tuned.run_ids[1]
    r = client.get(f"/api/runs/{run_id}/trials/export", params={"format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert f"run-{run_id}-trials.csv" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    every = database.trials(run_id, limit=1000)
    assert len(rows) == len(every)
    fam = kernels.FAMILIES["blocktile2d"]
    for row, t in zip(rows, every):
        assert int(row["number"]) == t.number and row["state"] == t.state
        assert {p.name: int(row[p.name]) for p in fam.params} == t.params
        if t.state == "ok":
            assert float(row["gflops"]) == pytest.approx(t.gflops)


def test_export_json_and_state_filter(client, database, tuned):
    run_id = tuned.run_ids[1]
    out = client.get(f"/api/runs/{run_id}/trials/export", params={"format": "json", "state": "ok"}).json()
    assert [t["number"] for t in out] == [t.number for t in ok_trials(database, run_id)]
    assert all(t["fraction_of_cublas"] == pytest.approx(t["gflops"] / CUBLAS) for t in out)
    assert client.get(f"/api/runs/{run_id}/trials/export", params={"format": "xml"}).status_code == 422


def test_overview_and_family_comparison(client, database):
    cells = client.get("/api/overview").json()
    assert {(c["problem"]["m"], c["problem"]["n"], c["problem"]["k"]) for c in cells} == {SHAPE, OTHER}
    pid = next(c["problem"]["id"] for c in cells if c["problem"]["m"] == 256)
    cmp = client.get(f"/api/problems/{pid}/families", params={"gpu": STANDIN_GPU}).json()
    assert {f["family"] for f in cmp["families"]} == {"naive", "blocktile2d"}
    assert [f["gflops"] for f in cmp["families"]] == sorted((f["gflops"] for f in cmp["families"]), reverse=True)
    assert cmp["cublas_gflops"] == pytest.approx(CUBLAS)
    assert client.get("/api/problems/999/families", params={"gpu": STANDIN_GPU}).status_code == 404


def test_models_compared_on_a_problem_are_the_overview_cells_of_that_problem(client):
    cells = client.get("/api/overview").json()
    assert all(c["cublas_gflops"] == pytest.approx(CUBLAS) for c in cells)
    assert all(c["fraction_of_cublas"] == pytest.approx(c["best_gflops"] / c["cublas_gflops"]) for c in cells)
    for cell in cells:
        assert client.get(f"/api/problems/{cell['problem']['id']}/models").json() == [cell]  # one GPU model here
    missing = client.get("/api/problems/999/models")
    assert missing.status_code == 404 and "unknown problem id 999" in missing.json()["detail"]


def test_openapi_documents_every_route(client):
    spec = client.get("/openapi.json").json()
    for path in ("/api/gpus", "/api/kernels", "/api/problems", "/api/best", "/api/runs", "/api/runs/{run_id}",
                 "/api/runs/{run_id}/trials", "/api/runs/{run_id}/trials/export", "/api/problems/{problem_id}/models"):  # fmt: skip
        assert "get" in spec["paths"][path], path
    best_params = {p["name"]: p for p in spec["paths"]["/api/best"]["get"]["parameters"]}
    assert best_params["m"]["schema"]["maximum"] == MAX_DIM
    assert spec["paths"]["/api/best"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]


def test_docs_page_works_offline(client):
    page = client.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith("/") for a in assets), assets  # nothing from a CDN
    for a in assets:
        assert client.get(a).status_code == 200, a
    assert "validatorUrl" in page.text  # no badge fetched from validator.swagger.io


def test_plotly_is_served_from_the_python_package(client):
    r = client.get("/vendor/plotly.min.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert len(r.content) > 1_000_000 and b"plotly" in r.content[:2000].lower()


def test_a_run_past_its_stale_after_time_is_served_as_interrupted(tmp_path):
    """The API marks a running run whose heartbeat is older than its own stale-after time
    interrupted when it is read (its tuner died), in lists, by id and on its page."""
    with db.open_database(f"sqlite:///{tmp_path / 'stale.sqlite'}") as database:
        ids = dict(gpu_id=database.ensure_gpu(db.GpuInfo("Some GPU", "GPU-stale", "9.0", 132, 80 << 30, None, None, None, None)),
                   problem_id=database.ensure_problem(*SHAPE), family_id=database.ensure_family("naive", kernels.FAMILIES["naive"].source_hash))
        run = dict(sampler="tpe", seed=0, budget={}, host="h", command="c", study_name=None)
        # (2 s: under a loaded CI machine the app's start outlasted 0.3 s before its first read)
        dead = database.start_run(**ids, **run, stale_after_s=2.0)
        alive = database.start_run(**ids, **run)  # the default stale-after: 300 s
        with TestClient(create_app(database, api_token=""), raise_server_exceptions=False) as client:
            running = {r["id"] for r in client.get("/api/runs", params={"state": "running"}).json()}
            assert running == {dead, alive}
            time.sleep(2.2)
            assert {r["id"] for r in client.get("/api/runs", params={"state": "running"}).json()} == {alive}
            out = client.get(f"/api/runs/{dead}").json()
            assert out["state"] == "interrupted" and out["ended_at"] is not None
            assert "interrupted" in client.get(f"/runs/{dead}").text
            assert client.get(f"/api/runs/{alive}").json()["state"] == "running"
