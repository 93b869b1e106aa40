"""gemmtune's result database: GPUs, problems, kernel families, runs, trials, baselines.

See ARCHITECTURE.md ("tuner → db contract") and README.md ("Result database").
"""

from .database import Database, open_database
from .errors import (InvalidInputError, NotADatabaseError, SchemaTooNewError, StorageError,
                     UnknownGpuError, UnknownRunError)
from .jobs import (JOB_BUDGET_LIMITS, JOB_ORIGINS, MAX_JOB_ATTEMPTS, Job,
                   UnknownJobError)
from .queries import log2_distance
from .records import (Baseline, BestResult, FamilyVersion, Gpu, GpuInfo, MeasuredConfig,
                      NearestProblem, OverviewCell, Problem, Run, Trial, TrialRecord)
from .records import TRIAL_RESULT, ResultField  # the one definition of a trial's result
from .states import DEFAULT_STALE_AFTER_S, DTYPES, JOB_STATES, LAYOUTS, RUN_STATES, TRIAL_STATES
from .urls import default_url, resolve_url
from .workloads import Workload, WorkloadError, WorkloadProblem, read_workload, write_workload

__all__ = [
    "Database", "open_database", "default_url", "resolve_url",
    "GpuInfo", "TrialRecord", "TRIAL_RESULT", "ResultField",
    "Gpu", "Problem", "FamilyVersion", "Run", "Trial", "Baseline", "BestResult",
    "NearestProblem", "OverviewCell", "MeasuredConfig",
    "TRIAL_STATES", "RUN_STATES", "DTYPES", "LAYOUTS", "DEFAULT_STALE_AFTER_S",
    "InvalidInputError", "UnknownRunError", "UnknownGpuError",
    "StorageError", "NotADatabaseError", "SchemaTooNewError",
    "log2_distance",
    "Job", "JOB_STATES", "JOB_ORIGINS", "JOB_BUDGET_LIMITS", "MAX_JOB_ATTEMPTS", "UnknownJobError",
    "Workload", "WorkloadError", "WorkloadProblem", "read_workload", "write_workload",
]
