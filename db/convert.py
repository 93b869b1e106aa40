"""ORM rows → the plain dataclasses callers receive."""

from __future__ import annotations

from .models import BaselineRow, FamilyRow, GpuRow, ProblemRow, TrialRow
from .records import Baseline, FamilyVersion, Gpu, Problem, Trial


def gpu(row: GpuRow) -> Gpu:
    return Gpu(
        id=row.id, name=row.name, uuid=row.uuid, compute_capability=row.compute_capability,
        sm_count=row.sm_count, memory_bytes=row.memory_bytes,
        max_sm_clock_mhz=row.max_sm_clock_mhz, driver_version=row.driver_version,
        cuda_version=row.cuda_version, nvrtc_version=row.nvrtc_version,
        first_seen=row.first_seen,
    )


def problem(row: ProblemRow) -> Problem:
    return Problem(
        id=row.id, m=row.m, n=row.n, k=row.k, dtype=row.dtype, layout=row.layout,
        general_alpha_beta=bool(row.general_alpha_beta), batch=row.batch,
    )


def family(row: FamilyRow) -> FamilyVersion:
    return FamilyVersion(id=row.id, name=row.name, source_hash=row.source_hash,
                         first_seen=row.first_seen)


def trial(row: TrialRow) -> Trial:
    return Trial(
        id=row.id, run_id=row.run_id, number=row.number, params=dict(row.params),
        state=row.state, error=row.error, compile_seconds=row.compile_seconds,
        registers=row.registers, shared_bytes=row.shared_bytes, spill_bytes=row.spill_bytes,
        occupancy=row.occupancy, time_min_ms=row.time_min_ms,
        time_median_ms=row.time_median_ms, time_max_ms=row.time_max_ms,
        launches=row.launches, gflops=row.gflops, sm_clock_mhz=row.sm_clock_mhz,
        started_at=row.started_at, recorded_at=row.recorded_at, timings=row.timings or 1,
    )


def baseline(row: BaselineRow) -> Baseline:
    return Baseline(
        id=row.id, gpu_id=row.gpu_id, problem_id=row.problem_id, run_id=row.run_id,
        library=row.library, time_median_ms=row.time_median_ms, gflops=row.gflops,
        sm_clock_mhz=row.sm_clock_mhz, measured_at=row.measured_at,
    )
