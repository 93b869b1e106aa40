"""Recordings: every measured result of a sweep over kernel configs, kept in one small file.

A recording lets the tuner run without a GPU (``tuner.measure.replay``) and lets a search
strategy be judged against the true optimum of the space it searched (``bench/search_efficiency.py``).

File: gzip-compressed JSON (``*.json.gz``; plain ``*.json`` is read too). Layout::

    {"format": "gemmtune-recording", "version": 1,
     "created_at": ISO-8601 UTC, "arch": "sm_90", "nvrtc_version": "13.0",
     "gpu": {the fields of db.GpuInfo},
     "note": free text (who made it and how),
     "families": {name: {"source_hash": hex,
                         "params": [parameter names, in the family's order],
                         "grid": {parameter: [values the sweep drew from]},
                         "selection": {"mode": "full" | "sample" | "imported", "accepted": M,
                                       "recorded": N, "seed": S | null, "text": "..."}}},
     "result_fields": [RESULT_FIELDS, the column order of every result row],
     "problems": [{"m", "n", "k", "dtype", "layout", "general_alpha_beta",
                   "baseline": {"library", "time_min_ms", "time_median_ms", "time_max_ms",
                                "launches", "gflops", "sm_clock_mhz"} | null,
                   "results": {family: [[*config values, *result values], ...]}}]}

A config is stored as its values in the family's parameter order; names appear once, in the
family header. ``selection`` says how the configs were chosen: the full accepted space of the
grid, or a uniform sample of N of its M accepted configs with seed S.

The recordings made on this project's GPU hosts ship with the package (``BUNDLED_RECORDINGS``):
the benchmarks replay them, and a live study's cost model learns from those of its GPU model
(``bundled``), as the benchmark's leave-one-out rows do from the others. Each is named by what it
holds, ``<GPU model>-<families joined by +>-<shapes MxNxK joined by +>.json.gz``, and described
in ``MANIFEST.json`` beside them (shapes, families, grid, the command that made it, its date,
whether it was re-timed, and the names it had before). A path that names a bundled recording by
an old name resolves to its current one (``resolve``, ``canonical_name``), so a command, test or
benchmark output written before a rename still finds it.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field, fields
from functools import lru_cache
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.measure.evaluator import MISSING, OK, Baseline, Measurement
from tuner.problem import Problem

FORMAT = "gemmtune-recording"
VERSION = 1

# What a state may be in a recording: every trial state except the two that never reach a GPU
# (rejected: the constraints refuse it; missing: the replay's own answer for an absent config).
RECORDED_STATES = ("ok", "compile_error", "launch_error", "wrong_result", "timeout", "crashed")

# Per (family, problem, config): the measurement exactly as the tuner takes it, then the
# compile resources. Times in ms, clocks in MHz, shared memory and spills in bytes. The columns
# of format version 1, fixed on disk: the fields of db.TRIAL_RESULT (in the file's order) plus
# rel_error (tests/test_trial_result.py holds them against it; a change is a new version).
RESULT_FIELDS = (
    "state", "error", "time_min_ms", "time_median_ms", "time_max_ms", "launches", "gflops",
    "sm_clock_mhz", "rel_error", "registers", "shared_bytes", "spill_bytes", "occupancy",
    "compile_seconds",
)

# The recordings that ship with the package (made with ``python -m tuner.record`` on the GPU
# hosts; the benchmarks' data and the live cost model's examples).
BUNDLED_RECORDINGS = Path(__file__).resolve().parent.parent / "recordings"
# What each bundled recording holds, and the names it had before (format in its "what").
MANIFEST = BUNDLED_RECORDINGS / "MANIFEST.json"

GPU_FIELDS = ("name", "uuid", "compute_capability", "sm_count", "memory_bytes",
              "max_sm_clock_mhz", "driver_version", "cuda_version", "nvrtc_version")


class RecordingError(ValueError):
    """A recording file that cannot be used; the message names the file and what is wrong."""


# ------------------------------------------------------------------ in-memory form


@dataclass(frozen=True)
class RecordedResult(Measurement):
    """A measurement as a recording keeps it: every field of a Measurement, plus the verified
    result's relative error (recordings only)."""

    rel_error: float | None = None

    @property
    def usable(self) -> bool:
        # A recorded ok needs a positive GFLOP/s only (imported results may lack times).
        return self.state == OK and self.gflops is not None and self.gflops > 0

    def row(self) -> list[Any]:
        return [getattr(self, name) for name in RESULT_FIELDS]

    def measurement(self) -> Measurement:
        """What the tuner's search loop receives: the same fields a live evaluation gives."""
        return Measurement(**{f.name: getattr(self, f.name) for f in fields(Measurement)})

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RecordedResult:
        return cls(**{name: values.get(name) for name in RESULT_FIELDS})


def missing_measurement(family: str, problem: Problem) -> Measurement:
    return Measurement(state=MISSING,
                       error=f"not in the recording ({family} at {problem.shape})")


@dataclass(frozen=True)
class Selection:
    mode: Literal["full", "sample", "imported"]
    accepted: int  # accepted configs in the grid
    recorded: int  # configs chosen for the sweep
    seed: int | None = None

    @property
    def text(self) -> str:
        if self.mode == "full":
            return f"full accepted space of the grid ({self.accepted} configs)"
        if self.mode == "imported":
            return (f"{self.recorded} of {self.accepted} accepted configs of the grid, chosen "
                    "by another tool's search (not a uniform sample)")
        return (f"uniform sample of {self.recorded} of {self.accepted} accepted configs of the "
                f"grid, seed {self.seed}")


@dataclass
class FamilyHeader:
    name: str
    source_hash: str
    params: tuple[str, ...]
    grid: dict[str, tuple[int, ...]]
    selection: Selection

    def values(self, config: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(config[name]) for name in self.params)

    def config(self, values: tuple[int, ...]) -> dict[str, int]:
        return dict(zip(self.params, values))


@dataclass
class ProblemRecording:
    problem: Problem
    baseline: dict[str, Any] | None = None  # GpuBench.baseline() as measured
    results: dict[str, dict[tuple[int, ...], RecordedResult]] = field(default_factory=dict)

    def baseline_result(self) -> Baseline | None:
        if not self.baseline:
            return None
        return Baseline(self.baseline.get("library", "cublas"),
                        float(self.baseline["time_median_ms"]), float(self.baseline["gflops"]),
                        self.baseline.get("sm_clock_mhz"))


@dataclass
class Recording:
    gpu: dict[str, Any]
    arch: str
    nvrtc_version: str | None
    families: dict[str, FamilyHeader]
    problems: list[ProblemRecording]
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    note: str = ""

    # ---- lookups ---------------------------------------------------------------------------
    def problem(self, problem: Problem) -> ProblemRecording | None:
        for entry in self.problems:
            if entry.problem == problem:
                return entry
        return None

    def result(self, family: str, problem: Problem, config: Mapping[str, int]
               ) -> RecordedResult | None:
        entry, header = self.problem(problem), self.families.get(family)
        if entry is None or header is None:
            return None
        try:
            return entry.results.get(family, {}).get(header.values(config))
        except KeyError:  # a config that lacks one of the recorded parameters
            return None

    def results(self, family: str, problem: Problem
                ) -> Iterator[tuple[dict[str, int], RecordedResult]]:
        entry, header = self.problem(problem), self.families[family]
        for values, result in ({} if entry is None else entry.results.get(family, {})).items():
            yield header.config(values), result

    def optimum(self, family: str, problem: Problem) -> tuple[dict[str, int], float] | None:
        """The best verified config recorded for (family, problem) and its GFLOP/s."""
        best = self.fastest(family, problem, 1)
        return (best[0][0], float(best[0][1].gflops)) if best else None  # type: ignore[arg-type]

    def fastest(self, family: str, problem: Problem, count: int
                ) -> list[tuple[dict[str, int], RecordedResult]]:
        """The ``count`` verified configs recorded fastest for (family, problem), fastest
        first (of equal GFLOP/s, the one recorded first)."""
        usable = [(c, r) for c, r in self.results(family, problem) if r.usable]
        return sorted(usable, key=lambda item: -float(item[1].gflops))[:count]  # type: ignore

    def pairs(self) -> list[tuple[str, Problem]]:
        """Every (family, problem) with at least one recorded result."""
        return [(name, entry.problem) for entry in self.problems
                for name in self.families if entry.results.get(name)]

    def add(self, family: str, problem: Problem, config: Mapping[str, int],
            result: RecordedResult) -> None:
        entry = self.problem(problem)
        if entry is None:
            entry = ProblemRecording(problem)
            self.problems.append(entry)
        entry.results.setdefault(family, {})[self.families[family].values(config)] = result

    # ---- files ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION,
            "created_at": self.created_at.astimezone(timezone.utc).isoformat(),
            "arch": self.arch, "nvrtc_version": self.nvrtc_version,
            "gpu": {name: self.gpu.get(name) for name in GPU_FIELDS},
            "note": self.note,
            "families": {
                name: {"source_hash": h.source_hash, "params": list(h.params),
                       "grid": {p: list(v) for p, v in h.grid.items()},
                       "selection": {"mode": h.selection.mode, "accepted": h.selection.accepted,
                                     "recorded": h.selection.recorded,
                                     "seed": h.selection.seed, "text": h.selection.text}}
                for name, h in self.families.items()
            },
            "result_fields": list(RESULT_FIELDS),
            "problems": [
                {"m": e.problem.m, "n": e.problem.n, "k": e.problem.k, "dtype": e.problem.dtype,
                 "layout": e.problem.layout, "batch": e.problem.batch,
                 "general_alpha_beta": e.problem.general_alpha_beta,
                 "baseline": e.baseline,
                 "results": {name: [[*values, *_json_safe(result.row())]
                                    for values, result in rows.items()]
                             for name, rows in e.results.items()}}
                for e in self.problems
            ],
        }

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_json(), separators=(",", ":"))


def _json_safe(values: list[Any]) -> list[Any]:
    return [None if isinstance(v, float) and not math.isfinite(v) else v for v in values]


# ------------------------------------------------------------------ the file schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _SelectionModel(_Strict):
    mode: Literal["full", "sample", "imported"]
    accepted: int = Field(ge=0)
    recorded: int = Field(ge=0)
    seed: int | None = None
    text: str


class _FamilyModel(_Strict):
    source_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    params: list[str] = Field(min_length=1)
    grid: dict[str, list[int]]
    selection: _SelectionModel

    @model_validator(mode="after")
    def _grid_matches_params(self) -> _FamilyModel:
        if len(set(self.params)) != len(self.params):
            raise ValueError(f"params {self.params} name a parameter twice")
        if set(self.grid) != set(self.params):
            raise ValueError(f"grid names {sorted(self.grid)} but params are {self.params}")
        empty = [name for name, values in self.grid.items() if not values]
        if empty:
            raise ValueError(f"grid gives no values for {', '.join(empty)}")
        return self


class _BaselineModel(BaseModel):
    library: str
    time_median_ms: float = Field(gt=0)
    gflops: float = Field(gt=0)
    time_min_ms: float | None = None
    time_max_ms: float | None = None
    launches: int | None = None
    sm_clock_mhz: float | None = None


# What recordings made before layouts call the only layout there was (kernels/layout.py: "nn").
LEGACY_LAYOUTS = {"row-major": "nn"}


class _ProblemModel(_Strict):
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    dtype: str = "fp32"
    layout: str = "nn"  # how A and B were stored; files from before layouts say "row-major": "nn"
    general_alpha_beta: bool = True
    batch: int = Field(default=1, gt=0)
    baseline: _BaselineModel | None = None
    results: dict[str, list[list[Any]]]


class _GpuModel(_Strict):
    name: str
    uuid: str
    compute_capability: str
    sm_count: int
    memory_bytes: int
    max_sm_clock_mhz: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    nvrtc_version: str | None = None


class _RecordingModel(_Strict):
    format: Literal["gemmtune-recording"]
    version: int
    created_at: datetime
    arch: str
    nvrtc_version: str | None = None
    gpu: _GpuModel
    note: str = ""
    families: dict[str, _FamilyModel]
    result_fields: list[str]
    problems: list[_ProblemModel]


def _result_from_row(tail: list[Any], where: str) -> RecordedResult:
    values = dict(zip(RESULT_FIELDS, tail))
    state = values["state"]
    if state not in RECORDED_STATES:
        raise RecordingError(f"{where}: state {state!r} is not allowed; allowed: "
                             f"{', '.join(RECORDED_STATES)}")
    for name in RESULT_FIELDS[2:]:
        value = values[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RecordingError(f"{where}: {name} must be a number or null, got {value!r}")
    if values["error"] is not None and not isinstance(values["error"], str):
        raise RecordingError(f"{where}: error must be text or null, got {values['error']!r}")
    result = RecordedResult.from_mapping(values)
    if state == OK and not result.usable:
        raise RecordingError(f"{where}: state ok needs a positive gflops, got {result.gflops!r}")
    return result


def from_json(data: Any, source: str = "recording") -> Recording:
    """Validates a decoded recording; raises RecordingError naming the first problem found."""
    try:
        model = _RecordingModel.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise RecordingError(
            f"{source}: not a valid gemmtune recording: {location}: {first['msg']}"
            + (f" ({error.error_count() - 1} more problems)" if error.error_count() > 1 else "")
        ) from None
    if model.version != VERSION:
        raise RecordingError(f"{source}: recording format version {model.version} is not "
                             f"supported; this gemmtune reads version {VERSION}")
    if tuple(model.result_fields) != RESULT_FIELDS:
        raise RecordingError(f"{source}: result_fields {model.result_fields} differ from the "
                             f"ones this version reads: {list(RESULT_FIELDS)}")
    families: dict[str, FamilyHeader] = {}
    for name, fam in model.families.items():
        sel = fam.selection
        families[name] = FamilyHeader(
            name=name, source_hash=fam.source_hash, params=tuple(fam.params),
            grid={p: tuple(fam.grid[p]) for p in fam.params},
            selection=Selection(sel.mode, sel.accepted, sel.recorded, sel.seed),
        )
    problems: list[ProblemRecording] = []
    seen: set[Problem] = set()
    for index, p in enumerate(model.problems):
        problem = Problem(p.m, p.n, p.k, p.dtype, LEGACY_LAYOUTS.get(p.layout, p.layout), p.general_alpha_beta,
                          p.batch)
        if problem in seen:
            raise RecordingError(f"{source}: problem {problem.shape} appears twice")
        seen.add(problem)
        entry = ProblemRecording(problem, None if p.baseline is None else p.baseline.model_dump())
        for name, rows in p.results.items():
            header = families.get(name)
            if header is None:
                raise RecordingError(f"{source}: problems[{index}] has results for family "
                                     f"{name!r}, which the header does not describe; described: "
                                     f"{', '.join(families) or 'none'}")
            width = len(header.params) + len(RESULT_FIELDS)
            table: dict[tuple[int, ...], RecordedResult] = {}
            for row_index, row in enumerate(rows):
                where = f"{source}: {name} at {problem.shape}, row {row_index}"
                if len(row) != width:
                    raise RecordingError(f"{where}: {len(row)} values, expected {width} "
                                         f"({len(header.params)} parameters + "
                                         f"{len(RESULT_FIELDS)} result fields)")
                values = row[:len(header.params)]
                for param, value in zip(header.params, values):
                    if isinstance(value, bool) or not isinstance(value, int) \
                            or value not in header.grid[param]:
                        raise RecordingError(f"{where}: {param}={value!r} is not in the recorded "
                                             f"grid {list(header.grid[param])}")
                key = tuple(values)
                if key in table:
                    raise RecordingError(f"{where}: config {header.config(key)} appears twice")
                table[key] = _result_from_row(row[len(header.params):], where)
            entry.results[name] = table
        problems.append(entry)
    return Recording(gpu=model.gpu.model_dump(), arch=model.arch,
                     nvrtc_version=model.nvrtc_version, families=families, problems=problems,
                     created_at=model.created_at, note=model.note)


def write_json(path: str | Path, data: Any, **dumps: Any) -> Path:
    """``data`` as JSON (``dumps``: ``json.dumps``'s options), gzip-compressed where the name
    ends in .gz, through a temporary name: a reader never sees half a file under the real one.
    mtime 0: the same data gives the same bytes (clean diffs, stable hashes)."""
    path = Path(path)
    text = json.dumps(data, allow_nan=False, **dumps).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(gzip.compress(text, compresslevel=9, mtime=0) if path.suffix == ".gz"
                    else text)
    tmp.replace(path)
    return path


def json_from_bytes(raw: bytes) -> Any:
    """JSON from a file's bytes, gzip-compressed (told by its first two bytes) or plain."""
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def read_json(path: str | Path) -> Any:
    """A file ``write_json`` wrote (or any JSON file, gzipped or plain)."""
    return json_from_bytes(Path(path).read_bytes())


@lru_cache(maxsize=1)
def manifest() -> dict[str, Any]:
    """MANIFEST.json: the bundled recordings by name (empty where the file is absent)."""
    try:
        return json.loads(MANIFEST.read_text())
    except FileNotFoundError:
        return {"recordings": {}}


def _renamed() -> dict[str, str]:
    """Old file name → current name, over the bundled recordings."""
    return {old: name for name, entry in manifest()["recordings"].items()
            for old in entry.get("old_names", ())}


def canonical_name(name: str | Path) -> str:
    """The file name of ``name`` (a name or a path) as the bundled recordings are named now:
    an old name of one of them is its current name, any other name stays as it is."""
    base = Path(name).name
    return _renamed().get(base, base)


def resolve(path: str | Path) -> Path:
    """``path``; where no file is there and its name is an old name of a bundled recording,
    that recording under its current name (beside ``path`` if it is there, else bundled)."""
    path = Path(path)
    current = canonical_name(path)
    if current == path.name or path.exists():
        return path
    beside = path.with_name(current)
    return beside if beside.exists() else BUNDLED_RECORDINGS / current


def load(path: str | Path) -> Recording:
    path = resolve(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise RecordingError(f"cannot read recording {str(path)!r}: {error.strerror}") from None
    try:
        data = json_from_bytes(raw)
    except (OSError, EOFError, ValueError) as error:
        raise RecordingError(f"{path}: not a gzip-compressed or plain JSON recording "
                             f"({error})") from None
    return from_json(data, str(path))


@lru_cache(maxsize=None)
def bundled_file(name: str) -> Recording:
    """One bundled recording (its file name), loaded once per process."""
    return load(BUNDLED_RECORDINGS / name)


def _bundled_names() -> list[str]:
    return sorted(path.name for path in BUNDLED_RECORDINGS.glob("*.json.gz"))


def all_bundled() -> tuple[Recording, ...]:
    """Every bundled recording, each loaded once per process (4-7 s for the 145 of them on the
    2-core machine, most of it building the results)."""
    return tuple(bundled_file(name) for name in _bundled_names())


def bundled(gpu_name: str) -> list[Recording]:
    """The bundled recordings made on this GPU model (by its name, as the driver reports it), in
    file-name order; only those are loaded, by MANIFEST.json's word (a file it does not list is
    loaded to see): the H200's 54,136 examples in 1.8 s instead of 3.2 s (2-core)."""
    return [recording for name in bundled_names(gpu_name)
            if (recording := bundled_file(name)).gpu.get("name") == gpu_name]


def bundled_names(gpu_name: str) -> list[str]:
    """The file names of the bundled recordings that may be of this GPU model: those
    MANIFEST.json says are, and any it does not list (``bundled`` loads them to see)."""
    listed = manifest()["recordings"]
    return [name for name in _bundled_names()
            if name not in listed or listed[name].get("gpu") == gpu_name]
