"""Shared by the gemmtune (user call), pack and API-cache tests: results written through `db`'s
own write API into a real SQLite file, with chosen GFLOP/s so each test knows the right answer.

Holds no tests itself. Trials go in exactly as a tuner writes them (ensure_gpu/problem/family,
start_run, add_trial, add_baseline, finish_run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import db
import kernels

ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
H100_UUID = "GPU-11111111-2222-3333-4444-555555555555"

# One accepted config per family used by the tests (checked by test_configs_are_accepted).
CONFIGS: dict[str, dict[str, int]] = {
    "naive": dict(BX=32, BY=8, COALESCED=1),
    "smem": dict(TILE=16),
    "blocktile2d": dict(BM=64, BN=64, BK=8, TM=4, TN=4, RASTER=1),
    "tf32x3": dict(BM=128, BN=64, BK=32, WM=64, WN=32, KGROUP=4, STAGES=2, SPLITK=1, RASTER=1),
    "wgmma": dict(BM=128, BK=64, WGS=2, MW=1, STAGES=2, FLUSH=4, SPLITK=1, RASTER=8, ASPLIT=0),
}


@dataclass(frozen=True)
class Row:
    """One ok trial: family (current source unless source_hash is given), shape, GFLOP/s; the
    problem's layout and batch count; the family's config of CONFIGS unless one is given."""

    family: str
    shape: tuple[int, int, int]
    gflops: float
    source_hash: str | None = None
    gpu: str = H100
    uuid: str = H100_UUID
    layout: str = "nn"
    batch: int = 1
    config: tuple[tuple[str, int], ...] | None = None

    @property
    def params(self) -> dict[str, int]:
        return dict(self.config) if self.config is not None else CONFIGS[self.family]


def fill(url: str, rows: list[Row], baselines: dict[tuple[int, int, int], float] | None = None) -> dict[Row, int]:
    """Write each row as a finished run with one ok trial (plus one failed trial that must never
    win); baselines: cuBLAS GFLOP/s per shape on the H100. Returns each row's trial id."""
    ids = {}
    with db.open_database(url) as d:
        for row in rows:
            gpu_id = d.ensure_gpu(db.GpuInfo(row.gpu, row.uuid, "9.0", 132, 80 << 30, 1980, "580", "13.0", "13.0"))
            problem_id = d.ensure_problem(*row.shape, layout=row.layout, batch=row.batch)
            fam = kernels.FAMILIES[row.family]
            family_id = d.ensure_family(row.family, row.source_hash or fam.source_hash)
            run_id = d.start_run(gpu_id=gpu_id, problem_id=problem_id, family_id=family_id, sampler="tpe", seed=0,
                                 budget={}, host="test", command="results_support.fill", study_name=None)
            m, n, k = row.shape
            ms = 2 * m * n * k * row.batch / (row.gflops * 1e6)
            ids[row] = d.add_trial(run_id, db.TrialRecord(
                number=0, params=row.params, state="ok", time_median_ms=ms, gflops=row.gflops))
            d.add_trial(run_id, db.TrialRecord(number=1, params=row.params, state="wrong_result",
                                               error="planted", gflops=10 * row.gflops, time_median_ms=ms / 10))
            d.finish_run(run_id, "finished")
        for shape, gflops in (baselines or {}).items():
            # A baseline belongs to one board: the board of the first row of that shape (else the H100),
            # so a row filled for another board of the same name still meets its baseline.
            gpu, uuid = next(((r.gpu, r.uuid) for r in rows if r.shape == shape), (H100, H100_UUID))
            gpu_id = d.ensure_gpu(db.GpuInfo(gpu, uuid, "9.0", 132, 80 << 30, 1980, "580", "13.0", "13.0"))
            m, n, k = shape
            d.add_baseline(gpu_id=gpu_id, problem_id=d.ensure_problem(*shape), time_median_ms=2 * m * n * k / (gflops * 1e6),
                           gflops=gflops)
    return ids
