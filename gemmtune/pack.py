"""Packs: the best configs per (GPU model, shape, arithmetic class) in one small JSON file, with
provenance, for `matmul` on machines with no database (as CLBlast ships its tuning database).

    {"format": "gemmtune-pack", "version": 1, "created_at": "…Z", "database": "<url, no password>",
     "entries": [{"gpu", "m", "n", "k", "layout", "batch", "precision": "ffma" | "fp32-tc", "family", "source_hash",
                  "config": {…}, "gflops", "time_median_ms", "cublas_gflops", "fraction_of_cublas",
                  "run_id", "trial_id", "trial_number", "gpu_uuid"}, …],
     "gpus": {"<uuid>": {"name", "uuid", "compute_capability", "sm_count", "memory_bytes", …}}}

One entry per (GPU model, problem, class), a problem being the shape, layout and batch count
("layout" and "batch" may be absent in packs written before them: "nn" and 1): the fastest verified
trial of the installed version of a family of that class. A request for precision "fp32" picks among both classes, "ffma" among
"ffma" entries only. Built by `python -m gemmtune export-pack` and GET /api/pack (same code).
`python -m gemmtune import-pack` stores a pack's entries in a results database (one finished run
of one trial per entry, with its cuBLAS baseline), so a service or the dashboard can serve
results tuned elsewhere; it needs the "gpus" records (packs of older exports lack them).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import warnings
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import db
import kernels
from kernels.layout import LAYOUTS

from .answers import Answer, Entry, SourceUnavailable
from .precision import allowed_families, check_precision, installed_hashes, runnable_on

FORMAT = "gemmtune-pack"
VERSION = 1
ENTRY_KEYS = ("gpu", "m", "n", "k", "precision", "family", "source_hash", "config", "gflops")


class PackError(ValueError):
    """A file that is not a gemmtune pack of a version this code reads (names the file and why)."""


def build_pack(database: db.Database, *, gpus: Iterable[str] | None = None, precision: str = "fp32",
               installed_only: bool = True) -> dict[str, Any]:
    """The pack of everything in the database (or the named GPU models only).

    installed_only: keep only results of the family versions installed here (a pack is for
    running, and a reader skips other versions anyway), and of those the configs the installed
    family accepts on the board's architecture (the fastest accepted one where a narrowed
    parameter space refuses the fastest); False keeps every version and config.
    """
    families = allowed_families(check_precision(precision))
    hashes = {name: f.source_hash for name, f in families.items()}  # hashing reads the sources: once
    wanted = None if gpus is None else {g.strip().lower() for g in gpus}
    archs = {g.uuid: kernels.arch_of(g.compute_capability) for g in database.list_gpus()}
    best: dict[tuple[str, int, int, int, str, int, str], db.BestResult] = {}
    for r in database.best_table():  # the fastest config per board, problem and family version
        fam = families.get(r.family)
        if fam is None or (installed_only and r.source_hash != hashes[r.family]):
            continue
        if wanted is not None and r.gpu_name.lower() not in wanted and r.gpu_uuid.lower() not in wanted:
            continue
        p = r.problem
        if (p.dtype, p.general_alpha_beta) != ("fp32", True):
            continue
        runs = runnable_on(archs[r.gpu_uuid]) if installed_only else None
        if runs is not None and not runs(r.family, r.params):
            r = database.best(r.gpu_uuid, p.m, p.n, p.k, family=r.family, nearest=False, source_hash=r.source_hash,
                              layout=p.layout, batch=p.batch, accept=runs)
            if r is None:
                continue
        key = (r.gpu_name, p.m, p.n, p.k, p.layout, p.batch, fam.precision)
        if key not in best or (r.gflops, -r.trial_id) > (best[key].gflops, -best[key].trial_id):
            best[key] = r
    entries = [_entry(key[-1], r) for key, r in sorted(best.items(), key=lambda kv: kv[0])]
    boards = {e["gpu_uuid"] for e in entries}
    gpus = {g.uuid: {f.name: getattr(g, f.name) for f in dataclasses.fields(db.GpuInfo)}
            for g in database.list_gpus() if g.uuid in boards}
    return {"format": FORMAT, "version": VERSION,
            "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "database": _label(database.url), "precision": precision, "entries": entries,
            "gpus": gpus}


def import_pack(pack: dict[str, Any], database: db.Database, *, source: str) -> int:
    """Store each entry of ``pack`` (as read_pack returns it) as one finished run of one verified
    trial, with its cuBLAS baseline where the pack has one; returns the runs stored. ``source``
    names the pack in each run's command. PackError (nothing stored) when a board's record is
    missing."""
    gpus = pack.get("gpus") or {}
    lacking = sorted({e["gpu"] for e in pack["entries"] if e.get("gpu_uuid") not in gpus})
    if lacking:
        raise PackError(f"pack {source} has no GPU record for {', '.join(lacking)} (written by an "
                        "older export-pack): export it again to import it")
    for e in pack["entries"]:
        gpu_id = database.ensure_gpu(db.GpuInfo(**gpus[e["gpu_uuid"]]))
        problem_id = database.ensure_problem(e["m"], e["n"], e["k"], layout=e.get("layout", "nn"),
                                             batch=e.get("batch", 1))
        run_id = database.start_run(
            gpu_id=gpu_id, problem_id=problem_id,
            family_id=database.ensure_family(e["family"], e["source_hash"]), sampler="pack",
            seed=None, budget={}, host=socket.gethostname(), command=f"import-pack {source}",
            study_name=None)
        database.add_trial(run_id, db.TrialRecord(
            number=0, params=dict(e["config"]), state="ok", time_median_ms=e.get("time_median_ms"),
            gflops=e["gflops"]))
        database.finish_run(run_id, "finished")
        cublas = e.get("cublas_gflops")
        if cublas:
            flop = 2.0 * e["m"] * e["n"] * e["k"] * e.get("batch", 1)
            database.add_baseline(gpu_id=gpu_id, problem_id=problem_id, run_id=run_id,
                                  time_median_ms=flop / (cublas * 1e6), gflops=cublas)
    return len(pack["entries"])


def _label(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _entry(cls: str, r: db.BestResult) -> dict[str, Any]:
    p = r.problem
    return {
        "gpu": r.gpu_name, "m": p.m, "n": p.n, "k": p.k, "layout": p.layout, "batch": p.batch,
        "precision": cls, "family": r.family,
        "source_hash": r.source_hash, "config": dict(r.params), "gflops": r.gflops,
        "time_median_ms": r.time_median_ms, "cublas_gflops": r.baseline_gflops,
        "fraction_of_cublas": r.fraction_of_cublas, "run_id": r.run_id, "trial_id": r.trial_id,
        "trial_number": r.trial_number, "gpu_uuid": r.gpu_uuid,
    }  # fmt: skip


def write_pack(pack: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(pack, indent=1, sort_keys=False) + "\n")
    return path


def read_pack(path: str | Path) -> dict[str, Any]:
    """Parse and check a pack file; PackError names the file and what is wrong."""
    path = Path(path)
    try:
        pack = json.loads(path.read_text())
    except OSError as exc:
        raise PackError(f"cannot read pack {path}: {exc}") from exc
    except ValueError as exc:
        raise PackError(f"pack {path} is not JSON: {exc}") from exc
    if not isinstance(pack, dict) or pack.get("format") != FORMAT:
        raise PackError(f"{path} is not a gemmtune pack (needs \"format\": \"{FORMAT}\")")
    if pack.get("version") != VERSION:
        raise PackError(f"pack {path} has version {pack.get('version')!r}; this gemmtune reads version {VERSION}")
    entries = pack.get("entries")
    if not isinstance(entries, list):
        raise PackError(f"pack {path}: \"entries\" must be a list")
    for i, e in enumerate(entries):
        missing = [key for key in ENTRY_KEYS if not isinstance(e, dict) or key not in e]
        if missing:
            raise PackError(f"pack {path}: entry {i} lacks {', '.join(missing)}")
        if not all(isinstance(e[d], int) and e[d] >= 1 for d in "mnk") or not isinstance(e["config"], dict):
            raise PackError(f"pack {path}: entry {i} needs positive integer m, n, k and a config object")
        if e.get("layout", "nn") not in LAYOUTS or not (isinstance(e.get("batch", 1), int) and e.get("batch", 1) >= 1):
            raise PackError(f"pack {path}: entry {i} has layout {e.get('layout')!r} and batch {e.get('batch')!r}; "
                            f"allowed: a layout among {', '.join(LAYOUTS)} and a positive integer batch")
    return pack


class PackSource:
    """A pack file as a tuning source: read once (on first lookup), entries of family versions not
    installed here dropped with one warning, then answered from memory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.label = str(self.path)
        self._entries: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            if self._entries is None:
                try:
                    pack = read_pack(self.path)
                except PackError as exc:
                    raise SourceUnavailable(str(exc)) from exc
                self._entries = self._installed(pack["entries"])
            return self._entries

    def _installed(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept, stale = [], {}
        installed = {name: h for h, name in installed_hashes("fp32").items()}  # family → installed hash
        for e in entries:
            if installed.get(e["family"]) == str(e["source_hash"]).lower():
                kept.append(e)
            else:
                stale[e["family"]] = stale.get(e["family"], 0) + 1
        if stale:
            listing = ", ".join(f"{name} ({count})" for name, count in sorted(stale.items()))
            warnings.warn(
                f"gemmtune: pack {self.path}: skipped {sum(stale.values())} entries whose kernel family is not "
                f"installed here in the same version (source hash differs): {listing}; they are never run",
                RuntimeWarning, stacklevel=4,
            )
        return kept

    def lookup(self, gpu: str, m: int, n: int, k: int, precision: str, layout: str = "nn",
               batch: int = 1, arch: str | None = None) -> Answer:
        families = allowed_families(precision)
        runs = runnable_on(arch)
        key = gpu.strip().lower()
        mine = [e for e in self.entries() if e["gpu"].lower() == key]
        if not mine:
            return Answer(None, f"GPU model {gpu!r} is not in pack {self.label}")
        # The installed family's declared class decides, not the label in the file.
        ok = [e for e in mine if e["family"] in families and e.get("layout", "nn") == layout
              and (runs is None or runs(e["family"], e["config"]))]
        if not ok:
            return Answer(None, f"pack {self.label} has no {precision} entries for {gpu} in layout {layout}"
                                + (f" that run on {arch}" if arch else ""))

        def sizes(e: dict[str, Any]) -> tuple[int, int, int, int]:
            return e["m"], e["n"], e["k"], e.get("batch", 1)

        wanted = (m, n, k, batch)
        exact = [e for e in ok if sizes(e) == wanted]
        match, distance = "exact", 0.0
        if not exact:
            ranked = sorted({sizes(e) for e in ok},
                            key=lambda s: (db.log2_distance(s, wanted), s[0] * s[1] * s[2] * s[3], s[0], s[1]))
            match, distance = "nearest", db.log2_distance(ranked[0], wanted)
            exact = [e for e in ok if sizes(e) == ranked[0]]
        e = max(exact, key=lambda e: (e["gflops"], -(e.get("trial_id") or 0)))
        return Answer(Entry(
            match=match, shape=(e["m"], e["n"], e["k"]), distance=distance, gpu=e["gpu"], family=e["family"],
            source_hash=e["source_hash"], config={str(p): int(v) for p, v in e["config"].items()},
            gflops=float(e["gflops"]), cublas_gflops=e.get("cublas_gflops"), run_id=e.get("run_id"),
            trial_id=e.get("trial_id"), trial_number=e.get("trial_number"), batch=e.get("batch", 1),
        ))  # fmt: skip
