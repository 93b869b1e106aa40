"""What a tuning source answers (sources.py, pack.py): the best known config for a request, or
none and why; and the error of a source that cannot be read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


class SourceUnavailable(RuntimeError):
    """The source cannot be read (database unusable, API unreachable or erring, pack unreadable)."""


@dataclass(frozen=True)
class Entry:
    """The best known config for a request, as a source found it."""

    match: Literal["exact", "nearest"]
    shape: tuple[int, int, int]  # the shape it was measured on
    distance: float  # log2 distance from the requested shape (0 for exact; batch counts as a fourth size)
    gpu: str
    family: str
    source_hash: str
    config: dict[str, int]
    gflops: float
    cublas_gflops: float | None  # cuBLAS on the same GPU and tuned shape, where measured
    run_id: int | None = None
    trial_id: int | None = None
    trial_number: int | None = None
    batch: int = 1  # of the problem it was measured on


@dataclass(frozen=True)
class Answer:
    """What a source said: an entry, or none and why (unknown GPU, nothing tuned, stale only)."""

    entry: Entry | None
    why_none: str = ""
    notes: tuple[str, ...] = field(default=())  # e.g. "queued tuning job 7"


class Source(Protocol):
    label: str  # how explain() names it (passwords hidden)

    def lookup(self, gpu: str, m: int, n: int, k: int, precision: str, layout: str = "nn",
               batch: int = 1, arch: str | None = None) -> Answer:
        """The best config for the request; with `arch`, the best that the installed family
        accepts on that architecture (precision.runnable_on), not a faster one it would refuse."""
