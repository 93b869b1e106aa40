"""The API's side of the tuning-job queue: `db.Database` job calls turned into response models.

Like api/reads.py for results, this is the one place the job routes, /api/best?tune=true and the
jobs page reach the database through; it validates what the database cannot know (kernel family
names) and words every refusal with what is allowed.
"""

from __future__ import annotations

import db
import kernels

from . import schemas as s
from .errors import ApiError


def job_out(j: db.Job) -> s.JobOut:
    return s.JobOut(
        id=j.id, state=j.state, gpu=j.gpu_name, m=j.m, n=j.n, k=j.k, dtype=j.dtype, layout=j.layout, batch=j.batch,
        general_alpha_beta=j.general_alpha_beta, families=list(j.families), budget=dict(j.budget), origin=j.origin,
        reason=j.reason, worker=j.worker, attempts=j.attempts, run_ids=list(j.run_ids), created_at=j.created_at,
        claimed_at=j.claimed_at, heartbeat_at=j.heartbeat_at, ended_at=j.ended_at,
    )  # fmt: skip


class JobQueue:
    def __init__(self, database: db.Database) -> None:
        self.db = database

    def known_gpu_models(self) -> list[str]:
        return sorted({g.name for g in self.db.list_gpus()})

    def check_families(self, families: list[str] | None) -> list[str]:
        """Family names as the kernels package spells them (any case accepted); 422 for others."""
        found = []
        by_lower = {name.lower(): name for name in kernels.FAMILIES}
        for name in families or []:
            if name.lower() not in by_lower:
                raise ApiError(
                    422, f"unknown kernel family {name!r} in 'families'; allowed: {', '.join(kernels.FAMILIES)}",
                    list(kernels.FAMILIES),
                )
            found.append(by_lower[name.lower()])
        return found

    def enqueue(
        self, gpu: str, m: int, n: int, k: int, *, families: list[str] | None, budget: dict, origin: str,
        layout: str = "nn", batch: int = 1,
    ) -> tuple[s.JobOut, bool]:
        """Queue a job (or find the open one for this GPU model and problem): (job, created)."""
        names = self.check_families(families)
        try:
            job, created = self.db.enqueue_job(gpu, m, n, k, families=names, budget=budget, origin=origin,
                                               layout=layout, batch=batch)
        except db.UnknownGpuError:
            known = self.known_gpu_models()
            raise ApiError(
                422,
                f"unknown GPU model {gpu!r}; known: {', '.join(known) or '(none yet)'}. A GPU model is known once a "
                "tuner or worker has run on it (python -m tuner --worker registers its GPU when it starts)",
                known,
            ) from None
        return job_out(job), created

    def get(self, job_id: int) -> s.JobOut:
        try:
            return job_out(self.db.get_job(job_id))
        except db.UnknownJobError:
            raise ApiError(404, f"unknown job id {job_id}; see /api/jobs for the known ones") from None

    def list(self, *, state: str | None, gpu: str | None, offset: int, limit: int) -> list[s.JobOut]:
        try:
            found = self.db.list_jobs(state=state, gpu=gpu, offset=offset, limit=limit)
        except db.UnknownGpuError:
            known = self.known_gpu_models()
            raise ApiError(404, f"unknown GPU {gpu!r}; known GPU models: {', '.join(known) or '(none yet)'}", known) from None
        return [job_out(j) for j in found]

    def counts(self) -> dict[str, int]:
        return self.db.count_jobs()
