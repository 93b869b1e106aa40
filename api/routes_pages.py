"""Dashboard pages: server-rendered HTML; the plots are drawn in the browser from the JSON API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from .assets import TEMPLATE_DIR
from .reads import Reads
from .routes_api import ID_MAX, NAME_PATTERN, Precision

templates = Jinja2Templates(directory=TEMPLATE_DIR)
router = APIRouter(include_in_schema=False)
RECENT_RUNS = 50


def fmt_gflops(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def fmt_fraction(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def fmt_time(v: datetime | None) -> str:
    return "–" if v is None else v.strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "–"
    secs = int((end - start).total_seconds())
    h, rest = divmod(secs, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def shape(p) -> str:
    """M×N×K, then the layout where it is not nn and the batch count where it is above 1."""
    text = f"{p.m}×{p.n}×{p.k}"
    layout, batch = getattr(p, "layout", "nn"), getattr(p, "batch", 1)
    if layout != "nn":
        text += f" {layout}"
    return text + (f" ×{batch}" if batch > 1 else "")


templates.env.filters.update(gflops=fmt_gflops, fraction=fmt_fraction, time=fmt_time, shape=shape)
templates.env.globals.update(duration=fmt_duration)


def render(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def _reads(request: Request) -> Reads:
    return request.app.state.reads


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, precision: Precision = Precision.fp32) -> HTMLResponse:
    r = _reads(request)
    cells = r.overview(precision.value)
    gpus = sorted({c.gpu for c in cells})
    problems = sorted({c.problem.id: c.problem for c in cells}.values(), key=lambda p: (p.m, p.n, p.k))
    grid = {(c.gpu, c.problem.id): c for c in cells}
    runs = r.runs(gpu=None, kernel=None, state=None, problem_id=None, offset=0, limit=RECENT_RUNS)
    return render(
        request, "overview.html", gpus=gpus, problems=problems, grid=grid, runs=runs,
        run_states=[{"id": run.id, "state": run.state, "n_trials": run.n_trials} for run in runs], n_gpus=len(r.gpus()), n_problems=len(r.problems()),
        precision=precision.value,
    )  # fmt: skip


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: Annotated[int, Path(ge=1, le=ID_MAX)]) -> HTMLResponse:
    r = _reads(request)
    run = r.run(run_id)
    return render(
        request, "run.html", run=run, top=r.top_configs(run_id, limit=10), failures=r.failures(run_id),
        param_names=r.param_names(run_id),
    )  # fmt: skip


@router.get("/problems/{problem_id}", response_class=HTMLResponse)
def problem_page(
    request: Request,
    problem_id: Annotated[int, Path(ge=1, le=ID_MAX)],
    gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)] = None,
) -> HTMLResponse:
    r = _reads(request)
    problem = r.problem(problem_id)
    gpus_with_runs = sorted({run.gpu for run in r.runs(gpu=None, kernel=None, state=None, problem_id=problem_id,
                                                       offset=0, limit=1000)})  # fmt: skip
    models = r.compare_models(problem_id)  # side by side in a table, and overlaid in a chart
    if gpu is None:
        if len(gpus_with_runs) != 1:
            return render(request, "problem_pick_gpu.html", problem=problem, gpus=gpus_with_runs, models=models)
        gpu = gpus_with_runs[0]
    comparison = r.compare_families(problem_id, gpu)
    return render(
        request, "problem.html", problem=problem, cmp=comparison, cmp_json=comparison.model_dump(mode="json"),
        gpus=gpus_with_runs, models=models,
    )  # fmt: skip


@router.get("/workloads", response_class=HTMLResponse)
def workloads_page(
    request: Request,
    gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)] = None,
) -> HTMLResponse:
    return render(request, "workloads.html", workloads=_reads(request).workloads(gpu), gpu=gpu)


@router.get("/workloads/{workload_id}", response_class=HTMLResponse)
def workload_page(
    request: Request,
    workload_id: Annotated[int, Path(ge=1, le=ID_MAX)],
    gpu: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)] = None,
) -> HTMLResponse:
    r = _reads(request)
    w = r.workload(workload_id, gpu)
    api_url = f"/api/workloads/{workload_id}" + (f"?gpu={quote(w.gpu)}" if w.gpu else "")
    return render(request, "workload.html", w=w, w_json=w.model_dump(mode="json"), api_url=api_url,
                  gpus=sorted({g.name for g in r.db.list_gpus()}))
