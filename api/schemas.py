"""Pydantic response models: the JSON shapes the API promises (and documents in /openapi.json)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


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
    layout: str
    general_alpha_beta: bool


class BestConfig(BaseModel):
    family: str
    source_hash: str | None = None
    config: dict[str, int] = Field(description="Parameter name to value.")
    gflops: float
    time_median_ms: float | None = None
    cublas_gflops: float | None = Field(default=None, description="cuBLAS on the same GPU and shape, if measured.")
    fraction_of_cublas: float | None = Field(default=None, description="gflops / cublas_gflops.")
    occupancy: float | None = Field(default=None, description="Theoretical occupancy, 0..1.")
    registers: int | None = Field(default=None, description="Registers per thread (ptxas).")
    run_id: int
    trial_number: int
    problem: ProblemOut = Field(description="The shape this config was measured on.")


class BestOut(BaseModel):
    match: Literal["exact", "nearest", "none"] = Field(
        description="exact: measured on this shape; nearest: the closest measured shape on this GPU; none: nothing measured."
    )
    gpu: str = Field(description="The GPU's name as stored.")
    requested: Shape
    shape: Shape | None = Field(default=None, description="The shape the result was measured on.")
    distance: float | None = Field(
        default=None, description="Log2-space distance from the requested shape (0 for exact)."
    )
    kernel: str | None = Field(default=None, description="The family filter, if one was given.")
    best: BestConfig | None = None


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
    family: str
    run_id: int


class FamilyComparison(BaseModel):
    gpu: str
    problem: ProblemOut
    cublas_gflops: float | None = None
    families: list[BestConfig] = Field(description="Each family's best on this problem and GPU, best first.")
    runs: list[RunOut]
