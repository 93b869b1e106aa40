"""Workloads: the FP32 GEMMs a PyTorch program runs, counted and timed per problem, in a file the
tuner tunes from (``python -m tuner --gpu 0 --workload FILE``, largest share of GEMM time first).

    with gemmtune.record_workload("workload.json"):
        model(x).sum().backward()                # what runs is recorded, and runs as before
    python -m gemmtune profile train.py -o workload.json [-- script args]

A recorded problem is (M, N, K, layout, batch) as the kernels see it (kernels/layout.py), with
the number of calls, the aten operators that issued them and the GPU time they took (CUDA events
around each call, read once at the end; while a stream is being captured into a CUDA graph,
calls are counted but not timed). The file format is db/workloads.py's. Calls whose operands the
kernels cannot take (not float32, strides with no unit dimension) are counted under "skipped"
with their reason, so a workload says how much of its GEMM time no tuned kernel could serve.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from db.workloads import FORMAT, VERSION, write_workload

from .switch import observing
from .torchpath import T, describe, init_torch

TIMED_PER_PROBLEM = 200  # event pairs kept per problem (their median times the count: a cold first call does not count)


# A recorded problem: (m, n, k, layout, batch)
Problem = tuple[int, int, int, str, int]


@dataclass
class _Seen:
    count: int = 0
    operators: dict[str, int] = field(default_factory=dict)
    events: list[tuple[Any, Any]] = field(default_factory=list)


def problem_of(op: str, args: tuple) -> Problem | str:
    """The problem an aten GEMM call poses, or why the kernels cannot take it."""
    a, b = (args[0], args[1]) if op.startswith(("mm", "bmm")) else (args[1], args[2])
    if not T.ready:
        init_torch()
    pa, pb = describe(a), describe(b)
    if pa is None or pb is None:
        import torch

        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return "not tensors"
        if a.dtype != torch.float32 or b.dtype != torch.float32:
            return f"dtype {a.dtype if a.dtype != torch.float32 else b.dtype}"
        if not (a.is_cuda and b.is_cuda):
            return "not on a CUDA device"
        return "strides with no unit dimension"
    if pa.cols != pb.rows:
        return "shapes that do not multiply"
    layout = ("t" if pa.transposed else "n") + ("t" if pb.transposed else "n")
    return (pa.rows, pb.cols, pa.cols, layout, max(pa.batch, pb.batch))


class Recorder:
    """Counts and times the GEMMs run while it observes (see record_workload)."""

    def __init__(self) -> None:
        self.seen: dict[Problem, _Seen] = {}
        self.skipped: dict[str, int] = {}
        self.gpu: str | None = None
        self._lock = threading.Lock()

    def __call__(self, op: str, args: tuple, kwargs: dict, run: Any) -> Any:
        import torch

        found = problem_of(op, args)
        with self._lock:
            if isinstance(found, str):
                self.skipped[found] = self.skipped.get(found, 0) + 1
                return run()
            seen = self.seen.setdefault(found, _Seen())
            seen.count += 1
            seen.operators[f"aten::{op}"] = seen.operators.get(f"aten::{op}", 0) + 1
            timed = len(seen.events) < TIMED_PER_PROBLEM and not torch.cuda.is_current_stream_capturing()
        if self.gpu is None:
            self.gpu = torch.cuda.get_device_name(args[0].device if op.startswith(("mm", "bmm")) else args[1].device)
        if not timed:
            return run()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = run()
        stop.record()
        with self._lock:
            seen.events.append((start, stop))
        return result

    def workload(self, label: str = "") -> dict[str, Any]:
        """The recorded workload as the file holds it (waits for the timed calls to finish)."""
        import torch

        rows = []
        with self._lock:
            for (m, n, k, layout, batch), seen in self.seen.items():
                times = []
                for start, stop in seen.events:
                    stop.synchronize()
                    times.append(start.elapsed_time(stop))
                typical = statistics.median(times) if times else 0.0
                rows.append({"m": m, "n": n, "k": k, "layout": layout, "batch": batch, "count": seen.count,
                             "time_ms": typical * seen.count, "operators": dict(sorted(seen.operators.items()))})
        total = sum(r["time_ms"] for r in rows)
        for r in rows:
            r["share"] = r["time_ms"] / total if total > 0 else 0.0
        rows.sort(key=lambda r: (-r["time_ms"], r["m"], r["n"], r["k"]))
        return {"format": FORMAT, "version": VERSION,
                "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "gpu": self.gpu, "label": label, "torch": torch.__version__, "gemm_ms": total,
                "skipped": dict(sorted(self.skipped.items())), "problems": rows}


@contextlib.contextmanager
def record_workload(path: str | Path | None = None, *, label: str = "") -> Iterator[Recorder]:
    """Record the FP32 CUDA GEMMs run inside the block; written to `path` (if given) at the end.
    Works with the switch on or off (it records what runs either way)."""
    recorder = Recorder()
    with observing(recorder):
        yield recorder
    if path is not None:
        write_workload(recorder.workload(label), path)
