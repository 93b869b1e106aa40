"""Plain frozen dataclasses: what callers hand to the database and what they get back.

Callers never see ORM objects, so nothing they hold is tied to a session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kernels.layout import problem_label, shape_text

from .errors import InvalidInputError, bad_value
from .states import TRIAL_STATES

# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as the tuner sees it; stored once per UUID."""

    name: str
    uuid: str
    compute_capability: str  # "9.0"
    sm_count: int
    memory_bytes: int
    max_sm_clock_mhz: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    nvrtc_version: str | None = None

    def __post_init__(self) -> None:
        for what in ("name", "uuid", "compute_capability"):
            value = getattr(self, what)
            if not isinstance(value, str) or not value.strip():
                raise bad_value(f"GPU {what}", value, "a non-empty string")
        for what in ("sm_count", "memory_bytes"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise bad_value(f"GPU {what}", value, "a positive int")


def _check_optional_number(name: str, value: float | None, *, positive: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_value(name, value, "a finite number or None")
    if value < 0 or (positive and value == 0):
        raise bad_value(name, value, "a positive number or None" if positive else ">= 0 or None")


# ---------------------------------------------------------------- a trial's result


@dataclass(frozen=True)
class ResultField:
    """One field of what a measured trial reports: name, type as stored, unit, meaning."""

    name: str
    type: type
    unit: str
    meaning: str


# The one definition of a trial's result, in this order. TrialRecord and Trial carry these
# fields; the tuner's Measurement and recording format and the API's TrialOut are held against
# this table by tests/test_trial_result.py. "state" is always set, every other field may be None.
TRIAL_RESULT: tuple[ResultField, ...] = (
    ResultField("state", str, "", "one of TRIAL_STATES"),
    ResultField("error", str, "", "why the trial is not ok (compiler log, exception text, ...)"),
    ResultField("compile_seconds", float, "s", "NVRTC compile wall time"),
    ResultField("registers", int, "per thread", "registers of the main kernel (ptxas)"),
    ResultField("shared_bytes", int, "bytes per block", "shared memory, static + dynamic"),
    ResultField("spill_bytes", int, "bytes per thread", "spill stores + loads (ptxas)"),
    ResultField("occupancy", float, "fraction, 0..1", "theoretical occupancy of the main kernel"),
    ResultField("time_min_ms", float, "ms", "fastest timed launch"),
    ResultField("time_median_ms", float, "ms", "median timed launch (the objective)"),
    ResultField("time_max_ms", float, "ms", "slowest timed launch"),
    ResultField("launches", int, "count", "timed launches"),
    ResultField("gflops", float, "GFLOP/s", "2·m·n·k over the median time"),
    ResultField("sm_clock_mhz", int, "MHz", "SM clock during timing"),
)


@dataclass(frozen=True)
class TrialRecord:
    """One evaluated config, as the tuner reports it to `Database.add_trial`: number and
    params, then the fields of TRIAL_RESULT, then when it started."""

    number: int  # order within the run, from 0; unique per run
    params: dict[str, int]
    state: str  # one of TRIAL_STATES
    error: str | None = None
    compile_seconds: float | None = None
    registers: int | None = None
    shared_bytes: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None  # theoretical, 0..1
    time_min_ms: float | None = None
    time_median_ms: float | None = None
    time_max_ms: float | None = None
    launches: int | None = None  # number of timed launches
    gflops: float | None = None
    sm_clock_mhz: int | None = None  # during timing
    started_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.state not in TRIAL_STATES:
            raise bad_value("trial state", self.state, TRIAL_STATES)
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 0:
            raise bad_value("trial number", self.number, "an int >= 0")
        if not isinstance(self.params, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in self.params.items()
        ):
            raise bad_value("trial params", self.params, "a dict of str → int")
        for name in ("compile_seconds", "registers", "shared_bytes", "spill_bytes",
                     "time_min_ms", "launches", "sm_clock_mhz"):
            _check_optional_number(name, getattr(self, name))
        for name in ("time_median_ms", "time_max_ms", "gflops"):
            _check_optional_number(name, getattr(self, name), positive=True)
        if self.occupancy is not None:
            _check_optional_number("occupancy", self.occupancy)
            if self.occupancy > 1:
                raise bad_value("occupancy", self.occupancy, "a fraction in 0..1 or None")
        if self.state == "ok" and (self.time_median_ms is None or self.gflops is None):
            raise InvalidInputError(
                f"trial {self.number} has state 'ok' but time_median_ms={self.time_median_ms!r}, "
                f"gflops={self.gflops!r}; an ok trial needs both (use another state otherwise)"
            )


# ---------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Gpu:
    id: int
    name: str
    uuid: str
    compute_capability: str
    sm_count: int
    memory_bytes: int
    max_sm_clock_mhz: int | None
    driver_version: str | None
    cuda_version: str | None
    nvrtc_version: str | None
    first_seen: datetime


@dataclass(frozen=True)
class Problem:
    id: int
    m: int
    n: int
    k: int
    dtype: str
    layout: str  # how A and B are stored: "nn", "nt", "tn", "tt" (kernels/layout.py)
    general_alpha_beta: bool
    batch: int = 1  # GEMMs of this shape in one call (a strided batch)

    @property
    def shape(self) -> str:
        """``MxNxK``, or ``BxMxNxK`` for a batch."""
        return shape_text(self.m, self.n, self.k, self.batch)

    @property
    def label(self) -> str:
        """The shape and, unless "nn", the layout: ``4096x3072x1024:nt``."""
        return problem_label(self.m, self.n, self.k, self.layout, self.batch)


@dataclass(frozen=True)
class FamilyVersion:
    """A kernel family at one version of its CUDA source."""

    id: int
    name: str
    source_hash: str
    first_seen: datetime


@dataclass(frozen=True)
class Run:
    id: int
    gpu_id: int
    gpu_name: str
    gpu_uuid: str
    problem: Problem
    family_id: int
    family: str
    source_hash: str
    sampler: str
    seed: int | None
    budget: dict[str, Any]
    host: str
    command: str
    study_name: str | None
    state: str
    started_at: datetime
    ended_at: datetime | None
    n_trials: int
    n_ok: int
    best_gflops: float | None
    heartbeat_at: datetime | None = None  # the tuner's last sign of life
    stale_after_s: float | None = None  # heartbeat age after which it is dead (None: the default)


@dataclass(frozen=True)
class Trial:
    id: int
    run_id: int
    number: int
    params: dict[str, int]
    state: str
    error: str | None
    compile_seconds: float | None
    registers: int | None
    shared_bytes: int | None
    spill_bytes: int | None
    occupancy: float | None
    time_min_ms: float | None
    time_median_ms: float | None
    time_max_ms: float | None
    launches: int | None
    gflops: float | None
    sm_clock_mhz: int | None
    started_at: datetime | None
    recorded_at: datetime
    timings: int = 1  # the figure is the median of this many timings (Database.retime_trial)


@dataclass(frozen=True)
class MeasuredConfig:
    """One measured config with where it ran: what a learned cost model trains on."""

    gpu_name: str
    compute_capability: str
    sm_count: int
    family: str
    params: dict[str, int]
    m: int
    n: int
    k: int
    state: str
    gflops: float | None


@dataclass(frozen=True)
class Baseline:
    id: int
    gpu_id: int
    problem_id: int
    run_id: int | None
    library: str
    time_median_ms: float
    gflops: float
    sm_clock_mhz: int | None
    measured_at: datetime


@dataclass(frozen=True)
class BestResult:
    """A verified trial offered as the answer for a (GPU, problem)."""

    match: Literal["exact", "nearest"]
    distance: float  # 0.0 for an exact match; see Database.nearest_problems
    requested: tuple[int, int, int]
    problem: Problem  # the tuned shape the result came from
    gpu_id: int
    gpu_name: str
    gpu_uuid: str
    family: str
    source_hash: str
    run_id: int
    trial_id: int
    trial_number: int
    params: dict[str, int]
    gflops: float
    time_median_ms: float
    occupancy: float | None
    registers: int | None
    shared_bytes: int | None
    spill_bytes: int | None
    baseline_gflops: float | None
    fraction_of_cublas: float | None
    timings: int = 1  # gflops is the median of this many timings (Database.retime_trial)


@dataclass(frozen=True)
class NearestProblem:
    problem: Problem
    distance: float
    best_gflops: float
    n_ok: int


@dataclass(frozen=True)
class OverviewCell:
    gpu_name: str
    problem: Problem
    best_gflops: float
    fraction_of_cublas: float | None
    family: str
    source_hash: str
    gpu_uuid: str
    run_id: int
    trial_id: int
    baseline_gflops: float | None = None  # the cuBLAS GFLOP/s fraction_of_cublas divides by


__all__ = [
    "ResultField", "TRIAL_RESULT",
    "GpuInfo", "TrialRecord", "Gpu", "Problem", "FamilyVersion", "Run", "Trial", "Baseline",
    "BestResult", "NearestProblem", "OverviewCell",
]
