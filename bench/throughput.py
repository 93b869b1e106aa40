"""Tuning throughput: where the tuner's wall time goes and how busy it keeps the GPU (issue 19).

    python bench/throughput.py --shape 2048x2048x2048 --timeout 15 [--family NAME ...]
        [--gpu 0 | --gpus 0,1] [--workers N] [--queue-depth 2] [--trials 80] [--patience 25]
        [--sampler default] [--cache DIR] [--out FILE]
    python bench/throughput.py --budget 780          # the default command itself

Runs the tuner's own code path (``python -m tuner``'s options, ``tuner.run.tune.tune``, the
live evaluator: compile pool + GPU child) on a fresh temporary SQLite database, every study
with the same ``--timeout``, or (``--budget``) the studies sharing a wall time as the command's
do by default; without ``--shape`` and ``--family``, the command's default shapes and every
family. It prints:

* per phase of the main thread (tuner.measure.phases): total seconds, share of the tuning
  wall time, seconds per trial; the GPU child's own phases (load, verify, time) beside them,
  and the GPU request's round trip (posted → answer read, queueing behind another included);
* configs measured per second (and per minute);
* the GPU-busy share, two ways, over the tuning wall time:
  - **NVML** ``utilization.gpu``, sampled every 100 ms in a thread (pynvml, else
    ``nvidia-smi -lms 100``, else "not available", said so): the driver's share of each sample
    period in which *any* kernel ran. It counts everything (cuBLAS, verification, copies are
    not kernels though) and over-reads short kernels in long periods: an upper bound of sorts.
  - **kernel time**: the sum of the kernel time the bench actually ran for candidates (every
    event-timed launch, warm-up included, plus the verification launches taken at the median;
    ``kernel_s`` of ``GpuBench.evaluate``) over the wall time: a lower bound, since it leaves
    out uploads, downloads, module loads and the float64 check. The target of issue 19 (GPU busy
    >= 80 % of tuning wall time) is meant on this one; NVML says whether the two agree.

* per study: its wall time (from the end of the one before), the part before its loop began
  (its start-up taken or computed), the GPU child's answers and busy share, the host's CPU
  busy share (all cores, /proc/stat every 100 ms: whether the cores or something else kept the
  child waiting), and with a fresh cache the configs compiled per family (``compiled`` in the
  JSON lists them); the child's idle time in it before its first answer, between answers and
  after its last (head / mid / tail); the compile workers busy on average (of them, on
  compiles begun ahead of an ask); and the main thread's wait for a start-up prepared ahead.

The one-time start (the command's: the GPU child's and the compile processes' start, with the
search's imports beside it, ``tuner.run.tune.start_command``; and per shape the inputs, float64
reference and cuBLAS baseline: phase ``setup``) is excluded from the tuning wall time and
reported apart. The bench starts exactly as the command does, so its shares compare with the
command's (docs/measurement.md, "The command's start and end").
The CUBIN cache is a fresh folder unless ``--cache`` names one: every compile is a real one, as
in a study of a new kernel version; the cost model's rows of the recorded examples
(``tuner.search.rowcache``, kept under $GEMMTUNE_CACHE) are then fresh too, as on a new install.

Without a GPU, ``GEMMTUNE_GPU_BACKEND=tuner.testing`` runs the whole path on the CPU stand-in;
``--standin-measure-s S`` makes each stand-in evaluation take S seconds. Such numbers check the
structure (phases add up, overlap happens), they are not GPU timings.

With ``--gpus`` (as ``python -m tuner --gpus``: one search, a GPU child per device) the GPU
figures are per GPU: kernel time over the tuning wall time of all of them, NVML averaged over
them, and the child's idle gaps are those in which no GPU was at work.

JSON goes to ``bench/results/throughput-<gpu>.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence
from unittest import mock

from tuner.lifetime import kill_pool
from tuner.measure.live import BACKEND_ENV, QUEUE_DEPTH, default_workers
from tuner.measure.phases import (BACKGROUND_PHASES, MAIN_PHASES, SETUP, START_PARTS, STARTUP_WAIT, STUDY_PARTS,
                                  Phases)

HERE = Path(__file__).resolve().parent
SAMPLE_EVERY_S = 0.1


class UtilizationSampler:
    """NVML ``utilization.gpu`` every 100 ms in a thread: (monotonic time, percent) pairs, the
    percent the mean over ``devices``."""

    def __init__(self, devices: Sequence[int]) -> None:
        self.devices = list(devices)
        self.samples: list[tuple[float, float]] = []
        self.source = "not available"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(d) for d in self.devices]
            for handle in handles:
                pynvml.nvmlDeviceGetUtilizationRates(handle)
        except Exception:
            self._start_smi()
            return
        self.source = "pynvml nvmlDeviceGetUtilizationRates"

        def poll() -> None:
            while not self._stop.wait(SAMPLE_EVERY_S):
                try:
                    gpu = statistics.fmean(pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                                           for h in handles)
                except Exception:
                    continue
                self.samples.append((time.monotonic(), float(gpu)))

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def _start_smi(self) -> None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.source = "not available (no pynvml, no nvidia-smi)"
            return
        self._process = subprocess.Popen(
            # a line per device and period: their mean is the mean over the devices
            [smi, "-i", ",".join(map(str, self.devices)), "--query-gpu=utilization.gpu",
             "--format=csv,noheader,nounits", f"-lms={int(SAMPLE_EVERY_S * 1000)}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.source = "nvidia-smi -lms 100 (pynvml not installed)"

        def read() -> None:
            assert self._process is not None and self._process.stdout is not None
            for line in self._process.stdout:
                try:
                    self.samples.append((time.monotonic(), float(line.strip())))
                except ValueError:
                    continue

        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None:
            self._process.terminate()
            self._process.wait(5)
        if self._thread is not None:
            self._thread.join(2)

    def mean(self, spans: list[tuple[float, float]],
             excluded: list[tuple[float, float]] = ()) -> float | None:  # type: ignore[assignment]
        """Mean utilization (0-1) of the samples inside ``spans`` and outside ``excluded``."""
        inside = [u for t, u in self.samples
                  if any(a <= t <= b for a, b in spans)
                  and not any(a <= t <= b for a, b in excluded)]
        return statistics.fmean(inside) / 100 if inside else None


class CpuSampler:
    """The host's CPU busy share every 100 ms in a thread, from /proc/stat (Linux): (monotonic
    time, busy share of all cores since the previous sample). Says whether a study waits for
    the GPU child because the cores are full (compiles) or for some other reason."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        # beside each sample, once set (the compile pool starts after the sampler): the pool's
        # compiles queued or running, and of those the ones begun ahead of an ask; whether a
        # study that kept the GPU child waiting had its workers full, and with what
        self.compiling: Callable[[], tuple[int, int]] | None = None
        self.compiles: list[tuple[float, int, int]] = []
        self.available = Path("/proc/stat").exists()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _times() -> tuple[int, int]:
        # cpu  user nice system idle iowait irq softirq steal guest guest_nice
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    def start(self) -> None:
        if not self.available:
            return

        def poll() -> None:
            busy0, total0 = self._times()
            while not self._stop.wait(SAMPLE_EVERY_S):
                busy, total = self._times()
                now = time.monotonic()
                if total > total0:
                    self.samples.append((now, (busy - busy0) / (total - total0)))
                busy0, total0 = busy, total
                if self.compiling is not None:
                    self.compiles.append((now, *self.compiling()))

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def mean(self, a: float, b: float) -> float | None:
        inside = [u for t, u in self.samples if a <= t <= b]
        return statistics.fmean(inside) if inside else None

    def mean_compiling(self, a: float, b: float, workers: int
                       ) -> tuple[float, float] | None:
        """Compile workers busy on average in [a, b], and of them with compiles begun ahead."""
        inside = [(min(n, workers), min(ahead, workers)) for t, n, ahead in self.compiles
                  if a <= t <= b]
        if not inside:
            return None
        return (statistics.fmean(n for n, _ in inside),
                statistics.fmean(ahead for _, ahead in inside))


def _overlap(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``spans`` inside [start, end]."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def loop_family(families: list[str], i: int) -> str:
    """The family of the i-th study loop: the studies run family after family, shape after
    shape ("?" where no family is known)."""
    return families[i % len(families)] if families else "?"


def timeline(phases: Phases, families: list[str], began: float) -> dict[str, Any]:
    """Where each second went, for reading one run closely (``--timeline``): the GPU child's
    answers (start, end), each study loop (family, start, end) and the main thread's phases'
    spans (nested phases inside their callers' spans; those of the command's own start are
    not kept), in seconds from the command's start."""
    def at(t: float) -> float:
        return round(t - began, 4)

    return {"child": [[at(a), at(b)] for a, b in sorted(phases.child_spans)],
            "loops": [[loop_family(families, i), at(a), at(b)]
                      for i, (a, b) in enumerate(phases.loops)],
            "main": {name: [[at(a), at(b)] for a, b in spans]
                     for name, spans in sorted(phases.spans.items())}}


def per_study(families: list[str], loops: list[tuple[float, float]],
              child_spans: list[tuple[float, float]], tuning_from: float,
              cpu: CpuSampler, workers: int | None = None,
              waits: Sequence[tuple[float, float]] = (), gpus: int = 1) -> list[dict[str, Any]]:
    """Per study, from the end of the one before (its set-up included) to the end of its loop:
    wall time, how much of it went before the loop began (the start-up taken or computed, the
    study opened), answers of the GPU child, the child's busy share and the host's CPU share. The
    studies run family after family, shape after shape (``loop_family``).

    The child's idle time in it, by where it falls: ``idle_head_s`` before the study's first
    answer began (the set-up, the first asks and compiles), ``idle_tail_s`` after its last
    answer (the loop's end: the last compiles waited for, then stores), ``idle_mid_s`` the gaps
    between; and the compile workers busy on average (``workers_busy``, of ``workers``; of
    them ``workers_busy_ahead`` on compiles begun ahead of an ask, ``compile_ahead``); and
    ``startup_wait_s``, the main thread's wait in it for a start-up prepared ahead (``waits``:
    phase ``startup_wait``'s spans; the next study's, built while this one drains)."""
    rows = []
    start = tuning_from
    for i, (begin, end) in enumerate(sorted(loops)):
        busy = _overlap(child_spans, start, end)
        # answers: those ending in it (the first study's: the opening's, answered in the
        # one-time start, too); idle: the child's work inside it, a measurement that runs over
        # its edge included (counted by where it ends, it made a study's tail read as idle
        # while the GPU measured the next study's first posted candidate)
        answers = sum(start <= b <= end or (i == 0 and b < start) for _, b in child_spans)
        inside = sorted((max(a, start), min(b, end)) for a, b in child_spans if a < end and b > start)
        wall = end - start
        head = (inside[0][0] - start) if inside else wall
        tail = (end - inside[-1][1]) if inside else 0.0
        mid = sum(max(0.0, a2 - b1) for (_, b1), (a2, _) in zip(inside, inside[1:]))
        compiling = None if workers is None else cpu.mean_compiling(start, end, workers)
        rows.append({"family": loop_family(families, i), "wall_s": wall,
                     "set_up_s": begin - start,  # the main thread's, before the loop began
                     "answers": answers,
                     "child_busy_share": busy / (wall * gpus) if wall > 0 else 0.0,
                     "host_cpu_share": cpu.mean(start, end),
                     "idle_head_s": max(0.0, head), "idle_mid_s": mid,
                     "idle_tail_s": max(0.0, tail),
                     "startup_wait_s": _overlap(waits, start, end),
                     "workers_busy": None if compiling is None else compiling[0],
                     "workers_busy_ahead": None if compiling is None else compiling[1]})
        start = end
    return rows


def compiled_configs(cache: Path) -> dict[str, list[dict[str, int]]]:
    """The configs the command compiled (a fresh CUBIN cache's entries), per family."""
    out: dict[str, list[dict[str, int]]] = {}
    for meta in sorted(cache.glob("*.json")):
        try:
            entry = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        out.setdefault(str(entry.get("family")), []).append(entry.get("config", {}))
    return out


def best_per_family(db_path: Path) -> dict[str, dict[str, float]]:
    """The best verified GFLOP/s each study found, {shape: {family: GFLOP/s}}: the issue asks
    that more configs per minute find no worse kernels."""
    import db

    database = db.open_database(f"sqlite:///{db_path}")
    try:
        best: dict[str, dict[str, float]] = {}
        for row in database.best_table():
            best.setdefault(row.problem.shape, {})[row.family] = row.gflops
        return best
    finally:
        database.close()


def gpu_slug(name: str) -> str:
    """The GPU model's part of a result file's name (bench/results/<bench>-<slug>.json), the
    one rule of every bench: its name in lower case without the vendor and the memory's size
    and kind, so "NVIDIA H100 80GB HBM3" is "h100" and "NVIDIA H200" "h200", as the committed
    results are named; every other word stays ("NVIDIA H100 PCIe": "h100-pcie"). Boards that
    differ only in memory size (an A100 40GB and 80GB) share a file; each JSON names its GPU."""
    words = [word for word in re.split(r"[^a-z0-9]+", name.lower())
             if word and word != "nvidia" and not re.fullmatch(r"\d+gb|hbm\d*e?", word)]
    return "-".join(words) or "gpu"


def tuner_argv(args: argparse.Namespace, db_path: Path, cache: Path) -> list[str]:
    devices = ["--gpus", args.gpus] if args.gpus else ["--gpu", str(args.gpu)]
    limit = ["--budget", f"{args.budget:g}"] if args.budget else ["--timeout", f"{args.timeout:g}"]
    argv = [*devices, *limit, "--trials", str(args.trials),
            "--patience", str(args.patience), "--db", f"sqlite:///{db_path}",
            "--cache", str(cache), "--seed", str(args.seed), "--sampler", args.sampler]
    if args.workers:
        argv += ["--workers", str(args.workers)]
    for family in args.family:
        argv += ["--kernel", family]
    for shape in args.shape:
        argv += ["--shape", shape]
    return argv


def child_idle(child_spans: list[tuple[float, float]], loops: list[tuple[float, float]],
               tuning_span: tuple[float, float], excluded: list[tuple[float, float]] = (),
               gpus: int = 1, per_shape: int = 0) -> dict[str, Any]:  # type: ignore[assignment]
    """When the GPU child had no candidate to work on, from its answers' (start, end) spans,
    within the tuning span (the one-time ``excluded`` spans left out): before its first answer
    (the first study's set-up and first compiles), after its last (the last study's end, the
    command's shut-down), and each gap between two answers, charged to ``between_studies``
    where a study's loop ended inside it (the next study's set-up, first asks and compiles),
    else to ``in_studies`` (compile waits, asks, stores that let the queue run dry). With
    ``per_shape`` (studies a shape, in order), ``at_shape_changes`` is the part of
    ``between_studies`` where a shape's last loop ended (the old shape's re-timing, the new
    one's inputs, reference, baseline and first study); the rest is inside shapes."""
    wall_from, wall_to = tuning_span
    # the opening's answers may come before the tuning span (during the one-time start)
    spans = sorted((max(a, wall_from), b) for a, b in child_spans if b > wall_from)

    def length(a: float, b: float) -> float:
        cut = sum(max(0.0, min(b, y) - max(a, x)) for x, y in excluded)
        return max(0.0, (b - a) - cut)

    idle = {"before_first_s": length(wall_from, spans[0][0]) if spans else 0.0,
            "between_studies_s": 0.0, "at_shape_changes_s": 0.0, "in_studies_s": 0.0,
            "after_last_s": length(spans[-1][1], wall_to) if spans else 0.0}
    last_of_shape = {i for i in range(len(loops) - 1) if per_shape and (i + 1) % per_shape == 0}
    long_gaps = 0
    for (_, a), (b, _) in zip(spans, spans[1:]):
        if b <= a:
            continue
        ended = [i for i, (_, end) in enumerate(loops) if a <= end <= b]
        idle["between_studies_s" if ended else "in_studies_s"] += length(a, b)
        if last_of_shape.intersection(ended):
            idle["at_shape_changes_s"] += length(a, b)
        long_gaps += not ended and b - a > 0.05
    wall = length(wall_from, wall_to)
    busy = sum(b - a for a, b in spans)
    return {"child_busy_share": busy / (wall * gpus) if wall > 0 else 0.0, **idle,
            "in_studies_gaps_over_50ms": long_gaps, "studies": len(loops)}


MainSpans = dict[str, list[tuple[float, float]]]


def gap_phases(start: float, end: float, spans: MainSpans) -> dict[str, float]:
    """What the main thread did during [start, end], in seconds per phase, adding up to the
    stretch: at each moment the innermost phase it was in (spans nest: of the open ones, the
    one begun last), ``other`` where it was in none (the loop's own bookkeeping, a study's
    set-up outside its named parts, the command's start). Largest first."""
    inside = [(a, b, name) for name, pairs in spans.items() for a, b in pairs
              if a < end and b > start]
    cuts = sorted({start, end, *(t for a, b, _ in inside for t in (a, b) if start < t < end)})
    seconds: dict[str, float] = {}
    for lo, hi in zip(cuts, cuts[1:]):
        middle = (lo + hi) / 2
        open_now = [(a, -b, name) for a, b, name in inside if a <= middle < b]
        name = max(open_now)[2] if open_now else "other"
        seconds[name] = seconds.get(name, 0.0) + hi - lo
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def idle_by_phase(child_spans: list[tuple[float, float]], spans: MainSpans,
                  over: float = 0.05) -> dict[str, float]:
    """The GPU child's gaps over ``over`` seconds between its first answer and its last, summed
    per main-thread phase (``gap_phases``): which phase held the GPU idle. Largest first."""
    ordered = sorted(child_spans)
    total: dict[str, float] = {}
    for (_, a), (b, _) in zip(ordered, ordered[1:]):
        if b - a > over:
            for name, seconds in gap_phases(a, b, spans).items():
                total[name] = total.get(name, 0.0) + seconds
    return dict(sorted(total.items(), key=lambda item: -item[1]))


def longest_gaps(child_spans: list[tuple[float, float]], loops: list[tuple[float, float]],
                 families: list[str], began: float, ended: float, top: int = 12,
                 spans: MainSpans | None = None) -> list[dict[str, Any]]:
    """The ``top`` longest stretches with no GPU child at work, from the command's start
    (``began``) to its end: when each began (seconds from the start), how long it lasted, and
    where the main thread was then: in which study's loop, between two loops (the next
    study's set-up), or in the command's start (before the first loop); with the main thread's
    phase ``spans``, what it did meanwhile (``phases``, ``gap_phases``)."""
    answers = sorted(child_spans)
    edges = [began] + [b for _, b in answers]
    starts = [a for a, _ in answers] + [ended]
    ordered = sorted(loops)

    def where(t: float) -> str:
        for i, (a, b) in enumerate(ordered):
            name = loop_family(families, i)
            if a <= t <= b:
                return f"in {name}'s loop"
            if t < a:
                return "the command's start" if i == 0 else f"before {name}'s loop"
        return "after the last loop"

    gaps = [(b - a, a) for a, b in zip(edges, starts) if b - a > 0]
    return [{"from_s": a - began, "seconds": length, "where": where(a),
             **({"phases": gap_phases(a, a + length, spans)} if spans is not None else {})}
            for length, a in sorted(gaps, key=lambda gap: (-gap[0], gap[1]))[:top]]


def after_first(phases: Phases, sampler: UtilizationSampler, command_span: tuple[float, float],
                gpus: int = 1) -> dict[str, Any] | None:
    """Issue 58's two start figures: the seconds from the command's start to the GPU's first
    answer (``first_answer_s``: its end; the one-time start included, measured or not), and
    how busy the GPU was from that answer's start to the command's end (``wall_s``; kernel
    time, the child at work, NVML). None where nothing was measured."""
    if not phases.child_spans:
        return None
    began, ended = command_span
    first = min(phases.child_spans)
    wall = ended - first[0]
    busy = _overlap(phases.child_spans, first[0], ended)
    return {"first_answer_s": first[1] - began, "wall_s": wall,
            "kernel_time_share": phases.kernel_s / (wall * gpus) if wall > 0 else 0.0,
            "child_busy_share": busy / (wall * gpus) if wall > 0 else 0.0,
            "nvml_share": sampler.mean([(first[0], ended)])}


def report(phases: Phases, *, wall_s: float, start_s: float, sampler: UtilizationSampler,
           tuning_span: tuple[float, float], gpus: int = 1, per_shape: int = 0) -> dict[str, Any]:
    """The numbers printed and stored: everything per the tuning wall time (start excluded;
    the kernel time counts the opening's, measured in the start, too); the GPU's busy shares
    per GPU of ``gpus``; ``per_shape``: studies a shape (``child_idle``)."""
    tuning_s = wall_s - start_s
    trials = max(1, phases.trials)
    rows: dict[str, dict[str, float]] = {}

    def row(name: str, seconds: float) -> None:
        rows[name] = {"seconds": seconds, "share": seconds / tuning_s if tuning_s else 0.0,
                      "per_trial_s": seconds / trials}

    # outside the loops: building each study (enumeration, the prior's compiles, the database)
    row("study_start", tuning_s - phases.loop_s)
    for name in MAIN_PHASES:
        row(name, phases.seconds.get(name, 0.0))
    row("other", phases.loop_s - phases.in_loop())
    # beside the main thread, not in its rows: the writer thread's storage writes (store_bg),
    # the next study's start-up prepared ahead (startup_bg)
    background = {name: {"seconds": s, "share": s / tuning_s if tuning_s else 0.0,
                         "per_trial_s": s / trials}
                  for name in BACKGROUND_PHASES if (s := phases.seconds.get(name, 0.0))}
    child = {name: {"seconds": s, "share": s / tuning_s if tuning_s else 0.0,
                    "per_trial_s": s / max(1, phases.answers)}
             for name, s in phases.child.items()}
    setup_spans = phases.spans.get(SETUP, [])
    nvml = sampler.mean([tuning_span], setup_spans)
    nvml_loops = sampler.mean(phases.loops)
    return {
        "wall_s": wall_s, "start_s": start_s, "tuning_s": tuning_s, "loop_s": phases.loop_s,
        "trials": phases.trials, "gpu_answers": phases.answers,
        "configs_per_s": phases.trials / tuning_s if tuning_s else 0.0,
        "phases": rows, "background_phases": background, "child_phases": child,
        "gpu_round_trip_per_answer_s": phases.round_trip_s / max(1, phases.answers),
        # where the one-time start and the studies' set-ups went (their parts, wherever they ran:
        # a study built while the one before drains adds its set-up from inside that loop)
        "start_parts": {name: phases.seconds.get(name, 0.0) for name in (*START_PARTS, SETUP)},
        "study_start_parts": {name: phases.seconds.get(name, 0.0) for name in STUDY_PARTS},
        "gpu_busy": {
            "kernel_time_s": phases.kernel_s,
            "kernel_time_share": phases.kernel_s / (tuning_s * gpus) if tuning_s else 0.0,
            "nvml_share": nvml, "nvml_share_in_loops": nvml_loops,
            "nvml_source": sampler.source, "nvml_samples": len(sampler.samples),
        },
        "child_idle": child_idle(phases.child_spans, phases.loops, tuning_span, setup_spans,
                                 gpus, per_shape),
        "gpus": gpus,
        "raw": phases.as_dict(),
    }


def _phase_list(seconds: dict[str, float], least: float, most: int | None = None) -> str:
    shown = [(name, s) for name, s in seconds.items() if s >= least][:most]
    return ", ".join(f"{name} {s:.2f} s" for name, s in shown) or "-"


def print_report(result: dict[str, Any]) -> None:
    print(f"\nwall {result['wall_s']:.1f} s = one-time start {result['start_s']:.1f} s "
          f"(processes and imports, inputs + reference, cuBLAS) + tuning {result['tuning_s']:.1f} s "
          f"(study loops {result['loop_s']:.1f} s)")
    start, study = result.get("start_parts", {}), result.get("study_start_parts", {})
    if start:
        print("one-time start: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in start.items())
              + "; studies' set-up parts: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in study.items()))
    first = result.get("after_first")
    if first:
        nvml = first["nvml_share"]
        print(f"first measurement {first['first_answer_s']:.2f} s after the command's start; "
              f"from then to the end ({first['wall_s']:.1f} s) the GPU was busy "
              f"{first['kernel_time_share']:.1%} kernel time, child at work "
              f"{first['child_busy_share']:.1%}, NVML " + (f"{nvml:.1%}" if nvml is not None else "-"))
    print(f"{result['trials']} configs recorded ({result['gpu_answers']} measured on the GPU): "
          f"{result['configs_per_s']:.2f} configs/s = {60 * result['configs_per_s']:.0f}/min")
    print(f"\n{'main thread':<14}{'total s':>10}{'share':>9}{'per trial ms':>14}")
    for name, r in result["phases"].items():
        print(f"{name:<14}{r['seconds']:>10.2f}{r['share']:>9.1%}{1e3 * r['per_trial_s']:>14.1f}")
    for name, r in result["background_phases"].items():
        print(f"{name:<14}{r['seconds']:>10.2f}{r['share']:>9.1%}"
              f"{1e3 * r['per_trial_s']:>14.1f}  (beside the main thread)")
    print(f"\n{'GPU child':<14}{'total s':>10}{'share':>9}{'per answer ms':>14}")
    for name, r in result["child_phases"].items():
        print(f"{name:<14}{r['seconds']:>10.2f}{r['share']:>9.1%}{1e3 * r['per_trial_s']:>14.1f}")
    print(f"GPU request round trip (posted → answer read, queueing included): "
          f"{1e3 * result['gpu_round_trip_per_answer_s']:.1f} ms per answer")
    busy = result["gpu_busy"]
    nvml = busy["nvml_share"]
    per = f" (per GPU, {result['gpus']} GPUs)" if result.get("gpus", 1) > 1 else ""
    print(f"\nGPU busy{per}, kernel time timed/verified / tuning wall: {busy['kernel_time_share']:.1%} "
          f"({busy['kernel_time_s']:.1f} s)")
    print("GPU busy, NVML utilization.gpu over tuning wall:     "
          + (f"{nvml:.1%}" if nvml is not None else "-")
          + f"  [{busy['nvml_source']}, {busy['nvml_samples']} samples]")
    for shape, families in result.get("best_gflops", {}).items():
        print(f"best GFLOP/s at {shape}: " + ", ".join(
            f"{family} {gflops:,.0f}" for family, gflops in
            sorted(families.items(), key=lambda item: -item[1])))
    idle = result["child_idle"]
    print(f"GPU child at work / tuning wall{per}: {idle['child_busy_share']:.1%}; "
          + ("all idle " if per else "idle ") +
          f"{idle['before_first_s']:.2f} s before the first answer, "
          f"{idle['between_studies_s']:.2f} s between the {idle['studies']} studies"
          + (f" ({idle['at_shape_changes_s']:.2f} s of it at the shape changes), "
             if idle.get("at_shape_changes_s") else ", ") +
          f"{idle['in_studies_s']:.2f} s inside them "
          f"({idle['in_studies_gaps_over_50ms']} gaps > 50 ms), "
          f"{idle['after_last_s']:.2f} s after its last")
    by_phase = result.get("idle_by_phase")
    if by_phase:
        print("GPU child idle in its gaps > 50 ms, by what the main thread did: "
              + _phase_list(by_phase, 0.05))
    gaps = result.get("longest_gaps")
    if gaps:
        print("longest with the GPU child idle: " + "; ".join(
            f"{gap['seconds']:.2f} s at {gap['from_s']:.1f} s ({gap['where']}"
            + (f": {_phase_list(gap['phases'], 0.01, 3)}" if gap.get("phases") else "") + ")"
            for gap in gaps))
    ahead = result.get("compiled_ahead")
    if ahead:
        print(f"compiles begun ahead of the model's asks: {ahead['begun']}, "
              f"{ahead['taken']} of them asked for")
    if result.get("host_cpu_share") is not None:
        print(f"host CPU busy (all cores, /proc/stat) over tuning wall: {result['host_cpu_share']:.1%}")
    if result.get("studies"):
        print(f"\n{'study':<14}{'wall s':>8}{'set-up s':>10}{'answers':>9}{'GPU child':>11}"
              f"{'host CPU':>10}{'compiles':>10}{'idle head/mid/tail s':>22}{'workers (ahead)':>16}"
              f"{'start-up wait s':>16}")
        for row in result["studies"]:
            cpu, busy = row["host_cpu_share"], row.get("workers_busy")
            ahead = row.get("workers_busy_ahead")
            idle = (f"{row.get('idle_head_s', 0):.2f}/{row.get('idle_mid_s', 0):.2f}/"
                    f"{row.get('idle_tail_s', 0):.2f}")
            print(f"{row['family']:<14}{row['wall_s']:>8.1f}{row['set_up_s']:>10.2f}{row['answers']:>9}"
                  f"{row['child_busy_share']:>11.1%}" + (f"{cpu:>10.1%}" if cpu is not None else f"{'-':>10}")
                  + f"{result.get('compiles', {}).get(row['family'], '-'):>10}{idle:>22}"
                  + (f"{busy:>9.1f} ({ahead:.1f})" if busy is not None else f"{'-':>16}")
                  + f"{row.get('startup_wait_s', 0.0):>16.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", default=[],
                        help="kernel family (repeat; default: all the GPU runs)")
    parser.add_argument("--shape", action="append", default=[], help="MxNxK (repeat)")
    time_limit = parser.add_mutually_exclusive_group()
    time_limit.add_argument("--timeout", type=float, default=None,
                            help="seconds per study (default: 15)")
    time_limit.add_argument("--budget", type=float, default=None,
                            help="seconds all studies share, as python -m tuner's --budget "
                                 "(780: the default command)")
    parser.add_argument("--trials", type=int, default=80, help="as python -m tuner")
    parser.add_argument("--patience", type=int, default=25, help="as python -m tuner (0: off)")
    devices = parser.add_mutually_exclusive_group()
    devices.add_argument("--gpu", type=int, default=None, help="device index (default: 0)")
    devices.add_argument("--gpus", default=None, metavar="LIST|all",
                         help="several GPUs as one search, passed to python -m tuner --gpus "
                              "(which checks it): e.g. 0,1 or all; the GPU figures are then per GPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", default="default", help="as python -m tuner")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"compile processes (default here: {default_workers()})")
    parser.add_argument("--queue-depth", type=int, default=QUEUE_DEPTH,
                        help="candidates handed to the GPU child at once (1: one blocking "
                             "request at a time, as before issue 19)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="CUBIN cache folder (default: a fresh one, every compile real)")
    parser.add_argument("--standin-measure-s", type=float, default=0.0,
                        help="with the CPU stand-in backend: seconds per evaluation")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeline", type=Path, default=None, metavar="FILE",
                        help="also write every GPU answer's and main-thread phase's (start, end) "
                             "and each study loop's, in seconds from the command's start (JSON)")
    args = parser.parse_args(argv)
    if args.gpu is None:  # defaulted here: argparse takes an explicit 0 for the default
        args.gpu = 0
    if args.timeout is None and args.budget is None:
        args.timeout = 15.0
    # Imported here, not at the top: each process the tuner spawns (compile workers, the GPU
    # child, the start-up process) imports this script as its __main__ again, and these pull
    # in Optuna, SQLAlchemy and the database layer; at the top they made the bench's one-time
    # start twice the command's (docs/measurement.md, "The command's start and end").
    from tuner.run.cli import parse_args
    from tuner.run.tune import start_command, tune

    # (os.environ as it was comes back at the end: patch.dict restores what it snapshots)
    with tempfile.TemporaryDirectory(prefix="gemmtune-throughput-") as scratch, mock.patch.dict(os.environ):
        cache = args.cache or Path(scratch) / "cubins"
        if args.cache is None:  # the caches derived from code alone start empty too (children inherit it)
            os.environ["GEMMTUNE_CACHE"] = str(cache)
        options = parse_args(tuner_argv(args, Path(scratch) / "gemmtune.sqlite", cache))
        backend = options.evaluator.backend
        backend_options = ({"measure_s": args.standin_measure_s}
                           if args.standin_measure_s and backend == "tuner.testing" else None)
        cpu = CpuSampler()
        cpu.start()
        # NVML from the start where the GPUs are named (the opening measures during the start);
        # "all" is known only once the command has started
        named = options.evaluator.devices
        sampler = (None if isinstance(named, str)
                   else UtilizationSampler([named] if isinstance(named, int) else list(named)))
        if sampler is not None:
            sampler.start()
        started, began = time.perf_counter(), time.monotonic()
        # the command's own one-time start: the processes first, the search's imports beside
        # them, not in the tuning time
        evaluator, process = start_command(options, backend_options=backend_options,
                                           queue_depth=args.queue_depth)
        child_start_s = time.perf_counter() - started
        # every phase's spans, for the timeline and for what the main thread did in each gap
        evaluator.phases.every_span = True
        cpu.compiling = evaluator.pool.building
        if sampler is None:
            sampler = UtilizationSampler(evaluator.devices)
            sampler.start()
        tuning_from = time.monotonic()
        with evaluator:
            try:
                status = tune(options, evaluator, progress=False, preparer=process)
            finally:
                kill_pool(process)
            info, arch = evaluator.info(), evaluator.arch()
            workers, batch = evaluator.pool.workers, evaluator.batch
            # compiles begun for the model's foreseen asks, and how many it then asked for
            ahead = {"begun": evaluator.pool.ahead_begun, "taken": evaluator.pool.ahead_taken}
        wall_s = time.perf_counter() - started
        tuning_span = (tuning_from, time.monotonic())
        sampler.stop()
        cpu.stop()
        best = best_per_family(Path(scratch) / "gemmtune.sqlite")
        compiled = compiled_configs(cache) if args.cache is None else None
    phases = evaluator.phases
    start_s = child_start_s + phases.seconds.get(SETUP, 0.0)
    gpus = len(evaluator.devices)
    families = [f.name for f in options.families if f.offered_on(arch)]
    result = report(phases, wall_s=wall_s, start_s=start_s, sampler=sampler,
                    tuning_span=tuning_span, gpus=gpus, per_shape=len(families))
    result["after_first"] = after_first(phases, sampler, (began, tuning_span[1]), gpus)
    if gpus == 1:  # (with several, a gap of one GPU is not the host's)
        result["longest_gaps"] = longest_gaps(phases.child_spans, phases.loops, families,
                                              began, tuning_span[1], spans=phases.spans)
        result["idle_by_phase"] = idle_by_phase(phases.child_spans, phases.spans)
    result.update({
        "host_cpu_share": cpu.mean(*tuning_span),
        "studies": per_study(families, phases.loops, phases.child_spans, tuning_from, cpu,
                             workers, phases.spans.get(STARTUP_WAIT, []), gpus),
        **({"compiles": {f: len(c) for f, c in compiled.items()}, "compiled": compiled}
           if compiled is not None else {}),
        "best_gflops": best,
        "gpu": info.get("name"), "backend": backend, "command": options.command,
        "families": [f.name for f in options.families],
        "shapes": [p.shape for p in options.problems], "timeout_s": args.timeout,
        "budget_s": args.budget,
        "workers": workers, "batch": batch, "queue_depth": evaluator.queue_depth,
        "compiled_ahead": ahead,
        "cores": os.cpu_count(), "standin_measure_s": args.standin_measure_s or None,
        "exit_status": status, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    print_report(result)
    if args.timeline is not None:
        args.timeline.parent.mkdir(parents=True, exist_ok=True)
        args.timeline.write_text(json.dumps(timeline(phases, families, began)) + "\n")
        print(f"wrote {args.timeline}")
    out = args.out or HERE / "results" / f"throughput-{gpu_slug(str(info.get('name')))}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out}")
    if backend == "tuner.testing":
        print(f"({BACKEND_ENV}=tuner.testing: a CPU stand-in; these are no GPU timings)")
    return status


if __name__ == "__main__":
    sys.exit(main())
