"""Where a tuning run's wall time goes: one accumulator per command.

The main thread's time is split into exclusive phases: a phase entered inside another is
subtracted from the outer one, so the phases of the search loop add up to the loop's wall time
(``loop_s``; what no phase claims is ``other``). The GPU child's own work per candidate (load,
verify, time, as its bench reports them) runs beside the main thread and is summed separately
(``child``), with the kernel time the bench timed/verified (``kernel_s``).

Only ``time.perf_counter`` and dict additions: nothing here changes what is measured.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

# Main-thread phases, in the order a trial meets them (the report prints them so).
PROPOSE = "propose"      # the sampler's ask and the window's bookkeeping around it
PREPARE = "prepare"      # handing a config to the compile pool
COMPILE_WAIT = "compile_wait"  # blocked on a compile future
GPU_SEND = "gpu_send"    # handing a request to the GPU child
GPU_WAIT = "gpu_wait"    # blocked on the GPU child's answer
STORE = "store"          # storage writes: handing them to the writer thread, waiting on it
TELL = "tell"            # the in-memory study's tell
REPLACE = "replace"      # a faulted / hung / dead GPU child replaced (process + problem)
SETUP = "setup"          # one-time per shape: inputs + float64 reference, cuBLAS baseline
MAIN_PHASES = (PROPOSE, PREPARE, COMPILE_WAIT, GPU_SEND, GPU_WAIT, STORE, TELL, REPLACE)
# The writer thread's own time (tuner.search.writer): Optuna storage + results database writes,
# beside the main thread like the GPU child's, so not part of the main-thread sum.
STORE_BG = "store_bg"
# The next study's start-up prepared beside this one (tuner.search.prefetch): its process's
# wall time. The main thread's wait for it, where it is not ready, stays in the study start.
STARTUP_BG = "startup_bg"
BACKGROUND_PHASES = (STORE_BG, STARTUP_BG)
# The main thread's wait for a start-up prepared ahead that was not ready when its study was
# built: already inside ``other`` (a study built while the one before drains) or the study
# start, so reported beside the rows, not as one.
STARTUP_WAIT = "startup_wait"
# Outside the study loops, where the command's one-time start and each study's set-up go
# (bench/throughput.py prints them as parts of the start and of the study starts).
START_IMPORTS = "start_imports"  # the search's and stores' imports, the bundled recordings, the model's library
START_WAIT = "start_wait"        # then waiting for the GPU child (CUDA, cuBLAS) and the compile processes
STUDY_STORAGE = "study_storage"  # a study's shared history, warm start and run record (the databases)
STUDY_MODEL = "study_model"      # the model's examples and fit, where not made ahead
STUDY_PRIOR = "study_prior"      # the static prior's ranking (its compiles), where not made ahead
START_PARTS = (START_IMPORTS, START_WAIT)
STUDY_PARTS = (STARTUP_WAIT, STUDY_STORAGE, STUDY_MODEL, STUDY_PRIOR)
# Phases whose (start, end) are kept too: a GPU-busy share leaves the one-time setup out; a
# start-up's wait is charged to the study whose span holds it.
SPANNED = (SETUP, STARTUP_WAIT)


@dataclass
class Phases:
    """Seconds per phase, and counts. Not thread-safe: the tuner's main thread only."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    child: dict[str, float] = field(default_factory=dict)  # the GPU child's phases, summed
    kernel_s: float = 0.0  # kernel time the bench timed or verified, summed
    loop_s: float = 0.0  # wall time inside study loops
    loops: list[tuple[float, float]] = field(default_factory=list)  # (start, end), monotonic
    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # SPANNED ones
    trials: int = 0  # measurements recorded by the study loops (compile errors included)
    answers: int = 0  # candidates the GPU child answered
    round_trip_s: float = 0.0  # from posting each of them to reading its answer, summed
    child_spans: list[tuple[float, float]] = field(default_factory=list)  # (start, end) each
    every_span: bool = False  # keep every phase's spans, not only SPANNED's (a bench's timeline)
    _stack: list[list[float]] = field(default_factory=list)  # [start, nested seconds]

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Exclusive time of the block (time spent in phases nested in it goes to those)."""
        frame = [time.perf_counter(), 0.0]
        self._stack.append(frame)
        wall = time.monotonic()
        try:
            yield
        finally:
            self._stack.pop()
            total = time.perf_counter() - frame[0]
            self.add(name, total - frame[1])
            if self._stack:
                self._stack[-1][1] += total
            if name in SPANNED or self.every_span:
                self.spans.setdefault(name, []).append((wall, time.monotonic()))

    def add(self, name: str, seconds: float, count: int = 1) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + count

    @contextmanager
    def loop(self) -> Iterator[None]:
        """A study's search loop: its wall time is what the main phases divide."""
        start_wall, start = time.monotonic(), time.perf_counter()
        try:
            yield
        finally:
            self.loop_s += time.perf_counter() - start
            self.loops.append((start_wall, time.monotonic()))

    def add_child(self, phases: Mapping[str, float] | None, kernel_s: float | None,
                  round_trip_s: float = 0.0, span: tuple[float, float] | None = None) -> None:
        """One answer of the GPU child: its per-phase seconds, the kernel time it ran, how long
        the request took from posting to its answer being read (queueing included), and when
        the child worked on it (``time.monotonic``, the same clock in every process)."""
        self.answers += 1
        self.round_trip_s += round_trip_s
        if span is not None:
            self.child_spans.append((float(span[0]), float(span[1])))
        for name, seconds in (phases or {}).items():
            self.child[name] = self.child.get(name, 0.0) + float(seconds)
        self.kernel_s += float(kernel_s or 0.0)

    def in_loop(self) -> float:
        """Main-thread seconds attributed to a phase inside the study loops."""
        return sum(self.seconds.get(name, 0.0) for name in MAIN_PHASES)

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": dict(self.seconds), "counts": dict(self.counts),
                "child": dict(self.child), "kernel_s": self.kernel_s, "loop_s": self.loop_s,
                "other_s": self.loop_s - self.in_loop(), "trials": self.trials,
                "answers": self.answers, "round_trip_s": self.round_trip_s}
