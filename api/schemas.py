"""Pydantic response models: the JSON shapes the API promises (and documents in /openapi.json)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from db import DEFAULT_STALE_AFTER_S, JOB_BUDGET_LIMITS
from kernels.layout import LAYOUTS, MAX_BATCH_GRID
from pydantic import BaseModel, ConfigDict, Field


LAYOUT_DOC = ("How A and B are stored: nn (A·B), nt (A·Bᵀ, e.g. x @ W.T in nn.Linear), tn (Aᵀ·B), tt (Aᵀ·Bᵀ); "
              "A's letter then B's, t for an operand stored transposed (column-major).")
Layout = Literal[tuple(LAYOUTS)]  # type: ignore[valid-type]
MAX_BATCH = MAX_BATCH_GRID

class ErrorOut(BaseModel):
    detail: str = Field(description="What was wrong with the request, in words.")
    allowed: list[str] | None = Field(default=None, description="The accepted values, where there is a short list.")


class GpuOut(BaseModel):
    id: int
    name: str
    uuid: str
    compute_capability: str
    sm_count: int | None = None
    memory_bytes: int | None = None
    max_sm_clock_mhz: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    nvrtc_version: str | None = None


class ParamOut(BaseModel):
    name: str
    values: list[int]
    doc: str


class KernelOut(BaseModel):
    name: str
    rung: int
    description: str
    source_hash: str
    params: list[ParamOut]
    space_size: int = Field(description="Number of points in the unconstrained parameter grid.")


class Shape(BaseModel):
    m: int
    n: int
    k: int


class ProblemOut(BaseModel):
    id: int
    m: int
    n: int
    k: int
    dtype: str
    layout: str = Field(description=LAYOUT_DOC)
    general_alpha_beta: bool
    batch: int = Field(default=1, description="GEMMs of this shape in one call (a strided batch); 1: a single GEMM.")
    label: str = Field(description="The shape as the tuner's --shape takes it: [Bx]MxNxK[:layout].")


TIMINGS_DOC = ("gflops and the times are the median of this many timings of the config (a shape's fastest "
               "configs are timed again in shuffled rounds at the end of its tuning); 1: one timing.")


class BestConfig(BaseModel):
    family: str
    source_hash: str | None = None
    config: dict[str, int] = Field(description="Parameter name to value.")
    gflops: float
    time_median_ms: float | None = None
    timings: int = Field(default=1, description=TIMINGS_DOC)
    cublas_gflops: float | None = Field(default=None, description="cuBLAS on the same GPU and shape, if measured.")
    fraction_of_cublas: float | None = Field(default=None, description="gflops / cublas_gflops.")
    occupancy: float | None = Field(default=None, description="Theoretical occupancy, 0..1.")
    registers: int | None = Field(default=None, description="Registers per thread (ptxas).")
    run_id: int
    trial_number: int
    trial_id: int | None = Field(default=None, description="The trial's id in the results database.")
    problem: ProblemOut = Field(description="The shape this config was measured on.")


class BestOut(BaseModel):
    match: Literal["exact", "nearest", "other_gpu", "none"] = Field(
        description="exact: measured on this shape; nearest: the closest measured shape on this GPU; other_gpu: the "
        "requested GPU was never seen and the answer comes from `fallback_gpu` (exact or nearest shape there, see "
        "`distance`); none: nothing measured."
    )
    gpu: str = Field(description="The GPU's name as stored: the GPU the answer comes from.")
    requested_gpu: str | None = Field(
        default=None, description="With match other_gpu (or none from a fallback): the GPU asked for, never seen here."
    )
    requested: Shape
    layout: str = Field(default="nn", description=LAYOUT_DOC)
    batch: int = Field(default=1, description="The batch count asked for (and, with nearest, of the shape measured: see `shape_batch`).")
    shape: Shape | None = Field(default=None, description="The shape the result was measured on.")
    shape_batch: int | None = Field(default=None, description="The batch count of the problem the result was measured on.")
    distance: float | None = Field(
        default=None, description="Log2-space distance from the requested shape (0 for exact)."
    )
    kernel: str | None = Field(default=None, description="The family filter, if one was given.")
    best: BestConfig | None = None
    job: JobOut | None = Field(
        default=None, description="With tune=true and no exact match: the tuning job queued for this shape (or already open)."
    )


class RunOut(BaseModel):
    id: int
    state: str = Field(description="running, finished, interrupted or failed.")
    gpu: str
    gpu_uuid: str
    family: str
    source_hash: str
    problem: ProblemOut
    sampler: str | None = None
    seed: int | None = None
    budget: dict = Field(default_factory=dict)
    host: str | None = None
    command: str | None = None
    study_name: str | None = None
    started_at: datetime
    ended_at: datetime | None = None
    heartbeat_at: datetime | None = Field(default=None, description="The tuner's last sign of life.")
    stale_after_s: float | None = Field(
        default=None, description="Seconds without a heartbeat after which the run is interrupted "
        f"(its tuner died); null: the default, {DEFAULT_STALE_AFTER_S:g}.")
    n_trials: int
    n_ok: int
    state_counts: dict[str, int] | None = Field(default=None, description="Trials per trial state (run detail only).")
    best_gflops: float | None = None
    cublas_gflops: float | None = None
    fraction_of_cublas: float | None = None


class TrialOut(BaseModel):
    number: int
    params: dict[str, int]
    state: str
    error: str | None = None
    compile_seconds: float | None = None
    registers: int | None = None
    shared_bytes: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None
    time_min_ms: float | None = None
    time_median_ms: float | None = None
    time_max_ms: float | None = None
    launches: int | None = None
    gflops: float | None = None
    sm_clock_mhz: int | None = None
    timings: int = Field(default=1, description=TIMINGS_DOC)
    fraction_of_cublas: float | None = None
    started_at: datetime | None = None
    recorded_at: datetime | None = None


class TrialPage(BaseModel):
    run_id: int
    state: str | None = Field(default=None, description="The state filter, if one was given.")
    total: int = Field(description="Trials matching the filter, over all pages.")
    offset: int
    limit: int
    items: list[TrialOut]


class OverviewCellOut(BaseModel):
    gpu: str
    problem: ProblemOut
    best_gflops: float
    fraction_of_cublas: float | None = None
    cublas_gflops: float | None = Field(None, description="The latest cuBLAS baseline on the winning trial's board.")
    family: str
    run_id: int


class FamilyComparison(BaseModel):
    gpu: str
    problem: ProblemOut
    cublas_gflops: float | None = None
    families: list[BestConfig] = Field(description="Each family's best on this problem and GPU, best first.")
    runs: list[RunOut]


# --- tuning jobs ---------------------------------------------------------------------------------


_LIMITS = JOB_BUDGET_LIMITS
JOB_MAX_DIM = 1 << 20  # the same bound as /api/best's sizes (reads.MAX_DIM)


class JobBudgetIn(BaseModel):
    """A field left out: the worker's default (its --trials, --patience; 780 s)."""

    model_config = ConfigDict(extra="forbid")
    trials: int | None = Field(default=None, ge=_LIMITS["trials"][0], le=_LIMITS["trials"][1],
                               description="Measured configs per study (tuner --trials).")
    patience: int | None = Field(default=None, ge=_LIMITS["patience"][0], le=_LIMITS["patience"][1],
                                 description="Stop a study after this many measured configs without a new best; 0: never.")
    total_seconds: float | None = Field(default=None, ge=_LIMITS["total_seconds"][0], le=_LIMITS["total_seconds"][1],
                                        allow_inf_nan=False, description="Wall time the job's studies share.")


class JobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
                     description="A GPU model (name, any case) or a board's UUID, among the GPUs the database knows.")
    m: int = Field(ge=1, le=JOB_MAX_DIM)
    n: int = Field(ge=1, le=JOB_MAX_DIM)
    k: int = Field(ge=1, le=JOB_MAX_DIM)
    layout: Layout = Field(default="nn", description=LAYOUT_DOC)
    batch: int = Field(default=1, ge=1, le=MAX_BATCH, description="GEMMs of this shape in one call (a strided batch).")
    families: list[str] | None = Field(default=None, max_length=50,
                                       description="Kernel families to tune; left out or []: the worker's default (all).")
    budget: JobBudgetIn = Field(default_factory=JobBudgetIn)


class JobOut(BaseModel):
    id: int
    state: str = Field(description="queued, running, done or failed.")
    gpu: str = Field(description="The GPU model, as stored.")
    m: int
    n: int
    k: int
    dtype: str
    layout: str
    general_alpha_beta: bool
    batch: int = 1
    families: list[str] = Field(description="[]: the worker's default families.")
    budget: dict = Field(description="trials / patience / total_seconds; a missing key: the worker's default.")
    origin: str = Field(description="request (POST /api/jobs) or best (a miss on /api/best with tune=true).")
    reason: str | None = Field(default=None, description="Why it failed, or what it found.")
    worker: str | None = Field(default=None, description="The worker that holds (or last held) it.")
    attempts: int = Field(description="How many times a worker claimed it.")
    run_ids: list[int] = Field(description="The tuning runs it made (set when it ends).")
    created_at: datetime
    claimed_at: datetime | None = None
    heartbeat_at: datetime | None = None
    ended_at: datetime | None = None


class WorkloadTuningOut(BaseModel):
    runs: int = Field(description="Tuning runs of this problem on `gpu`, every family.")
    running: int = Field(description="Of those, the runs running now.")
    measured: int = Field(description="Trials measured over those runs.")
    latest_run: int | None = Field(default=None, description="The newest run's id.")


class WorkloadProblemOut(BaseModel):
    m: int
    n: int
    k: int
    layout: str
    batch: int
    label: str
    count: int = Field(description="Calls recorded.")
    share: float = Field(description="Share of the workload's GEMM time, 0..1.")
    best: BestConfig | None = Field(default=None, description="The best verified config tuned on exactly this problem "
                                    "on `gpu`, if any.")
    served: bool = Field(description="A tuned kernel beats cuBLAS on this problem on `gpu` (what gemmtune.enable() runs).")
    tuning: WorkloadTuningOut = Field(description="How far tuning this problem on `gpu` has come.")


class WorkloadOut(BaseModel):
    id: int
    name: str
    recorded_on: str | None = Field(default=None, description="The GPU the workload was recorded on.")
    gpu: str | None = Field(default=None, description="The GPU model the tuned results below are for.")
    gemm_ms: float | None = Field(default=None, description="The workload's GEMM time as recorded.")
    created_at: datetime
    served_share: float = Field(description="Share of the workload's GEMM time that tuned kernels serve on `gpu`.")
    running: bool = Field(default=False, description="A run of one of its problems is running on `gpu` now.")
    problems: list[WorkloadProblemOut] = Field(description="Largest share first.")
