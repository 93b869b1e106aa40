"""JSON routes under /api about results. Read-only, except that /api/best with tune=true (write token
required) queues a tuning job on a miss; the job routes are in routes_jobs.py."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated

import db
import kernels
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from gemmtune.pack import build_pack

from . import schemas as s
from .auth import require_write_token
from .bestcache import FROM_SNAPSHOT
from .reads import MAX_DIM, PAGE_MAX, Reads

# Enums (rather than plain strings) so the OpenAPI schema lists the allowed values and a bad one
# is answered with a 422 that names them all.
TrialState = StrEnum("TrialState", {v: v for v in db.TRIAL_STATES})
RunState = StrEnum("RunState", {v: v for v in db.RUN_STATES})


Precision = StrEnum("Precision", {v: v for v in kernels.PRECISIONS})
LayoutParam = StrEnum("LayoutParam", {v: v for v in kernels.LAYOUTS})
PRECISION_DOC = ("fp32 (default): every family, FFMA or FP32-accurate tensor-core emulation (tf32x3, wgmma); "
                 "ffma: only families computing with plain FP32 FFMA (kernels' Family.precision).")


FALLBACK_DOC = ("Only used when `gpu` was never seen here (without it such a GPU is a 404): answer from this GPU "
                "(name or UUID of a known one) instead, with `match: other_gpu`, `gpu` the fallback and `requested_gpu` "
                "the one asked for. A known GPU is always answered from its own results, even with none yet (`match: none`).")


class ExportFormat(StrEnum):
    csv = "csv"
    json = "json"


ERRORS = {
    404: {"model": s.ErrorOut, "description": "Unknown GPU, kernel family, run or problem (the known ones listed)."},
    422: {"model": s.ErrorOut, "description": "A parameter is missing, not an integer, or out of range."},
    503: {"model": s.ErrorOut, "description": "The results database cannot be read."},
}
WRITE_ERRORS = {
    401: {"model": s.ErrorOut, "description": "tune=true without an `Authorization: Bearer` header, or a malformed one."},
    403: {"model": s.ErrorOut, "description": "tune=true with a wrong token, or the server has no GEMMTUNE_API_TOKEN."},
}

# Names may be looked up in PostgreSQL, which refuses NUL; no real name holds control characters.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"
HASH_PATTERN = r"^[0-9a-fA-F]{64}$"
ARCH_PATTERN = r"^sm_[0-9]{2,3}a?$"
DIM_DOC = f"positive integer, at most {MAX_DIM} (1<<20)"
ID_MAX = 2**63 - 1  # SQL BIGINT; larger ids cannot exist and would overflow the driver

Gpu = Annotated[str, Query(min_length=1, max_length=200, pattern=NAME_PATTERN, description="GPU name or UUID, case-insensitive.")]
Kernel = Annotated[str | None, Query(min_length=1, max_length=100, pattern=NAME_PATTERN, description="Kernel family name.")]
Dim = Annotated[int, Query(ge=1, le=MAX_DIM, description=DIM_DOC)]
RunId = Annotated[int, Path(ge=1, le=ID_MAX, description="Run id.")]
Offset = Annotated[int, Query(ge=0, le=ID_MAX)]


async def reads(request: Request) -> Reads:
    # async: FastAPI runs a plain-def dependency in its thread pool, a hop /api/best need not pay.
    return request.app.state.reads


Db = Annotated[Reads, Depends(reads)]

router = APIRouter(prefix="/api", tags=["results"], responses=ERRORS)


@router.get("/gpus", response_model=list[s.GpuOut], summary="GPUs with recorded results")
def list_gpus(r: Db) -> list[s.GpuOut]:
    return r.gpus()


@router.get("/kernels", response_model=list[s.KernelOut], summary="Kernel families and their parameter spaces")
def list_kernels(r: Db) -> list[s.KernelOut]:
    return r.kernels()


@router.get("/problems", response_model=list[s.ProblemOut], summary="Problem shapes with recorded runs")
def list_problems(r: Db) -> list[s.ProblemOut]:
    return r.problems()


@router.get(
    "/best",
    response_model=s.BestOut,
    responses=WRITE_ERRORS,
    summary="Best verified config for a GPU and shape",
    description="The fastest verified (`ok`) config for this GPU and shape. When the shape was never tuned, "
    "the best config of the nearest tuned shape (log2 distance) on the same GPU, `match: nearest`; "
    "`match: none` when nothing was tuned on that GPU. With `tune=true` (needs the write token) a miss, i.e. any "
    "answer but `exact`, also queues a tuning job for this GPU model and shape (and `kernel`, if given), "
    "returned as `job`; an open job for the same GPU model and shape is returned instead of a new one. "
    "A GPU never seen here (no tuner or worker ran on it) is a 404 listing the known ones: it never gets another "
    "GPU's answer unless the request names one with `fallback_gpu`, and then the answer says so "
    "(`match: other_gpu`, `gpu` the fallback, `requested_gpu` the one asked for). "
    "Answered from an in-memory snapshot of the best results, refreshed within a second of new trials landing.",
)
async def best(
    r: Db, request: Request, gpu: Gpu, m: Dim, n: Dim, k: Dim, kernel: Kernel = None, nearest: bool = True,
    layout: Annotated[LayoutParam, Query(description=s.LAYOUT_DOC)] = LayoutParam.nn,
    batch: Annotated[int, Query(ge=1, le=s.MAX_BATCH, description="GEMMs of this shape in one call (a strided batch).")] = 1,
    precision: Annotated[Precision, Query(description=PRECISION_DOC)] = Precision.fp32,
    source_hash: Annotated[list[Annotated[str, Query(pattern=HASH_PATTERN)]] | None, Query(
        max_length=100, description="Only results of these family versions (sha256 of the family's CUDA source, "
        "repeatable): gemmtune.matmul sends the versions it has installed.")] = None,
    fallback_gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN, description=FALLBACK_DOC)] = None,
    arch: Annotated[str | None, Query(pattern=ARCH_PATTERN, description=(
        "Only configs this server's families accept on this architecture (e.g. sm_90; "
        "gemmtune.matmul sends its device's): the best runnable one, not a faster stored config "
        "that a narrowed parameter space now refuses."))] = None,
    tune: Annotated[bool, Query(description="On a miss, queue a tuning job (needs the write token).")] = False,
    authorization: Annotated[str | None, Header(description="`Bearer <GEMMTUNE_API_TOKEN>`, for tune=true")] = None,
) -> s.BestOut:
    if tune:
        require_write_token(request, authorization)
    cache = request.app.state.best_cache
    snap = await run_in_threadpool(cache.refresh) if cache.due() else cache.snapshot
    # From memory on the event loop; a GPU or family the snapshot does not know goes to the database.
    hashes = None if source_hash is None else [h.lower() for h in source_hash]
    asked = gpu
    if fallback_gpu is not None and not (snap is not None and snap.gpu_ids(gpu)) \
            and not await run_in_threadpool(r.db.find_gpus, gpu):
        gpu = fallback_gpu  # never seen: answer from the GPU the caller named, and say so below
    found = r.best_from(snap, gpu, m, n, k, kernel, nearest, precision.value, hashes, layout.value, batch, arch)
    if found is None:
        found = await run_in_threadpool(r.best, gpu, m, n, k, kernel, nearest, precision.value, hashes, layout.value,
                                        batch, arch)
    elif fallback_gpu is None:
        request.scope[FROM_SNAPSHOT] = True  # the same query may be answered with these bytes (BestResponses)
    if gpu is not asked:
        found.requested_gpu = asked
        if found.match != "none":
            found.match = "other_gpu"
    if tune and found.match != "exact":
        families = [found.kernel] if found.kernel else None
        if families is None and precision is not Precision.fp32:
            families = r.precision_families(precision.value)
        found.job, _ = await run_in_threadpool(
            lambda: request.app.state.jobs.enqueue(asked, m, n, k, families=families, budget={}, origin="best",
                                                   layout=layout.value, batch=batch))
    return found


@router.get("/workloads", response_model=list[s.WorkloadOut], summary="Recorded workloads, newest first")
def list_workloads(r: Db, gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN,
                   description="GPU model the tuned results are for (default: where each was recorded).")] = None
                   ) -> list[s.WorkloadOut]:
    return r.workloads(gpu)


@router.get("/workloads/{workload_id}", response_model=s.WorkloadOut,
            summary="A recorded workload against what is tuned: the share of its GEMM time tuned kernels serve")
def get_workload(r: Db, workload_id: Annotated[int, Path(ge=1, le=ID_MAX)],
                 gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN,
                 description="GPU model the tuned results are for (default: where it was recorded).")] = None
                 ) -> s.WorkloadOut:
    return r.workload(workload_id, gpu)


@router.get("/overview", response_model=list[s.OverviewCellOut], summary="Best per GPU and problem")
def overview(r: Db, precision: Annotated[Precision, Query(description=PRECISION_DOC)] = Precision.fp32
             ) -> list[s.OverviewCellOut]:
    return r.overview(precision.value)


@router.get(
    "/pack",
    summary="A pack: the best configs per GPU model, shape and arithmetic class, with provenance",
    description="The JSON file `python -m gemmtune export-pack` writes (format in gemmtune/pack.py), built from "
    "the results of the family versions this server has installed; `gemmtune.matmul(source='pack.json')` reads it "
    "with no database.",
    responses={200: {"content": {"application/json": {}}, "description": "The pack."}},
)
def pack(
    r: Db,
    gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN,
                                     description="Only this GPU model (name or UUID).")] = None,
    precision: Annotated[Precision, Query(description=PRECISION_DOC)] = Precision.fp32,
) -> dict:
    if gpu is not None:
        r.resolve_gpu(gpu)
    return build_pack(r.db, gpus=None if gpu is None else [gpu], precision=precision.value)


@router.get(
    "/problems/{problem_id}/families",
    response_model=s.FamilyComparison,
    summary="Families compared on one problem and GPU, with the cuBLAS baseline",
)
def compare_families(
    r: Db, gpu: Gpu, problem_id: Annotated[int, Path(ge=1, le=ID_MAX)]
) -> s.FamilyComparison:
    return r.compare_families(problem_id, gpu)


@router.get(
    "/problems/{problem_id}/models",
    response_model=list[s.OverviewCellOut],
    summary="GPU models compared on one problem: each model's best (any family) with its own cuBLAS, fastest first",
)
def compare_models(r: Db, problem_id: Annotated[int, Path(ge=1, le=ID_MAX)]) -> list[s.OverviewCellOut]:
    return r.compare_models(problem_id)


@router.get("/runs", response_model=list[s.RunOut], summary="Tuning runs, newest first")
def list_runs(
    r: Db,
    gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)] = None,
    kernel: Kernel = None,
    state: RunState | None = None,
    problem_id: Annotated[int | None, Query(ge=1, le=ID_MAX)] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
) -> list[s.RunOut]:
    return r.runs(
        gpu=gpu, kernel=kernel, state=state.value if state else None, problem_id=problem_id, offset=offset, limit=limit
    )


@router.get("/runs/{run_id}", response_model=s.RunOut, summary="One run, with trial counts per state")
def get_run(r: Db, run_id: RunId) -> s.RunOut:
    return r.run(run_id)


@router.get("/runs/{run_id}/trials", response_model=s.TrialPage, summary="A run's trials, paged, in trial order")
def run_trials(
    r: Db,
    run_id: RunId,
    state: TrialState | None = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
) -> s.TrialPage:
    return r.trial_page(run_id, state.value if state else None, offset, limit)


@router.get(
    "/runs/{run_id}/trials/export",
    summary="All of a run's trials as a CSV or JSON file",
    responses={200: {"content": {"text/csv": {}, "application/json": {}}}},
)
def export_trials(
    r: Db, run_id: RunId, format: ExportFormat = ExportFormat.csv, state: TrialState | None = None
) -> StreamingResponse:
    r.get_run(run_id)  # a 404 now, before the streamed 200 starts
    rows = r.all_trials(run_id, state.value if state else None)
    name = f"run-{run_id}-trials.{format.value}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    if format is ExportFormat.json:
        return StreamingResponse(_json_lines(rows), media_type="application/json", headers=headers)
    param_names = r.param_names(run_id)
    return StreamingResponse(_csv_rows(rows, param_names), media_type="text/csv", headers=headers)


CSV_FIELDS = [f for f in s.TrialOut.model_fields if f != "params"]


def _csv_rows(trials: Iterator[s.TrialOut], param_names: list[str]) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_FIELDS + param_names)
    for t in trials:
        row = t.model_dump(mode="json")
        writer.writerow([row[f] for f in CSV_FIELDS] + [t.params.get(p) for p in param_names])
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    yield buf.getvalue()


def _json_lines(trials: Iterator[s.TrialOut]) -> Iterator[str]:
    """A JSON array, written one trial at a time."""
    yield "["
    for i, t in enumerate(trials):
        yield ("," if i else "") + json.dumps(t.model_dump(mode="json"))
    yield "]"
