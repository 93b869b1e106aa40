"""Tuning jobs: POST /api/jobs (write token), GET /api/jobs[/{id}], and the /jobs dashboard page."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import db
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from . import schemas as s
from .auth import require_write_token
from .jobs import JobQueue
from .reads import PAGE_MAX
from .routes_api import ID_MAX, NAME_PATTERN, Offset
from .routes_pages import render

JobState = StrEnum("JobState", {v: v for v in db.JOB_STATES})
RECENT_JOBS = 200


def job_queue(request: Request) -> JobQueue:
    return request.app.state.jobs


Jobs = Annotated[JobQueue, Depends(job_queue)]
JobId = Annotated[int, Path(ge=1, le=ID_MAX, description="Job id.")]

ERRORS = {
    400: {"model": s.ErrorOut, "description": "A request body that cannot be parsed (e.g. not UTF-8)."},
    401: {"model": s.ErrorOut, "description": "No or malformed `Authorization: Bearer` header."},
    403: {"model": s.ErrorOut, "description": "Wrong token, or the server has no GEMMTUNE_API_TOKEN (read-only)."},
    404: {"model": s.ErrorOut, "description": "Unknown job id or GPU."},
    422: {"model": s.ErrorOut, "description": "Unknown GPU model or kernel family, size or budget out of range, "
          "malformed JSON."},
    503: {"model": s.ErrorOut, "description": "The results database cannot be read."},
}
router = APIRouter(prefix="/api", tags=["jobs"], responses=ERRORS)
pages = APIRouter(include_in_schema=False)


@router.post(
    "/jobs",
    response_model=s.JobOut,
    status_code=201,
    dependencies=[Depends(require_write_token)],
    summary="Queue a tuning job for a GPU model and shape",
    description="A `python -m tuner --worker` on a GPU of that model takes it. 201 with the new job; 200 with the "
    "open (queued or running) job when this GPU model and shape already have one. The GPU must be one the database "
    "knows (a worker registers its GPU when it starts).",
    responses={200: {"model": s.JobOut, "description": "The open job for this GPU model and shape (nothing new queued)."}},
)
def create_job(jobs: Jobs, body: s.JobIn) -> JSONResponse:
    job, created = jobs.enqueue(
        body.gpu, body.m, body.n, body.k, families=body.families,
        budget=body.budget.model_dump(exclude_none=True), origin="request", layout=body.layout, batch=body.batch,
    )  # fmt: skip
    return JSONResponse(job.model_dump(mode="json"), status_code=201 if created else 200,
                        headers={"Location": f"/api/jobs/{job.id}"})  # fmt: skip


@router.get("/jobs", response_model=list[s.JobOut], summary="Tuning jobs, newest first")
def list_jobs(
    jobs: Jobs,
    state: JobState | None = None,
    gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
) -> list[s.JobOut]:
    return jobs.list(state=state.value if state else None, gpu=gpu, offset=offset, limit=limit)


@router.get("/jobs/{job_id}", response_model=s.JobOut, summary="One tuning job")
def get_job(jobs: Jobs, job_id: JobId) -> s.JobOut:
    return jobs.get(job_id)


@pages.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, jobs: Jobs, state: JobState | None = None) -> HTMLResponse:
    found = jobs.list(state=state.value if state else None, gpu=None, offset=0, limit=RECENT_JOBS)
    counts = jobs.counts()
    return render(
        request, "jobs.html", jobs=found, counts=counts, state=state.value if state else None,
        states=list(db.JOB_STATES), open_jobs=counts["queued"] + counts["running"],
    )  # fmt: skip
