"""/api/best from memory: a snapshot of `db.best_table()` (the fastest ok trial per GPU board,
problem and family version) answers best and nearest exactly as `db.Database.best` would, with no
query per request.

Freshness: at most every `refresh_s` seconds one request checks `db.change_marker()` (a single
cheap query) and, when trials, baselines, GPUs, problems or family versions were added, reloads
the snapshot; the others keep answering from the current one meanwhile. So an answer is at most
`refresh_s` (plus one reload) behind the database. Each uvicorn worker keeps its own snapshot.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, replace

import db
from gemmtune.precision import runnable_on

MEMO_MAX = 50_000  # answers remembered per snapshot (a query mix with random shapes stays bounded)
DEFAULT_KIND = ("fp32", True)  # the dtype and alpha/beta kind /api/best asks for


@dataclass(frozen=True)
class _Problem:
    id: int
    shape: tuple[int, int, int]
    layout: str = "nn"
    batch: int = 1

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return (*self.shape, self.batch)


class Snapshot:
    """Immutable index over one best_table(): per board, per problem, rows fastest first."""

    ASK_DATABASE = object()  # best()'s answer where only the database can say (see there)

    def __init__(self, marker: tuple[int, ...], rows: list[db.BestResult], gpus: list[db.Gpu]) -> None:
        self.marker = marker
        self.gpus = gpus
        self._ids: dict[str, list[int]] = defaultdict(list)
        for g in sorted(gpus, key=lambda g: g.id):
            self._ids[g.name.lower()].append(g.id)
            self._ids[g.uuid.lower()].append(g.id)
        self._rows: dict[int, dict[_Problem, list[db.BestResult]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:  # best_table comes fastest first (ties: oldest trial), which every pick keeps
            p = r.problem
            if (p.dtype, p.general_alpha_beta) == DEFAULT_KIND:
                self._rows[r.gpu_id][_Problem(p.id, (p.m, p.n, p.k), p.layout, p.batch)].append(r)
        self._memo: dict[tuple, db.BestResult | None] = {}

    def gpu_ids(self, gpu: str) -> list[int]:
        return self._ids.get(gpu.strip().lower(), [])

    def first_gpu_name(self, gpu: str) -> str:
        key = gpu.strip().lower()
        found = sorted((g for g in self.gpus if key in (g.name.lower(), g.uuid.lower())), key=lambda g: g.uuid)
        return found[0].name

    def best(self, gpu: str, m: int, n: int, k: int, family: str | None, nearest: bool,
             families: Collection[str] | None, source_hashes: Collection[str] | None = None,
             layout: str = "nn", batch: int = 1, arch: str | None = None) -> db.BestResult | None | object:
        """As db.Database.best(gpu, m, n, k, family, nearest, families=…, source_hashes=…,
        layout=…, batch=…, accept=runnable_on(arch)); the gpu must be known. ASK_DATABASE where a
        row the answer would weigh is refused on `arch`: the snapshot holds only the fastest
        config per family version and problem, so the next one down is the database's to find."""
        key = (gpu.strip().lower(), m, n, k, family, nearest, None if families is None else frozenset(families),
               None if source_hashes is None else frozenset(h.lower() for h in source_hashes), layout, batch, arch)
        if key in self._memo:
            return self._memo[key]
        found = self._best(key[0], (m, n, k), family, nearest, key[6], key[7], layout, batch, arch)
        if len(self._memo) >= MEMO_MAX:
            self._memo.clear()
        self._memo[key] = found
        return found

    def _best(self, gpu_key: str, requested: tuple[int, int, int], family: str | None, nearest: bool,
              families: frozenset[str] | None, hashes: frozenset[str] | None, layout: str = "nn",
              batch: int = 1, arch: str | None = None) -> db.BestResult | None | object:
        runs = runnable_on(arch)

        def allowed(r: db.BestResult) -> bool:
            return ((family is None or r.family == family) and (families is None or r.family in families)
                    and (hashes is None or r.source_hash in hashes))

        by_problem: dict[_Problem, list[db.BestResult]] = defaultdict(list)
        for gpu_id in self._ids.get(gpu_key, []):
            for problem, rows in self._rows.get(gpu_id, {}).items():
                if problem.layout == layout:
                    by_problem[problem].extend(r for r in rows if allowed(r))
        by_problem = {p: rows for p, rows in by_problem.items() if rows}

        def fastest(rows: list[db.BestResult]) -> db.BestResult:
            return min(rows, key=lambda r: (-r.gflops, r.trial_id))

        def refused(rows: list[db.BestResult]) -> bool:  # then a slower config may be the answer
            return runs is not None and any(not runs(r.family, r.params) for r in rows)

        exact = [r for p in by_problem if p.shape == requested and p.batch == batch for r in by_problem[p]]
        if exact:
            return self.ASK_DATABASE if refused(exact) else replace(fastest(exact), requested=requested)
        if not nearest or not by_problem:
            return None
        sizes = (*requested, batch)
        ranked = sorted(by_problem, key=lambda p: (db.log2_distance(p.sizes, sizes),
                                                   p.batch * p.shape[0] * p.shape[1] * p.shape[2],
                                                   p.shape[0], p.shape[1], p.id))
        closest = ranked[0]
        if refused(by_problem[closest]):
            return self.ASK_DATABASE
        return replace(fastest(by_problem[closest]), match="nearest", requested=requested,
                       distance=db.log2_distance(closest.sizes, sizes))


class BestCache:
    def __init__(self, database: db.Database, refresh_s: float = 0.5) -> None:
        self.db = database
        self.refresh_s = refresh_s
        self.snapshot: Snapshot | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self.reloads = 0

    def due(self) -> bool:
        return self.snapshot is None or time.monotonic() - self._checked >= self.refresh_s

    def refresh(self) -> Snapshot:
        """Reload if the database changed. One caller works at a time; while a snapshot exists the
        others do not wait for it (they answer from the current one)."""
        if not self._lock.acquire(blocking=self.snapshot is None):
            return self.snapshot  # type: ignore[return-value]
        try:
            if self.snapshot is not None and time.monotonic() - self._checked < self.refresh_s:
                return self.snapshot
            marker = self.db.change_marker()
            if self.snapshot is None or marker != self.snapshot.marker:
                self.snapshot = Snapshot(marker, self.db.best_table(), self.db.list_gpus())
                self.reloads += 1
            self._checked = time.monotonic()
            return self.snapshot
        finally:
            self._lock.release()


RESPONSES_MAX = 10_000  # distinct query strings remembered per snapshot
_BEST_PATH = "/api/best"
FROM_SNAPSHOT = "gemmtune.from_snapshot"  # scope key: the route answered from the snapshot alone


class BestResponses:
    """ASGI middleware: GET /api/best answered with the bytes the route gave for the same query
    string, while the snapshot they came from is still current and not due for a check. Only
    answers the route gave from the snapshot alone are kept (it marks them in the scope): one
    that needed the database (a GPU registered since, a fallback_gpu) is asked again each time.

    What a request cost after the snapshot was mostly FastAPI's parameter validation and the
    response model's serialisation (the lookup: ~23 µs); a repeat of a query needs neither
    (docs/serving.md, "/api/best from memory" and "API load: bench/api_load.py"). Only 200
    answers are kept. Requests that may write or must be authorised (tune=…, an Authorization
    header) always reach the route; so does the first request after `refresh_s`, which lets
    the route check the database for new results.
    """

    def __init__(self, app, cache: BestCache) -> None:
        self.app = app
        self.cache = cache
        self._snapshot: Snapshot | None = None
        self._kept: dict[bytes, tuple[dict, bytes]] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != _BEST_PATH or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        query: bytes = scope.get("query_string", b"")
        cache = self.cache
        snap = cache.snapshot
        cacheable = (b"tune" not in query
                     and not any(name == b"authorization" for name, _ in scope["headers"]))
        if cacheable and snap is not None and snap is self._snapshot and not cache.due():
            kept = self._kept.get(query)
            if kept is not None:
                await send(kept[0])
                await send({"type": "http.response.body", "body": kept[1]})
                return
        if not cacheable:
            await self.app(scope, receive, send)
            return
        start: dict = {}
        body: list[bytes] = []

        async def capture(message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, capture)
        after = cache.snapshot
        # kept only when the snapshot did not change while the route answered (it may have
        # answered from either one)
        if (start.get("status") == 200 and scope.get(FROM_SNAPSHOT) and snap is not None
                and after is snap):
            if after is not self._snapshot:
                self._snapshot, self._kept = after, {}
            if len(self._kept) >= RESPONSES_MAX:
                self._kept.clear()
            self._kept[query] = (start, b"".join(body))
