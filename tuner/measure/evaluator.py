"""The one interface the search loop measures through.

Implementations: ``tuner.measure.live.LiveEvaluator`` (compile pool + GPU child process),
``tuner.measure.replay.ReplayEvaluator`` (answers from a recording) and
``tuner.measure.testing.StandInEvaluator`` (an analytic model for CPU tests).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from tuner.measure import phases as timing  # (a module: this one's capitals are the states)
from tuner.problem import Problem

# Trial states, spelled as db.TRIAL_STATES (checked by tests/test_trial_result.py).
OK = "ok"
REJECTED = "rejected"
COMPILE_ERROR = "compile_error"
LAUNCH_ERROR = "launch_error"
WRONG_RESULT = "wrong_result"
TIMEOUT = "timeout"
CRASHED = "crashed"
MISSING = "missing"


@dataclass(frozen=True)
class Measurement:
    """What one evaluation produced: the fields of ``db.TRIAL_RESULT`` (the one definition of
    a trial's result, with their units), in its order, held against it by
    tests/test_trial_result.py. Only ``sm_clock_mhz`` is wider here: the clock as measured, which
    the study rounds to whole MHz when it stores the trial."""

    state: str
    error: str | None = None
    compile_seconds: float | None = None
    registers: int | None = None
    shared_bytes: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None
    time_min_ms: float | None = None
    time_median_ms: float | None = None
    time_max_ms: float | None = None
    launches: int | None = None
    gflops: float | None = None
    sm_clock_mhz: float | None = None

    @property
    def usable(self) -> bool:
        """Only a verified, timed result may ever become the best."""
        return (self.state == OK and self.gflops is not None and self.gflops > 0
                and self.time_median_ms is not None and self.time_median_ms > 0)

    def fields(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Baseline:
    library: str
    time_median_ms: float
    gflops: float
    sm_clock_mhz: float | None = None


class Evaluator(Protocol):
    def info(self) -> dict[str, Any]:
        """The GPU: the fields of ``db.GpuInfo``."""
        ...

    def arch(self) -> str:
        """The compile target, e.g. ``"sm_90"``."""
        ...

    def set_problem(self, problem: Problem) -> None: ...

    def baseline(self) -> Baseline: ...

    def prepare(self, family: Any, config: dict[str, int]) -> None:
        """A hint that ``evaluate(family, config, …)`` follows soon (start compiling now)."""
        ...

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Measurement: ...

    def close(self) -> None: ...


# A prepared candidate the search lets go without measuring it (its study ended): an evaluator
# may offer ``discard(family, config)`` to drop its compile (cancelled where not begun).

# Asynchronous measurement (docs/measurement.md, "The GPU child's queue"). An evaluator may offer ``submit(family, config, problem)
# -> ticket`` and ``collect(ticket) -> Measurement`` (answered in submission order) and
# ``tickets``: how many it takes at once, all its GPUs together. These helpers give every other
# evaluator the same shape: one ticket, measured at collect, exactly as a plain ``evaluate`` call.


def tickets(evaluator: Any) -> int:
    return max(1, int(getattr(evaluator, "tickets", 1)))


def asynchronous(evaluator: Any) -> bool:
    """Whether the evaluator measures while its caller goes on (a GPU child): else each
    evaluation runs inside the call (a replay, the CPU stand-in)."""
    return hasattr(evaluator, "submit")


def submit(evaluator: Any, family: Any, config: dict[str, int], problem: Problem) -> Any:
    if asynchronous(evaluator):
        return evaluator.submit(family, config, problem)
    return functools.partial(evaluator.evaluate, family, config, problem)


def collect(evaluator: Any, ticket: Any, phases: timing.Phases) -> Measurement:
    if hasattr(evaluator, "collect"):
        return evaluator.collect(ticket)  # it accounts its own waits
    with phases.timed(timing.GPU_WAIT):  # a synchronous evaluator: the whole evaluation is the wait
        return ticket()
