"""Tuning sources: where `matmul` learns the best config for (GPU model, M, N, K, precision).

Three kinds, chosen by the spelling of `source=` or $GEMMTUNE_SOURCE (default: the tuner's own
results database, `db.resolve_url`):

- ``http://…`` / ``https://…``: the API's base URL (GET /api/best, POST /api/jobs on a miss when
  tune-on-miss is on);
- a path ending in ``.json``: an exported pack (gemmtune/pack.py), no database needed;
- anything else: a results database URL or SQLite file path, read through `db`.

Every source answers with an `Entry` (answers.py; or None: nothing tuned for that GPU, layout and
precision) and only with versions of the families installed here; an unusable source raises
`SourceUnavailable`.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path
from typing import Literal

import db
from kernels.layout import problem_label

from .answers import Answer, Entry, Source, SourceUnavailable
from .precision import allowed_families, installed_hashes, runnable_on

SOURCE_ENV = "GEMMTUNE_SOURCE"
TOKEN_ENV = "GEMMTUNE_API_TOKEN"
TUNE_ENV = "GEMMTUNE_TUNE_ON_MISS"
HTTP_TIMEOUT_S = 2.0


def default_spec() -> str:
    return os.environ.get(SOURCE_ENV) or db.resolve_url(None)


def kind_of(spec: str) -> Literal["http", "pack", "database"]:
    low = spec.lower()
    if low.startswith(("http://", "https://")):
        return "http"
    if low.endswith(".json") and "://" not in low:
        return "pack"
    return "database"


def open_source(spec: str) -> Source:
    """A source for a spelling (see the module docstring); nothing is opened or fetched yet."""
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"source must be a non-empty string (database URL, http(s):// API URL or .json pack path) "
                        f"or a source object, got {spec!r}")
    kind = kind_of(spec)
    if kind == "http":
        return HttpSource(spec)
    if kind == "pack":
        from .pack import PackSource

        return PackSource(spec)
    return DatabaseSource(spec)


# --- database -------------------------------------------------------------------------------------


class DatabaseSource:
    """A results database read through `db` (opened on first lookup, kept open)."""

    def __init__(self, url: str) -> None:
        self.url = db.resolve_url(url)
        from sqlalchemy.engine import make_url

        parsed = make_url(self.url)
        if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
            # An unreachable server must cost seconds, not the OS's TCP timeout (minutes).
            parsed = parsed.update_query_dict({"connect_timeout": str(int(HTTP_TIMEOUT_S * 2))})
            self.url = parsed.render_as_string(hide_password=False)
        self.label = parsed.render_as_string(hide_password=True)
        # A SQLite file that does not exist yet means "nothing tuned here": never create one.
        self._missing_file = (parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
                              and not Path(parsed.database).exists())
        self._db: db.Database | None = None
        self._lock = threading.Lock()

    def _open(self) -> db.Database:
        with self._lock:
            if self._db is None:
                try:
                    self._db = db.open_database(self.url)
                except Exception as exc:  # StorageError, driver errors, an unreachable server
                    raise SourceUnavailable(f"cannot open the results database {self.label}: {exc}") from exc
            return self._db

    def lookup(self, gpu: str, m: int, n: int, k: int, precision: str, layout: str = "nn",
               batch: int = 1, arch: str | None = None) -> Answer:
        if self._missing_file:
            return Answer(None, f"the results database {self.label} does not exist (nothing tuned yet)")
        database = self._open()
        hashes = installed_hashes(precision)
        try:
            found = database.best(gpu, m, n, k, families=list(allowed_families(precision)),
                                  source_hashes=list(hashes), layout=layout, batch=batch, accept=runnable_on(arch))
        except db.UnknownGpuError:
            return Answer(None, f"GPU model {gpu!r} was never tuned in {self.label}")
        except db.InvalidInputError:
            raise
        except Exception as exc:
            raise SourceUnavailable(f"cannot read the results database {self.label}: {exc}") from exc
        if found is None:
            return Answer(None, f"nothing tuned on {gpu} in layout {layout} with the installed {precision} kernels "
                                f"{'that run on ' + arch + ' ' if arch else ''}in {self.label}")
        p = found.problem
        return Answer(Entry(
            match=found.match, shape=(p.m, p.n, p.k), distance=found.distance, gpu=found.gpu_name,
            family=found.family, source_hash=found.source_hash, config=dict(found.params), gflops=found.gflops,
            cublas_gflops=found.baseline_gflops, run_id=found.run_id, trial_id=found.trial_id,
            trial_number=found.trial_number, batch=p.batch,
        ))  # fmt: skip


# --- HTTP API ---------------------------------------------------------------------------------------


class HttpSource:
    """The API: GET /api/best (precision filter on the server); with tune_on_miss and a write token,
    a miss (no exact match) also queues a tuning job with POST /api/jobs. Standard library only."""

    def __init__(self, base_url: str, *, token: str | None = None, tune_on_miss: bool | None = None,
                 timeout_s: float = HTTP_TIMEOUT_S) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"source must be an http(s):// URL of the API, got {base_url!r}")
        self.base = base_url.rstrip("/")
        self.label = urllib.parse.urlunsplit((parsed.scheme, parsed.hostname + (f":{parsed.port}" if parsed.port else ""),
                                              parsed.path, "", ""))  # no credentials in explain()
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        if tune_on_miss is None:
            tune_on_miss = os.environ.get(TUNE_ENV, "").lower() in ("1", "true", "yes")
        self.tune_on_miss = tune_on_miss
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token and method == "POST":
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            try:
                payload = json.loads(err.read() or b"{}")
            except ValueError:
                payload = {}
            return err.code, payload if isinstance(payload, dict) else {}
        except (OSError, ValueError) as exc:  # refused, timed out, DNS, not JSON
            raise SourceUnavailable(f"cannot reach the gemmtune API at {self.label}: {exc}") from exc

    def lookup(self, gpu: str, m: int, n: int, k: int, precision: str, layout: str = "nn",
               batch: int = 1, arch: str | None = None) -> Answer:
        query = urllib.parse.urlencode([("gpu", gpu), ("m", m), ("n", n), ("k", k), ("precision", precision),
                                        ("layout", layout), ("batch", batch)]
                                       + [("source_hash", h) for h in sorted(installed_hashes(precision))]
                                       + ([("arch", arch)] if arch else []))
        status, out = self._request("GET", f"/api/best?{query}")
        if status == 404:
            return Answer(None, f"GPU model {gpu!r} is unknown to the API at {self.label}")
        if status != 200:
            raise SourceUnavailable(f"the API at {self.label} answered {status}: {out.get('detail', '')}")
        notes = ()
        if self.tune_on_miss and out.get("match") != "exact":
            notes = (self._queue(out.get("gpu", gpu), m, n, k, precision, layout, batch),)
        best = out.get("best")
        if out.get("match") not in ("exact", "nearest") or not best:
            return Answer(None, f"nothing tuned on {gpu} for precision {precision} at {self.label}", notes)
        installed = installed_hashes(precision)
        if installed.get(best.get("source_hash")) != best["family"]:
            return Answer(None, f"the API's best ({best['family']} @ {str(best.get('source_hash'))[:12]}) is not the "
                                f"installed version of that family; not run", notes)
        shape = out.get("shape") or out["requested"]
        return Answer(Entry(
            match=out["match"], shape=(shape["m"], shape["n"], shape["k"]), distance=float(out.get("distance") or 0.0),
            gpu=out.get("gpu", gpu), family=best["family"], source_hash=best["source_hash"],
            config={str(p): int(v) for p, v in best["config"].items()}, gflops=float(best["gflops"]),
            cublas_gflops=best.get("cublas_gflops"), run_id=best.get("run_id"), trial_id=best.get("trial_id"),
            trial_number=best.get("trial_number"), batch=int(out.get("shape_batch") or 1),
        ), notes=notes)  # fmt: skip

    def _queue(self, gpu: str, m: int, n: int, k: int, precision: str, layout: str = "nn", batch: int = 1) -> str:
        """Queue a tuning job for this problem (families of the precision); never raises."""
        if not self.token:
            return f"tune-on-miss is on but no write token ({TOKEN_ENV}); no job queued"
        body: dict = {"gpu": gpu, "m": m, "n": n, "k": k, "layout": layout, "batch": batch}
        if precision != "fp32":
            body["families"] = sorted(allowed_families(precision))
        try:
            status, out = self._request("POST", "/api/jobs", body)
        except SourceUnavailable as exc:
            return f"could not queue a tuning job: {exc}"
        if status in (200, 201):
            what = problem_label(m, n, k, layout, batch)
            return f"tuning job {out.get('id')} {'queued' if status == 201 else 'already open'} for {what}"
        msg = f"could not queue a tuning job: the API answered {status}: {out.get('detail', '')}"
        warnings.warn(f"gemmtune: {msg}", RuntimeWarning, stacklevel=2)
        return msg
