"""What ``python -m tuner`` was told, parsed at the edge (tuner.run.cli) into small frozen parts.

Each part goes only where it is used: the budget to the studies, the store settings to what
opens the results database and the Optuna storage, the evaluator settings to what starts the
GPU child and the compile pool, the worker settings to the job loop. Nothing past the command
line sees an ``argparse.Namespace``. The defaults and exit codes live here too, so that every
entry piece (tune, replay, worker) takes them from one place and none imports the parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from tuner.measure.live import DEFAULT_BACKEND, DEFAULT_TRIAL_TIMEOUT_S
from tuner.problem import Problem

if TYPE_CHECKING:  # the search imports Optuna and the database layer: not while parsing
    from tuner.search.study import Budget

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# With 40 trials and patience 15, the default command took 352 s on an H100 (most studies
# stopped on patience, those at 4096^3 on time); these leave the time budget below to bind.
DEFAULT_TRIALS = 80
DEFAULT_PATIENCE = 25
# With no --timeout the studies share this much wall time (what is left over from a study that
# stops early passes to the next), so the default command ends in about 15 minutes including
# start-up, cuBLAS baselines and references.
DEFAULT_TOTAL_SECONDS = 780.0
DEFAULT_JOB_SECONDS = 780.0  # a job's studies share this wall time unless its budget says
DEFAULT_DRY_RUN_CONFIGS = 5
# A shape's fastest configs are timed this many more times at its end (tuner.run.retime)
DEFAULT_RETIME_ROUNDS = 3
DEFAULT_POLL_S = 10.0
DEFAULT_HEARTBEAT_S = 30.0
# db.DEFAULT_STALE_AFTER_S, the default readers apply to runs that recorded none; not imported
# from db, which parsing must not load (tests/test_tuner_cli.py keeps the two equal).
DEFAULT_STALE_AFTER_S = 300.0


@dataclass(frozen=True)
class BudgetOptions:
    """--trials, --timeout, --budget, --patience: how long each study may search."""

    trials: int = DEFAULT_TRIALS  # measured configs per study, over all its runs
    timeout_s: float | None = None  # per study in this run; None: the studies share total_s
    patience: int = DEFAULT_PATIENCE  # 0: the rule is off
    total_s: float = DEFAULT_TOTAL_SECONDS  # shared by the studies unless timeout_s is given

    def study_budget(self) -> Budget:
        from tuner.search.study import Budget

        return Budget(trials=self.trials, timeout_s=self.timeout_s,
                      patience=self.patience or None)

    def total_seconds(self) -> float | None:
        """The wall time the command's studies share (None: --timeout bounds each instead)."""
        return None if self.timeout_s is not None else self.total_s

    def for_job(self, job_budget: Mapping[str, Any]) -> tuple[Budget, float | None]:
        """A job's study budget and shared wall time: what the job's budget gives, these options
        where it gives nothing."""
        from tuner.search.study import Budget

        patience = job_budget.get("patience", self.patience)
        budget = Budget(trials=job_budget.get("trials", self.trials), timeout_s=self.timeout_s,
                        patience=patience or None)
        total = job_budget.get("total_seconds")
        if total is None and budget.timeout_s is None:
            total = DEFAULT_JOB_SECONDS
        return budget, total


@dataclass(frozen=True)
class SearchOptions:
    """--sampler, --seed: how each study proposes configs; --retime-rounds: how a shape's
    fastest configs are timed again before one is picked."""

    sampler: str = "default"
    seed: int = 0
    retime_rounds: int = DEFAULT_RETIME_ROUNDS


@dataclass(frozen=True)
class StoreOptions:
    """--db, --storage, --claim-trials, --heartbeat, --stale-after: where results go and how
    several workers share them."""

    db_url: str | None = None  # None: $GEMMTUNE_DB, else the default file (db.resolve_url)
    storage_url: str | None = None  # --storage or $GEMMTUNE_STORAGE; None: the results database
    claim_trials: bool | None = None  # None: on for a server storage, off for SQLite
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    stale_after_s: float = DEFAULT_STALE_AFTER_S


@dataclass(frozen=True)
class EvaluatorOptions:
    """--gpu, --cache, --workers, --trial-timeout and $GEMMTUNE_GPU_BACKEND: how candidates are
    compiled and measured."""

    gpu: int = 0
    gpus: tuple[int, ...] | str | None = None  # --gpus: several, or "all"; None: gpu alone
    cache_dir: Path | None = None  # --cache or $GEMMTUNE_CACHE; None: kernels' default folder
    workers: int | None = None  # compile processes; None: CPU cores - 2 (live.default_workers)
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    backend: str = DEFAULT_BACKEND  # what the GPU child measures with (tuner.measure.live)

    @property
    def devices(self) -> int | tuple[int, ...] | str:
        """What the live evaluator measures on: --gpus where given, else --gpu."""
        return self.gpu if self.gpus is None else self.gpus

    def describe(self) -> str:
        """The GPU(s) for a message: "GPU 0", "GPUs 0,1", "all GPUs"."""
        if self.gpus is None:
            return f"GPU {self.gpu}"
        return "all GPUs" if isinstance(self.gpus, str) else f"GPUs {','.join(map(str, self.gpus))}"


@dataclass(frozen=True)
class WorkerOptions:
    """--poll, --once, --max-jobs: the job loop of ``--worker``."""

    poll_s: float = DEFAULT_POLL_S
    once: bool = False
    max_jobs: int | None = None


@dataclass(frozen=True)
class DryRunOptions:
    """--dry-run-configs, --arch: what ``--dry-run`` compiles."""

    configs: int = DEFAULT_DRY_RUN_CONFIGS
    arch: str = "sm_90"


@dataclass(frozen=True)
class Options:
    """The whole command line, checked. ``families`` and ``problems`` are what to tune, defaults
    filled in; ``kernels_named`` / ``shapes_named`` say whether the user chose them (a replay
    otherwise takes the recorded ones, and a worker refuses shapes)."""

    families: list[Any]  # kernels.Family objects, in the order given
    problems: list[Problem]
    kernels_named: bool = False
    shapes_named: bool = False
    mode: str = "tune"  # "tune" | "worker" | "dry-run"
    replay: str | None = None  # a recording to answer from instead of a GPU
    command: str = "python -m tuner"  # the command line, as each run stores it
    verbose: int = 0
    budget: BudgetOptions = field(default_factory=BudgetOptions)
    search: SearchOptions = field(default_factory=SearchOptions)
    stores: StoreOptions = field(default_factory=StoreOptions)
    evaluator: EvaluatorOptions = field(default_factory=EvaluatorOptions)
    worker: WorkerOptions = field(default_factory=WorkerOptions)
    dry_run: DryRunOptions = field(default_factory=DryRunOptions)
    workload: tuple[str, dict] | None = None  # --workload: (its file name, its document)
    # Each problem's weight in a --budget's time shares (a workload's share of GEMM time);
    # empty: every study an equal share.
    weights: dict[Problem, float] = field(default_factory=dict)
