"""The API's reads: `db.Database` calls turned into response models.

This is the only module that calls the database; routes and pages go through it, so the API never
builds SQL and each question the dashboard asks is answered in one place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import db
import kernels
from gemmtune.precision import allowed_families, runnable_on

from . import schemas as s
from .bestcache import Snapshot
from .errors import ApiError, not_found

MAX_DIM = 1 << 20  # per dimension; larger shapes are refused with a 422
PAGE_MAX = 1000  # most trials one page returns
EXPORT_PAGE = 1000  # page size the exports read with


# --- conversions --------------------------------------------------------------------------------


def gpu_out(g: db.Gpu) -> s.GpuOut:
    return s.GpuOut(
        id=g.id, name=g.name, uuid=g.uuid, compute_capability=g.compute_capability, sm_count=g.sm_count,
        memory_bytes=g.memory_bytes, max_sm_clock_mhz=g.max_sm_clock_mhz, driver_version=g.driver_version,
        cuda_version=g.cuda_version, nvrtc_version=g.nvrtc_version,
    )  # fmt: skip


def problem_out(p: db.Problem) -> s.ProblemOut:
    return s.ProblemOut(
        id=p.id, m=p.m, n=p.n, k=p.k, dtype=p.dtype, layout=p.layout, general_alpha_beta=p.general_alpha_beta,
        batch=p.batch, label=p.label,
    )


def kernel_out(f: kernels.Family) -> s.KernelOut:
    size = 1
    for p in f.params:
        size *= len(p.values)
    return s.KernelOut(
        name=f.name, rung=f.rung, description=f.description, source_hash=f.source_hash,
        params=[s.ParamOut(name=p.name, values=list(p.values), doc=p.doc) for p in f.params], space_size=size,
    )  # fmt: skip


def fraction(gflops: float | None, baseline: float | None) -> float | None:
    return gflops / baseline if gflops is not None and baseline else None


def best_config(b: db.BestResult) -> s.BestConfig:
    return s.BestConfig(
        family=b.family, source_hash=b.source_hash, config=dict(b.params), gflops=b.gflops,
        time_median_ms=b.time_median_ms, timings=b.timings, cublas_gflops=b.baseline_gflops, fraction_of_cublas=b.fraction_of_cublas,
        occupancy=b.occupancy, registers=b.registers, run_id=b.run_id, trial_number=b.trial_number,
        trial_id=b.trial_id, problem=problem_out(b.problem),
    )  # fmt: skip


def trial_out(t: db.Trial, baseline_gflops: float | None) -> s.TrialOut:
    return s.TrialOut(
        number=t.number, params=dict(t.params), state=t.state, error=t.error, compile_seconds=t.compile_seconds,
        registers=t.registers, shared_bytes=t.shared_bytes, spill_bytes=t.spill_bytes, occupancy=t.occupancy,
        time_min_ms=t.time_min_ms, time_median_ms=t.time_median_ms, time_max_ms=t.time_max_ms,
        launches=t.launches, gflops=t.gflops, sm_clock_mhz=t.sm_clock_mhz, timings=t.timings,
        fraction_of_cublas=fraction(t.gflops, baseline_gflops), started_at=t.started_at, recorded_at=t.recorded_at,
    )  # fmt: skip


@dataclass(frozen=True)
class FailureGroup:
    """Trials that failed the same way: one row of the run page's failure breakdown."""

    state: str
    error: str
    count: int
    trial_numbers: list[int]


class Reads:
    """Read-only questions the API and the dashboard ask of one database."""

    def __init__(self, database: db.Database) -> None:
        self.db = database

    # --- names -------------------------------------------------------------------------------

    def gpus(self) -> list[s.GpuOut]:
        return [gpu_out(g) for g in self.db.list_gpus()]

    def unknown_gpu(self, gpu: str) -> ApiError:
        known = self.db.list_gpus()
        listing = ", ".join(f"{g.name} ({g.uuid})" for g in known) or "(none recorded yet)"
        allowed = sorted({g.name for g in known}) + sorted(g.uuid for g in known)
        return ApiError(404, f"unknown GPU {gpu!r}; known GPUs (name or UUID): {listing}", allowed)

    def resolve_gpu(self, gpu: str) -> list[db.Gpu]:
        """The GPUs a name or UUID names; 404 listing the known ones when there is none."""
        found = self.db.find_gpus(gpu)
        if not found:
            raise self.unknown_gpu(gpu)
        return found

    def kernel_names(self) -> list[str]:
        """Families the code knows, then any older ones only the database remembers."""
        names = list(kernels.FAMILIES)
        names += sorted({f.name for f in self.db.list_families()} - set(names))
        return names

    def check_kernel(self, kernel: str) -> str:
        if kernel in kernels.FAMILIES:  # the common case, without a database query
            return kernel
        names = self.kernel_names()
        for name in names:
            if name.lower() == kernel.lower():
                return name
        raise not_found("kernel family", kernel, names)

    def kernels(self) -> list[s.KernelOut]:
        return [kernel_out(f) for f in kernels.FAMILIES.values()]

    def problems(self) -> list[s.ProblemOut]:
        return [problem_out(p) for p in self.db.list_problems()]

    def problem(self, problem_id: int) -> db.Problem:
        for p in self.db.list_problems():
            if p.id == problem_id:
                return p
        raise ApiError(404, f"unknown problem id {problem_id}; see /api/problems for the known ones")

    # --- workloads --------------------------------------------------------------------------

    def workloads(self, gpu: str | None = None) -> list[s.WorkloadOut]:
        self.settle_runs()
        ids = self._problem_ids()
        return [self._workload(w, gpu, ids) for w in self.db.list_workloads()]

    def workload(self, workload_id: int, gpu: str | None = None) -> s.WorkloadOut:
        """A recorded workload against what is tuned on `gpu` (default: the GPU it was recorded
        on): per problem how far its tuning has come, the best config tuned on exactly it, and
        whether it beats cuBLAS there (what gemmtune.enable() would run); the share of GEMM time
        so served."""
        try:
            w = self.db.get_workload(workload_id)
        except db.WorkloadError:
            raise ApiError(404, f"unknown workload id {workload_id}; see /api/workloads for the known ones") from None
        self.settle_runs()
        return self._workload(w, gpu, self._problem_ids())

    def _problem_ids(self) -> dict[tuple, list[int]]:
        """(m, n, k, layout, batch) → the ids of its FP32 problems (with general alpha/beta or not)."""
        ids: dict[tuple, list[int]] = {}
        for q in self.db.list_problems():
            if q.dtype == "fp32":
                ids.setdefault((q.m, q.n, q.k, q.layout, q.batch), []).append(q.id)
        return ids

    def _workload(self, w: db.Workload, gpu: str | None, problem_ids: dict[tuple, list[int]]) -> s.WorkloadOut:
        model = gpu or w.gpu_name
        known = model is not None and bool(self.db.find_gpus(model))
        rows, served_share = [], 0.0
        for p in w.problems:
            found, runs = None, []
            if known:
                found = self.db.best(model, p.m, p.n, p.k, nearest=False, layout=p.layout, batch=p.batch)
                runs = sorted((r for pid in problem_ids.get((p.m, p.n, p.k, p.layout, p.batch), [])
                               for r in self.db.list_runs(gpu=model, problem_id=pid, limit=100)),
                              key=lambda r: r.id, reverse=True)
            served = bool(found and found.fraction_of_cublas is not None and found.fraction_of_cublas > 1.0)
            served_share += p.share if served else 0.0
            tuning = s.WorkloadTuningOut(runs=len(runs), running=sum(r.state == "running" for r in runs),
                                         measured=sum(r.n_trials for r in runs),
                                         latest_run=runs[0].id if runs else None)
            rows.append(s.WorkloadProblemOut(
                m=p.m, n=p.n, k=p.k, layout=p.layout, batch=p.batch, label=p.label, count=p.count, share=p.share,
                best=best_config(found) if found else None, served=served, tuning=tuning))
        return s.WorkloadOut(id=w.id, name=w.name, recorded_on=w.gpu_name, gpu=model if known else None,
                             gemm_ms=w.gemm_ms, created_at=w.created_at, served_share=served_share,
                             running=any(row.tuning.running for row in rows), problems=rows)

    # --- best -------------------------------------------------------------------------------

    @staticmethod
    def precision_families(precision: str, kernel: str | None = None) -> list[str] | None:
        """Family names a precision admits (None: no filter, "fp32" admits every class); 422 when
        the kernel filter names a family outside them."""
        if precision == "fp32":
            return None
        names = sorted(allowed_families(precision))
        if kernel is not None and kernel not in names:
            raise ApiError(422, f"kernel {kernel!r} is not a {precision} family; precision={precision} allows: "
                                f"{', '.join(names)}", names)
        return names

    def best_from(self, snap: Snapshot | None, gpu: str, m: int, n: int, k: int, kernel: str | None,
                  nearest: bool = True, precision: str = "fp32",
                  source_hashes: list[str] | None = None, layout: str = "nn", batch: int = 1,
                  arch: str | None = None) -> s.BestOut | None:
        """The answer from a snapshot, or None when it needs the database (a GPU or a family name
        the snapshot does not know: answered, or refused, by `best`; with `arch`, a config the
        snapshot holds that the family refuses there, since the snapshot keeps only the fastest
        config per family version and problem)."""
        if snap is None or not snap.gpu_ids(gpu) or (kernel is not None and kernel not in kernels.FAMILIES):
            return None
        families = self.precision_families(precision, kernel)
        found = snap.best(gpu, m, n, k, kernel, nearest, families, source_hashes, layout, batch, arch)
        if found is Snapshot.ASK_DATABASE:
            return None
        return self._best_out(found, snap.first_gpu_name(gpu), m, n, k, kernel, layout, batch)

    def best(self, gpu: str, m: int, n: int, k: int, kernel: str | None, nearest: bool = True,
             precision: str = "fp32", source_hashes: list[str] | None = None, layout: str = "nn",
             batch: int = 1, arch: str | None = None) -> s.BestOut:
        family = self.check_kernel(kernel) if kernel is not None else None
        families = self.precision_families(precision, family)
        try:
            found = self.db.best(gpu, m, n, k, family=family, nearest=nearest, families=families,
                                 source_hashes=source_hashes, layout=layout, batch=batch, accept=runnable_on(arch))
        except db.UnknownGpuError:
            raise self.unknown_gpu(gpu) from None
        return self._best_out(found, None if found else self.resolve_gpu(gpu)[0].name, m, n, k, family, layout,
                              batch)

    @staticmethod
    def _best_out(found: db.BestResult | None, gpu_name: str | None, m: int, n: int, k: int,
                  family: str | None, layout: str = "nn", batch: int = 1) -> s.BestOut:
        requested = s.Shape(m=m, n=n, k=k)
        if found is None:
            return s.BestOut(match="none", gpu=gpu_name, requested=requested, kernel=family, layout=layout,
                             batch=batch)
        p = found.problem
        return s.BestOut(
            match=found.match, gpu=found.gpu_name, requested=requested, shape=s.Shape(m=p.m, n=p.n, k=p.k),
            distance=found.distance, kernel=family, best=best_config(found), layout=layout, batch=batch,
            shape_batch=p.batch,
        )  # fmt: skip

    # --- runs -------------------------------------------------------------------------------

    def _baseline(self, run: db.Run) -> float | None:
        b = self.db.latest_baseline(run.gpu_id, run.problem.id)
        return b.gflops if b else None

    def run_out(self, run: db.Run, *, with_counts: bool) -> s.RunOut:
        baseline = self._baseline(run)
        return s.RunOut(
            id=run.id, state=run.state, gpu=run.gpu_name, gpu_uuid=run.gpu_uuid, family=run.family,
            source_hash=run.source_hash, problem=problem_out(run.problem), sampler=run.sampler, seed=run.seed,
            budget=dict(run.budget), host=run.host, command=run.command, study_name=run.study_name,
            started_at=run.started_at, ended_at=run.ended_at, heartbeat_at=run.heartbeat_at,
            stale_after_s=run.stale_after_s, n_trials=run.n_trials, n_ok=run.n_ok,
            state_counts=self.db.count_trials(run.id) if with_counts else None,
            best_gflops=run.best_gflops, cublas_gflops=baseline, fraction_of_cublas=fraction(run.best_gflops, baseline),
        )  # fmt: skip

    def settle_runs(self) -> None:
        """Runs whose tuner died (no heartbeat for its stale-after time) are shown as interrupted
        at once, not left "running" until another tuner starts: one read, a write only for them."""
        self.db.interrupt_stale_runs()

    def get_run(self, run_id: int) -> db.Run:
        try:
            return self.db.get_run(run_id)
        except db.UnknownRunError:
            raise ApiError(404, f"unknown run id {run_id}; see /api/runs for the known ones") from None

    def runs(
        self, *, gpu: str | None, kernel: str | None, state: str | None, problem_id: int | None, offset: int, limit: int
    ) -> list[s.RunOut]:
        if gpu is not None:
            self.resolve_gpu(gpu)
        family = self.check_kernel(kernel) if kernel is not None else None
        self.settle_runs()
        found = self.db.list_runs(gpu=gpu, problem_id=problem_id, family=family, state=state, offset=offset, limit=limit)
        return [self.run_out(r, with_counts=False) for r in found]

    def run(self, run_id: int) -> s.RunOut:
        self.settle_runs()
        return self.run_out(self.get_run(run_id), with_counts=True)

    def trial_page(self, run_id: int, state: str | None, offset: int, limit: int) -> s.TrialPage:
        run = self.get_run(run_id)
        counts = self.db.count_trials(run_id)
        total = counts.get(state, 0) if state else sum(counts.values())
        baseline = self._baseline(run)
        items = [trial_out(t, baseline) for t in self.db.trials(run_id, state=state, offset=offset, limit=limit)]
        return s.TrialPage(run_id=run_id, state=state, total=total, offset=offset, limit=limit, items=items)

    def all_trials(self, run_id: int, state: str | None = None) -> Iterator[s.TrialOut]:
        """Every trial of a run, read page by page so an export never holds a huge query open."""
        run = self.get_run(run_id)
        baseline = self._baseline(run)
        offset = 0
        while True:
            page = self.db.trials(run_id, state=state, offset=offset, limit=EXPORT_PAGE)
            yield from (trial_out(t, baseline) for t in page)
            if len(page) < EXPORT_PAGE:
                return
            offset += EXPORT_PAGE

    def param_names(self, run_id: int) -> list[str]:
        """The run's family parameters in declaration order; stored names for families the code lost."""
        family = self.get_run(run_id).family
        if family in kernels.FAMILIES:
            return [p.name for p in kernels.FAMILIES[family].params]
        first = next(iter(self.db.trials(run_id, limit=1)), None)
        return sorted(first.params) if first else []

    def top_configs(self, run_id: int, limit: int = 10) -> list[s.BestConfig]:
        return [best_config(b) for b in self.db.top_k_for_run(run_id, limit=limit)]

    def failures(self, run_id: int) -> list[FailureGroup]:
        """Non-ok trials grouped by state and the first line of their error, most frequent first."""
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for t in self.all_trials(run_id):
            if t.state != "ok":
                first_line = (t.error or "").strip().splitlines()[0] if (t.error or "").strip() else "(no message)"
                groups[(t.state, first_line)].append(t.number)
        rows = [FailureGroup(st, err, len(nums), nums) for (st, err), nums in groups.items()]
        return sorted(rows, key=lambda g: (-g.count, g.state, g.error))

    # --- overview and problem comparison ---------------------------------------------------------

    def overview(self, precision: str = "fp32") -> list[s.OverviewCellOut]:
        families = self.precision_families(precision)
        return [
            s.OverviewCellOut(
                gpu=c.gpu_name, problem=problem_out(c.problem), best_gflops=c.best_gflops,
                fraction_of_cublas=c.fraction_of_cublas, cublas_gflops=c.baseline_gflops, family=c.family,
                run_id=c.run_id,
            )  # fmt: skip
            for c in self.db.overview(families=families)
        ]

    def compare_models(self, problem_id: int) -> list[s.OverviewCellOut]:
        """Each GPU model's best on one problem (any family), fastest first: the overview's cells of
        that problem, so the page's table, its overlay and /api/overview never disagree."""
        self.problem(problem_id)  # a 404 for an unknown problem, not an empty list
        return sorted((c for c in self.overview() if c.problem.id == problem_id), key=lambda c: (-c.best_gflops, c.gpu))

    def compare_families(self, problem_id: int, gpu: str) -> s.FamilyComparison:
        """Each family's best on one problem and GPU, against the cuBLAS baseline."""
        gpus = self.resolve_gpu(gpu)
        p = self.problem(problem_id)
        rows = []
        for family in self.kernel_names():
            top = self.db.top_k(
                gpu, p.m, p.n, p.k, family=family, limit=1,
                dtype=p.dtype, layout=p.layout, general_alpha_beta=p.general_alpha_beta,
            )  # fmt: skip
            if top:
                rows.append(best_config(top[0]))
        rows.sort(key=lambda r: -r.gflops)
        baselines = [b for g in gpus if (b := self.db.latest_baseline(g.id, p.id)) is not None]
        cublas = max((b.gflops for b in baselines), default=None)
        self.settle_runs()
        runs = self.db.list_runs(gpu=gpu, problem_id=problem_id, limit=200)
        return s.FamilyComparison(
            gpu=gpus[0].name, problem=problem_out(p), cublas_gflops=cublas, families=rows,
            runs=[self.run_out(r, with_counts=False) for r in runs],
        )  # fmt: skip

