"""Database methods that answer "what is best": best, top-k, nearest problem, baselines."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from . import convert, validate
from .listing import _latest_baselines
from .core import DatabaseCore
from .models import BaselineRow, FamilyRow, GpuRow, ProblemRow, RunRow, TrialRow
from .records import Baseline, BestResult, NearestProblem

_BEST_COLUMNS = (TrialRow, RunRow, GpuRow, ProblemRow, FamilyRow)


def log2_distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """Distance between two GEMM shapes: Euclidean distance of (log2 M, log2 N, log2 K) (and of
    log2 batch, where both give a fourth size).

    Working in log2 makes a factor of two in any dimension count the same whether the
    dimension is 64 or 8192, which matches how tiled kernels' behaviour changes with size:
    (1024, 1024, 1024) is 1.0 from (2048, 1024, 1024) and sqrt(3) from (2048, 2048, 2048).
    """
    return math.sqrt(sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b)))


def _ok_trials() -> Select[Any]:
    """Verified trials with everything a BestResult needs, fastest first (ties: oldest trial)."""
    return (
        select(*_BEST_COLUMNS)
        .join(RunRow, TrialRow.run_id == RunRow.id)
        .join(GpuRow, RunRow.gpu_id == GpuRow.id)
        .join(ProblemRow, RunRow.problem_id == ProblemRow.id)
        .join(FamilyRow, RunRow.family_id == FamilyRow.id)
        .where(TrialRow.state == "ok")
        .order_by(TrialRow.gflops.desc(), TrialRow.id)
    )


def _family_filter(query: Select[Any], family: str | None, source_hash: str | None,
                   families: Collection[str] | None = None,
                   source_hashes: Collection[str] | None = None) -> Select[Any]:
    """Restrict to one family / version, and to sets of them (a precision class, the installed
    versions); the filters add up. An empty set matches nothing."""
    validate.text("family", family, optional=True)
    validate.text("source_hash", source_hash, optional=True)
    names = validate.names("families", families)
    hashes = validate.names("source_hashes", source_hashes)
    if family is not None:
        query = query.where(FamilyRow.name == family)
    if source_hash is not None:
        query = query.where(FamilyRow.source_hash == source_hash.lower())
    if names is not None:
        query = query.where(FamilyRow.name.in_(sorted(names)))
    if hashes is not None:
        query = query.where(FamilyRow.source_hash.in_(sorted(h.lower() for h in hashes)))
    return query


class Queries(DatabaseCore):
    def best(self, gpu: str, m: int, n: int, k: int, family: str | None = None,
             nearest: bool = True, *, source_hash: str | None = None,
             families: Collection[str] | None = None, source_hashes: Collection[str] | None = None,
             dtype: str = "fp32", layout: str = "nn",
             general_alpha_beta: bool = True, batch: int = 1,
             accept: Callable[[str, Mapping[str, int]], bool] | None = None) -> BestResult | None:
        """The fastest verified config for (gpu, problem), optionally of one family.

        gpu is a name or UUID (any case); a name covers every GPU of that name. Only trials in
        state "ok" qualify. When the exact problem has none and `nearest` is set, the answer
        comes from the closest tuned problem of the same layout (see log2_distance; batch
        counts as a fourth size), with match="nearest".
        None when nothing qualifies; an unknown gpu raises UnknownGpuError. `families` and
        `source_hashes` restrict to sets of family names / versions (both for exact and nearest).
        `accept(family, params)`, where given, passes over the configs a caller cannot run (a
        value its installed family no longer offers): the answer is the fastest accepted one,
        and a problem with none accepted counts as not tuned.
        """
        requested = validate.shape(m, n, k)
        validate.batch(batch)
        validate.problem_kind(dtype, layout, general_alpha_beta)
        with self._reading() as session:
            gpu_ids = self._gpu_ids(session, gpu)
            query = _family_filter(_ok_trials(), family, source_hash, families, source_hashes).where(
                RunRow.gpu_id.in_(gpu_ids),
                ProblemRow.dtype == dtype, ProblemRow.layout == layout,
                ProblemRow.general_alpha_beta == general_alpha_beta,
            )
            exact = _first_accepted(session, query.where(ProblemRow.m == m, ProblemRow.n == n, ProblemRow.k == k,
                                                         ProblemRow.batch == batch), accept)
            if exact is not None:
                return _best_result(session, exact, requested, "exact", 0.0)
            if not nearest:
                return None
            candidates = self._tuned_problems(session, gpu_ids, requested, family, source_hash,
                                              dtype, layout, general_alpha_beta, families,
                                              source_hashes, batch)
            for closest in candidates:  # nearest first
                row = _first_accepted(session, query.where(ProblemRow.id == closest.problem.id), accept)
                if row is not None:
                    return _best_result(session, row, requested, "nearest", closest.distance)
            return None

    def top_k(self, gpu: str, m: int, n: int, k: int, *, family: str | None = None,
              families: Collection[str] | None = None,
              limit: int = 10, dtype: str = "fp32", layout: str = "nn",
              general_alpha_beta: bool = True, batch: int = 1) -> list[BestResult]:
        """The `limit` fastest verified trials for exactly this (gpu, problem), best first."""
        requested = validate.shape(m, n, k)
        validate.batch(batch)
        validate.problem_kind(dtype, layout, general_alpha_beta)
        _, limit = validate.paging(0, limit)
        with self._reading() as session:
            gpu_ids = self._gpu_ids(session, gpu)
            query = _family_filter(_ok_trials(), family, None, families).where(
                RunRow.gpu_id.in_(gpu_ids), ProblemRow.m == m, ProblemRow.n == n,
                ProblemRow.k == k, ProblemRow.batch == batch, ProblemRow.dtype == dtype, ProblemRow.layout == layout,
                ProblemRow.general_alpha_beta == general_alpha_beta,
            ).limit(limit)
            return [_best_result(session, row, requested, "exact", 0.0)
                    for row in session.execute(query)]

    def top_k_for_run(self, run_id: int, limit: int = 10) -> list[BestResult]:
        """The `limit` fastest verified trials of one run, best first."""
        _, limit = validate.paging(0, limit)
        with self._reading() as session:
            run = self._run_row(session, run_id)
            shape = (run.problem.m, run.problem.n, run.problem.k)
            query = _ok_trials().where(TrialRow.run_id == run_id).limit(limit)
            return [_best_result(session, row, shape, "exact", 0.0)
                    for row in session.execute(query)]

    def nearest_problems(self, gpu: str, m: int, n: int, k: int, limit: int = 5, *,
                         family: str | None = None, families: Collection[str] | None = None,
                         dtype: str = "fp32", layout: str = "nn",
                         general_alpha_beta: bool = True, batch: int = 1) -> list[NearestProblem]:
        """Problems tuned on this gpu (≥ 1 ok trial), closest to (m, n, k) first.

        distance = sqrt((log2 M - log2 m)² + (log2 N - log2 n)² + (log2 K - log2 k)²), see
        log2_distance, with batch as a fourth size); ties go to the smaller shape. The exact
        problem, if tuned, comes first with distance 0.
        """
        requested = validate.shape(m, n, k)
        validate.batch(batch)
        validate.problem_kind(dtype, layout, general_alpha_beta)
        _, limit = validate.paging(0, limit)
        with self._reading() as session:
            gpu_ids = self._gpu_ids(session, gpu)
            return self._tuned_problems(session, gpu_ids, requested, family, None, dtype,
                                        layout, general_alpha_beta, families, None, batch)[:limit]

    def latest_baseline(self, gpu_id: int, problem_id: int,
                        library: str = "cublas") -> Baseline | None:
        with self._reading() as session:
            row = _latest_baseline(session, gpu_id, problem_id, library)
            return None if row is None else convert.baseline(row)

    def best_table(self) -> list[BestResult]:
        """The fastest ok trial of every (GPU board, problem, family version), best first per
        group, with the latest cuBLAS baseline of its board and problem (match "exact").

        Everything `best` can answer is a pick from this table, so a reader that keeps it in
        memory (the API) answers best/nearest without a query; `change_marker` says when to
        reload it.
        """
        rank = func.row_number().over(
            partition_by=(RunRow.gpu_id, RunRow.problem_id, RunRow.family_id),
            order_by=(TrialRow.gflops.desc(), TrialRow.id),
        ).label("rank")
        ranked = (select(TrialRow.id.label("trial_id"), rank)
                  .join(RunRow, TrialRow.run_id == RunRow.id)
                  .where(TrialRow.state == "ok").subquery())
        query = (select(*_BEST_COLUMNS)
                 .join(ranked, (ranked.c.trial_id == TrialRow.id) & (ranked.c.rank == 1))
                 .join(RunRow, TrialRow.run_id == RunRow.id)
                 .join(GpuRow, RunRow.gpu_id == GpuRow.id)
                 .join(ProblemRow, RunRow.problem_id == ProblemRow.id)
                 .join(FamilyRow, RunRow.family_id == FamilyRow.id)
                 .order_by(TrialRow.gflops.desc(), TrialRow.id))
        with self._reading() as session:
            baselines = _latest_baselines(session)
            out = []
            for row in session.execute(query):
                _, _, gpu, problem, _ = row
                shape = (problem.m, problem.n, problem.k)
                out.append(_result(row, shape, "exact", 0.0, baselines.get((gpu.id, problem.id))))
            return out

    def change_marker(self) -> tuple[int, ...]:
        """A cheap fingerprint of everything `best_table` and the GPU list depend on: it changes
        whenever a trial, baseline, GPU, problem or family version is added. Rows of these tables
        are only ever inserted (never edited in their best-relevant columns nor deleted; a GPU's
        refresh never changes its name or UUID), so the newest id of each says it all: five
        primary-key index lookups, however large the tables."""
        cols = [select(func.coalesce(func.max(model.id), 0)).scalar_subquery()
                for model in (TrialRow, BaselineRow, GpuRow, ProblemRow, FamilyRow)]
        with self._reading() as session:
            return tuple(int(v) for v in session.execute(select(*cols)).one())

    @staticmethod
    def _tuned_problems(session: Session, gpu_ids: Sequence[int], requested: tuple[int, int, int],
                        family: str | None, source_hash: str | None, dtype: str, layout: str,
                        general_alpha_beta: bool, families: Collection[str] | None = None,
                        source_hashes: Collection[str] | None = None, batch: int = 1) -> list[NearestProblem]:
        query = _family_filter(
            select(ProblemRow, func.max(TrialRow.gflops), func.count(TrialRow.id))
            .join(RunRow, RunRow.problem_id == ProblemRow.id)
            .join(TrialRow, TrialRow.run_id == RunRow.id)
            .join(FamilyRow, RunRow.family_id == FamilyRow.id)
            .where(TrialRow.state == "ok", RunRow.gpu_id.in_(gpu_ids),
                   ProblemRow.dtype == dtype, ProblemRow.layout == layout,
                   ProblemRow.general_alpha_beta == general_alpha_beta)
            .group_by(ProblemRow.id),
            family, source_hash, families, source_hashes,
        )
        # Few tuned shapes per GPU: rank in Python, where log2 is the same on every backend.
        found = [
            NearestProblem(problem=convert.problem(p), best_gflops=float(best), n_ok=int(count),
                           distance=log2_distance((p.m, p.n, p.k, p.batch), (*requested, batch)))
            for p, best, count in session.execute(query)
        ]
        found.sort(key=lambda c: (c.distance, c.problem.batch * c.problem.m * c.problem.n * c.problem.k,
                                  c.problem.m, c.problem.n, c.problem.id))
        return found


def _latest_baseline(session: Session, gpu_id: int, problem_id: int,
                     library: str = "cublas") -> BaselineRow | None:
    return session.scalar(
        select(BaselineRow)
        .where(BaselineRow.gpu_id == gpu_id, BaselineRow.problem_id == problem_id,
               BaselineRow.library == library)
        .order_by(BaselineRow.measured_at.desc(), BaselineRow.id.desc())
        .limit(1)
    )


def _first_accepted(session: Session, query: Select[Any],
                    accept: Callable[[str, Mapping[str, int]], bool] | None) -> Any:
    """The first row of a fastest-first query whose (family, params) `accept` takes (the first
    row where accept is None), or None."""
    if accept is None:
        return session.execute(query.limit(1)).first()
    for row in session.execute(query):
        trial, _, _, _, family = row
        if accept(family.name, dict(trial.params)):
            return row
    return None


def _best_result(session: Session, row: Any, requested: tuple[int, int, int],
                 match: str, distance: float) -> BestResult:
    _, _, gpu, problem, _ = row
    baseline = _latest_baseline(session, gpu.id, problem.id)
    return _result(row, requested, match, distance, None if baseline is None else baseline.gflops)


def _result(row: Any, requested: tuple[int, int, int], match: str, distance: float,
            baseline_gflops: float | None) -> BestResult:
    """A (trial, run, gpu, problem, family) row as a BestResult, against that baseline."""
    trial, run, gpu, problem, family = row
    return BestResult(
        match=match,  # type: ignore[arg-type]
        distance=distance, requested=requested, problem=convert.problem(problem),
        gpu_id=gpu.id, gpu_name=gpu.name, gpu_uuid=gpu.uuid, family=family.name,
        source_hash=family.source_hash, run_id=run.id, trial_id=trial.id,
        trial_number=trial.number, params=dict(trial.params), gflops=trial.gflops,
        time_median_ms=trial.time_median_ms, occupancy=trial.occupancy,
        registers=trial.registers, shared_bytes=trial.shared_bytes,
        spill_bytes=trial.spill_bytes, baseline_gflops=baseline_gflops,
        fraction_of_cublas=None if baseline_gflops is None else trial.gflops / baseline_gflops,
        timings=trial.timings or 1,
    )
