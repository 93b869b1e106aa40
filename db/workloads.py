"""Workloads: the GEMM problems a program runs, each with its share of the program's GEMM time.

One definition of the workload file (written by gemmtune's recorder, `python -m gemmtune
profile`; read by `python -m tuner --workload FILE`) and its rows in the database
(gt_workloads), which the dashboard shows against what is tuned. JSON:

    {"format": "gemmtune-workload", "version": 1, "created_at": "…Z", "gpu": "NVIDIA H100 80GB HBM3",
     "label": "…", "gemm_ms": total, "skipped": {"reason": calls, …},
     "problems": [{"m", "n", "k", "layout", "batch", "count", "time_ms", "share",
                   "operators": {"aten::addmm": 24, …}}, …]}        (largest share first)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from kernels.layout import LAYOUTS, problem_label

from .core import DatabaseCore
from .errors import InvalidInputError, bad_value
from .models import WorkloadRow, utcnow

FORMAT = "gemmtune-workload"
VERSION = 1


class WorkloadError(InvalidInputError):
    """A workload (file or rows) this code does not read: names the file and what is wrong."""


@dataclass(frozen=True, order=True)
class WorkloadProblem:
    m: int
    n: int
    k: int
    layout: str = "nn"
    batch: int = 1
    share: float = 0.0  # of the workload's GEMM time
    count: int = 0  # calls

    @property
    def label(self) -> str:
        return problem_label(self.m, self.n, self.k, self.layout, self.batch)


@dataclass(frozen=True)
class Workload:
    id: int
    name: str
    gpu_name: str | None
    problems: list[WorkloadProblem]  # largest share first
    gemm_ms: float | None
    created_at: datetime


def check_workload(data: Any, where: str) -> list[WorkloadProblem]:
    """The problems of a workload document, largest share first; WorkloadError says what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WorkloadError(f"{where} is not a gemmtune workload (needs \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise WorkloadError(f"workload {where} has version {data.get('version')!r}; this gemmtune reads {VERSION}")
    rows = data.get("problems")
    if not isinstance(rows, list) or not rows:
        raise WorkloadError(f"workload {where}: \"problems\" must be a non-empty list")
    found = []
    for i, p in enumerate(rows):
        ok = (isinstance(p, dict) and all(isinstance(p.get(d), int) and not isinstance(p.get(d), bool) and p[d] >= 1
                                          for d in ("m", "n", "k"))
              and p.get("layout", "nn") in LAYOUTS and isinstance(p.get("batch", 1), int) and p.get("batch", 1) >= 1
              and isinstance(p.get("share", 0.0), (int, float)) and 0 <= p.get("share", 0.0) <= 1
              and isinstance(p.get("count", 0), int) and p.get("count", 0) >= 0)
        if not ok:
            raise WorkloadError(f"workload {where}: problem {i} ({p!r}) needs positive integers m, n, k (and batch), "
                                f"a layout among {', '.join(LAYOUTS)}, a share in 0..1 and a count >= 0")
        found.append(WorkloadProblem(p["m"], p["n"], p["k"], p.get("layout", "nn"), p.get("batch", 1),
                                     float(p.get("share", 0.0)), p.get("count", 0)))
    return sorted(found, key=lambda w: (-w.share, w.m, w.n, w.k, w.layout, w.batch))


def read_workload(path: str | Path) -> dict[str, Any]:
    """Parse and check a workload file; WorkloadError names the file and what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc}") from exc
    except ValueError as exc:
        raise WorkloadError(f"workload {path} is not JSON: {exc}") from exc
    check_workload(data, str(path))
    return data


def write_workload(data: dict[str, Any], path: str | Path) -> Path:
    check_workload(data, str(path))
    path = Path(path)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def _workload(row: WorkloadRow) -> Workload:
    return Workload(id=row.id, name=row.name, gpu_name=row.gpu_name,
                    problems=check_workload({"format": FORMAT, "version": VERSION, "problems": row.problems},
                                            f"workload {row.id}"),
                    gemm_ms=row.gemm_ms, created_at=row.created_at)


class Workloads(DatabaseCore):
    def save_workload(self, name: str, data: dict[str, Any]) -> int:
        """Store a workload document under `name` (a new row each time: a workload recorded again
        is a new one); returns its id."""
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise bad_value("workload name", name, "a non-empty text of at most 255 characters")
        problems = check_workload(data, name)
        rows = [{"m": p.m, "n": p.n, "k": p.k, "layout": p.layout, "batch": p.batch, "share": p.share,
                 "count": p.count} for p in problems]
        with self._writing() as session:
            row = WorkloadRow(name=name.strip(), gpu_name=data.get("gpu"), problems=rows,
                              gemm_ms=data.get("gemm_ms"), created_at=utcnow())
            session.add(row)
            session.flush()
            return row.id

    def list_workloads(self) -> list[Workload]:
        """Every stored workload, newest first."""
        with self._reading() as session:
            return [_workload(r) for r in session.scalars(select(WorkloadRow).order_by(WorkloadRow.id.desc()))]

    def get_workload(self, workload_id: int) -> Workload:
        with self._reading() as session:
            row = session.get(WorkloadRow, workload_id)
            if row is None:
                raise WorkloadError(f"unknown workload id {workload_id!r}")
            return _workload(row)
