"""Replay: an Evaluator that answers from a recording instead of a GPU.

``python -m tuner --replay FILE`` runs the normal search loop and writes the database exactly as
a live run would; the GPU identity, the cuBLAS baselines and every trial's measurement and
compile resources come from the recording. A config the recording lacks is answered with state
``missing``.

The search space of a replayed family is the recorded grid (``RecordedFamily``): the family's
own constraints still apply, so with a recording of the full accepted space of its grid every
config the search can propose was recorded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import kernels

from tuner.measure.evaluator import Baseline, Measurement
from tuner.measure.recording import (FamilyHeader, Recording, RecordingError, load,
                                     missing_measurement)
from tuner.measure.resources import Resources, Usage
from tuner.problem import Problem

log = logging.getLogger(__name__)


class RecordedFamily:
    """A kernel family as it was recorded: the current family's constraints and geometry, with
    the parameter values narrowed to the recorded grid and the recorded source hash (so results
    land under the source version that produced them)."""

    def __init__(self, family: Any, header: FamilyHeader) -> None:
        if tuple(p.name for p in family.params) != header.params:
            raise RecordingError(
                f"family {family.name!r}: the recording's parameters {list(header.params)} "
                f"differ from the current family's {[p.name for p in family.params]}")
        self.base = family
        self.header = header
        self.name: str = family.name
        self.source_hash: str = header.source_hash
        self.params = tuple(
            kernels.Param(p.name, tuple(v for v in p.values if v in header.grid[p.name]), p.doc)
            for p in family.params
        )

    def reject_reasons(self, config: Mapping[str, int], arch: str = "sm_90") -> list[str]:
        reasons = self.base.reject_reasons(config, arch)  # ConfigError for unknown values
        for name, values in self.header.grid.items():
            if config[name] not in values:
                reasons.append(f"{name}={config[name]} is outside the recorded grid "
                               f"{list(values)}")
        return reasons

    def accepts(self, config: Mapping[str, int], arch: str = "sm_90") -> bool:
        return not self.reject_reasons(config, arch)

    def __getattr__(self, name: str) -> Any:  # geometry, flops, threads, …: the family's own
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"<RecordedFamily {self.name}@{self.source_hash[:12]}>"


class ReplayEvaluator:
    """Evaluator over a recording. ``evaluations`` counts lookups (hits and misses)."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.problem: Problem | None = None
        self.evaluations = 0
        self.misses = 0

    @classmethod
    def open(cls, path: str | Path) -> ReplayEvaluator:
        return cls(load(path))

    def family(self, family: Any) -> RecordedFamily:
        header = self.recording.families.get(family.name)
        if header is None:
            raise RecordingError(
                f"the recording has no family {family.name!r}; it recorded "
                f"{', '.join(self.recording.families) or 'none'}")
        if header.source_hash != family.source_hash:
            log.warning("%s: recorded with source %s, the current source is %s; the replay "
                        "reports the recorded one", family.name, header.source_hash[:12],
                        family.source_hash[:12])
        return RecordedFamily(family, header)

    def problems(self) -> list[Problem]:
        """Every recorded problem, in the recording's order."""
        return [entry.problem for entry in self.recording.problems]

    def families(self) -> list[RecordedFamily]:
        """Every recorded family that the kernels package still has."""
        found = []
        for name in self.recording.families:
            if name in kernels.FAMILIES:
                found.append(self.family(kernels.FAMILIES[name]))
            else:
                log.warning("the recording's family %r is not a current kernel family", name)
        return found

    # ---- the Evaluator interface ---------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return dict(self.recording.gpu)

    def arch(self) -> str:
        return self.recording.arch

    def set_problem(self, problem: Problem) -> None:
        self.problem = problem

    def baseline(self) -> Baseline:
        if self.problem is None:
            raise RuntimeError("set_problem first")
        entry = self.recording.problem(self.problem)
        baseline = None if entry is None else entry.baseline_result()
        if baseline is None:
            # RuntimeError: the session then tunes without the cuBLAS fraction, as on a GPU
            # host without cuBLAS.
            raise RuntimeError(f"the recording has no cuBLAS baseline for {self.problem.shape}")
        return baseline

    def prepare(self, family: Any, config: dict[str, int]) -> None:
        pass  # nothing to compile ahead

    def evaluate(self, family: Any, config: dict[str, int], problem: Problem) -> Measurement:
        self.evaluations += 1
        result = self.recording.result(family.name, problem, config)
        if result is None:
            self.misses += 1
            return missing_measurement(family.name, problem)
        return result.measurement()

    def close(self) -> None:
        pass

    def compiled_usage(self, family: Any, problem: Problem) -> Resources:
        """Compile-time resources for the start-up prior as the recording holds them, i.e. from
        the compiler that built the recorded kernels (a local NVRTC of another version may
        allocate a few registers more or less, which moves configs across occupancy steps);
        None for a config that is absent or did not compile."""

        def usage(config: Mapping[str, int]) -> Usage | None:
            result = self.recording.result(family.name, problem, config)
            if result is None or result.registers is None:
                return None
            main = family.main_launch(dict(config), problem.m, problem.n, problem.k)
            return Usage(result.registers,
                         max(0, (result.shared_bytes or 0) - main.shared_bytes),
                         result.spill_bytes or 0)

        return usage

    def __enter__(self) -> ReplayEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

