"""The dispatch decision (which kernel, or the library's GEMM, and why) and its per-process cache.

GPU-free: the GPU model and architecture come in as strings, so tests drive it with real
databases, packs and API servers on a CPU-only machine.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import kernels
from kernels.layout import problem_label

from .answers import Answer, Source, SourceUnavailable
from .precision import check_precision, refusal
from .sources import default_spec, open_source

RETRY_UNAVAILABLE_S = 60.0  # an unreachable source is asked again after this long, not per call


@dataclass(frozen=True)
class Choice:
    """What `matmul` runs for one (device, problem, precision, source), and why (see `explain`);
    a problem is the shape, the layout and the batch count."""

    kind: Literal["kernel", "library"]
    reason: str
    source: str  # the source's label (no passwords)
    gpu: str
    requested: tuple[int, int, int]
    precision: str
    match: Literal["exact", "nearest", "none"] = "none"
    family: str | None = None
    config: dict[str, int] | None = None
    source_hash: str | None = None
    tuned_shape: tuple[int, int, int] | None = None
    distance: float | None = None
    gflops: float | None = None
    cublas_gflops: float | None = None
    run_id: int | None = None
    trial_id: int | None = None
    notes: tuple[str, ...] = ()
    unavailable: str | None = None  # set when the source could not be read
    layout: str = "nn"
    batch: int = 1
    expires: float | None = field(default=None, repr=False, compare=False)  # monotonic time; None: never
    kernel_family: kernels.Family | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        m, n, k = self.requested
        head = (f"{problem_label(m, n, k, self.layout, self.batch)} fp32 (precision {self.precision}) on {self.gpu} "
                f"via {self.source}: ")
        notes = "".join(f"; {note}" for note in self.notes)
        if self.kind == "library":
            return head + f"library GEMM, because {self.reason}" + notes
        shape = "x".join(map(str, self.tuned_shape or ()))
        return (head + f"{self.family} {self.config} ({self.match} match, tuned on {shape}, trial {self.trial_id} "
                f"of run {self.run_id}, {self.gflops:.0f} GFLOP/s" +
                (f" vs cuBLAS {self.cublas_gflops:.0f})" if self.cublas_gflops else ")") + notes)


def decide(answer: Answer, *, gpu: str, requested: tuple[int, int, int], precision: str, source: str,
           arch: str, layout: str = "nn", batch: int = 1, exact_only: bool = False) -> Choice:
    """Turn a source's answer into a choice: the tuned kernel, unless there is none, cuBLAS was
    measured faster on that problem, the installed family refuses the config on this arch, or
    (exact_only) it was tuned on another problem only."""
    base = dict(source=source, gpu=gpu, requested=requested, precision=precision, notes=answer.notes,
                layout=layout, batch=batch)
    e = answer.entry
    if e is None:
        return Choice("library", answer.why_none or "nothing tuned", **base)
    found = dict(match=e.match, family=e.family, config=dict(e.config), source_hash=e.source_hash,
                 tuned_shape=e.shape, distance=e.distance, gflops=e.gflops, cublas_gflops=e.cublas_gflops,
                 run_id=e.run_id, trial_id=e.trial_id)
    if exact_only and e.match != "exact":
        return Choice("library", f"tuned only on other shapes (nearest {problem_label(*e.shape, layout, e.batch)}); "
                                 "the switch runs kernels tuned on the problem itself", **base, **found)
    if e.cublas_gflops is not None and e.cublas_gflops > e.gflops:
        return Choice("library", f"cuBLAS measured {e.cublas_gflops:.0f} GFLOP/s on {e.shape}, faster than the best "
                                 f"tuned kernel ({e.family}, {e.gflops:.0f} GFLOP/s)", **base, **found)
    refused = refusal(e.family, e.config, arch)  # a source given the arch has passed over these already
    if refused is not None:
        return Choice("library", refused, **base, **found)
    why = "tuned on this shape" if e.match == "exact" else f"nearest tuned shape (log2 distance {e.distance:.2f})"
    return Choice("kernel", why, **base, **found, kernel_family=kernels.FAMILIES[e.family])


class Dispatcher:
    """Choices cached per (device, m, n, k, layout, batch, precision, source, exact only): after
    the first call for a key,
    a lookup is one dict read (no lock, no database). Misses are looked up under one lock so
    concurrent first calls ask the source once."""

    def __init__(self) -> None:
        self._choices: dict[tuple, Choice] = {}
        self._sources: dict[Any, Source] = {}
        self._lock = threading.RLock()
        self._warned: set[str] = set()

    def clear(self) -> None:
        with self._lock:
            self._choices.clear()
            self._sources.clear()
            self._warned.clear()

    def source(self, source: str | Source | None) -> tuple[Any, Source]:
        """(cache key, source object) for a spelling, None (GEMMTUNE_SOURCE / the tuner's default
        database) or a source object."""
        if source is None:
            source = default_spec()
        key = source if isinstance(source, str) else ("object", id(source))
        found = self._sources.get(key)
        if found is None:
            with self._lock:
                found = self._sources.get(key)
                if found is None:
                    found = open_source(source) if isinstance(source, str) else source
                    if not callable(getattr(found, "lookup", None)):
                        raise TypeError(f"source must be a string or an object with lookup(); got {type(source).__name__}")
                    self._sources[key] = found
        return key, found

    def cached(self, key: tuple) -> Choice | None:
        """The cached choice for (device, m, n, k, layout, batch, precision, source spelling or
        None, exact only) while it is valid; None otherwise (then call choose)."""
        choice = self._choices.get(key)
        if choice is None or choice.expires is not None:
            return None
        return choice

    def choose(self, *, device: int, gpu: str, arch: str, m: int, n: int, k: int, precision: str,
               source: str | Source | None, strict: bool = False, layout: str = "nn", batch: int = 1,
               exact_only: bool = False) -> Choice:
        key = (device, m, n, k, layout, batch, precision,
               source if source is None or isinstance(source, str) else id(source), exact_only)
        choice = self._choices.get(key)
        if choice is None or (choice.expires is not None and choice.expires < time.monotonic()):
            with self._lock:
                choice = self._choices.get(key)
                if choice is None or (choice.expires is not None and choice.expires < time.monotonic()):
                    choice = self._look_up(gpu, arch, (m, n, k), check_precision(precision), source, strict,
                                           layout, batch, exact_only)
                    self._choices[key] = choice
        if choice.unavailable and strict:
            raise SourceUnavailable(choice.unavailable)
        return choice

    def _look_up(self, gpu: str, arch: str, requested: tuple[int, int, int], precision: str,
                 source: str | Source | None, strict: bool, layout: str = "nn", batch: int = 1,
                 exact_only: bool = False) -> Choice:
        _, src = self.source(source)
        label = getattr(src, "label", repr(src))
        try:
            answer = src.lookup(gpu, *requested, precision, layout, batch, arch)
        except SourceUnavailable as exc:
            if strict:
                raise
            msg = str(exc)
            if msg not in self._warned:  # one warning per problem, not one per call
                self._warned.add(msg)
                warnings.warn(f"gemmtune: {msg}; using the library GEMM instead", RuntimeWarning, stacklevel=5)
            return Choice("library", f"the source is unavailable: {msg}", source=label, gpu=gpu, requested=requested,
                          precision=precision, unavailable=msg, expires=time.monotonic() + RETRY_UNAVAILABLE_S,
                          layout=layout, batch=batch)
        return decide(answer, gpu=gpu, requested=requested, precision=precision, source=label, arch=arch,
                      layout=layout, batch=batch, exact_only=exact_only)


DISPATCHER = Dispatcher()
