"""Shared by the API, dashboard and load tests: a results database written by the tuner's own code.

Holds no tests itself. `tune_into` drives `tuner.search.study.run_study` (the real search loop, Optuna
and all) with `tuner.measure.testing.StandInEvaluator`, which plants failures for some configs, so the
database holds exactly what a real tuning session would write: runs, ok/rejected/failed trials,
cuBLAS baselines, Optuna's tables beside ours.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import db
import httpx
import kernels

ROOT = Path(__file__).resolve().parents[1]
STANDIN_GPU = "Stand-in GPU (analytic model)"


@dataclass(frozen=True)
class Tuned:
    url: str
    run_ids: list[int]


def _planted_fault(config: dict[str, int]) -> str | None:
    """Fail a deterministic slice of configs, in several ways, so failure breakdowns are non-empty."""
    h = sum(v * (i + 1) for i, v in enumerate(config.values())) % 11
    return {0: "wrong_result", 1: "compile_error", 2: "launch_error"}.get(h)


def tune_into(
    url: str,
    jobs: list[tuple[str, tuple[int, int, int]]],
    trials: int = 12,
    gpu_name: str = STANDIN_GPU,
    gpu_uuid: str = "GPU-00000000-stand-in",
) -> Tuned:
    """Run one short search per (family, (m, n, k)) on the stand-in GPU, recording into `url`."""
    import optuna
    from tuner.measure.testing import StandInEvaluator
    from tuner.problem import Problem
    from tuner.search.study import Budget, Session, run_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    database = db.open_database(url)
    evaluator = StandInEvaluator(gpu_name=gpu_name, gpu_uuid=gpu_uuid, fault=_planted_fault)
    gpu_id = database.ensure_gpu(db.GpuInfo(**evaluator.info()))
    storage = optuna.storages.RDBStorage(url)
    session = Session(
        database=database, evaluator=evaluator, storage=storage, gpu_id=gpu_id, gpu_name=gpu_name,
        sampler="tpe", seed=0, progress=False, host="test-host", command="pytest tune_into",
    )  # fmt: skip
    run_ids = []
    for family_name, (m, n, k) in jobs:
        problem = Problem(m, n, k)
        problem_id = database.ensure_problem(m, n, k)
        evaluator.set_problem(problem)
        base = evaluator.baseline()
        database.add_baseline(
            gpu_id=gpu_id, problem_id=problem_id, library=base.library, time_median_ms=base.time_median_ms,
            gflops=base.gflops, sm_clock_mhz=base.sm_clock_mhz,
        )  # fmt: skip
        outcome = run_study(
            session, kernels.FAMILIES[family_name], problem, Budget(trials=trials, timeout_s=60, patience=None),
            baseline_gflops=base.gflops,
        )  # fmt: skip
        run_ids.append(outcome.run_id)
    storage.engine.dispose()
    database.close()
    return Tuned(url, run_ids)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m api` in a subprocess on a free loopback port: the real uvicorn, as deployed."""

    def __init__(self, url: str | None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "api", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        if url is not None:  # None: the server finds the database itself (GEMMTUNE_DB, then the default)
            cmd += ["--db", url]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"api server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base}/api/gpus", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("api server did not answer within 30 s")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
