"""The closed vocabularies of trial and run states (ARCHITECTURE.md, "Names that carry through")."""

from __future__ import annotations

from kernels.layout import LAYOUTS as KERNEL_LAYOUTS

TRIAL_STATES: tuple[str, ...] = (
    "ok",  # verified against the float64 reference and timed
    "rejected",  # the family's constraints refused the config before compiling
    "compile_error",
    "launch_error",
    "wrong_result",  # ran, but failed verification
    "timeout",
    "crashed",  # the evaluator's child process died
    "missing",  # replay: the config is absent from the recording
)

RUN_STATES: tuple[str, ...] = ("running", "finished", "interrupted", "failed")

# A tuning job (db/jobs.py): queued → running (claimed by a worker) → done | failed; a running
# job goes back to queued when its worker stops on Ctrl-C, and may be claimed again by another
# worker once its heartbeat is stale (its worker died).
JOB_STATES: tuple[str, ...] = ("queued", "running", "done", "failed")

# A running run or job whose heartbeat is older than this belongs to a dead worker; a run keeps
# the stale-after time its tuner was started with (gt_runs.stale_after_s), older runs use this.
DEFAULT_STALE_AFTER_S = 300.0

# A run leaves "running" once, for one of these.
END_STATES: tuple[str, ...] = tuple(s for s in RUN_STATES if s != "running")

# Problem vocabularies the kernels implement today; a typo ("float32") is refused, not stored.
# Layouts (how A and B are stored: "nn", "nt", "tn", "tt") are the kernels' own.
DTYPES: tuple[str, ...] = ("fp32",)
LAYOUTS: tuple[str, ...] = KERNEL_LAYOUTS
