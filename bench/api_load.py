"""Load on GET /api/best: a real uvicorn server on 127.0.0.1, concurrent clients, latency figures.

    python bench/api_load.py [--requests 2000] [--concurrency 16] [--seconds 60] [--out bench/results/api_load.json]

Fills a fresh SQLite database through the tuner's own search loop (stand-in evaluator, no GPU),
starts `python -m api` on a free loopback port, then fires a bounded number of `/api/best`
requests (a mix of exact, nearest and per-family queries) from a pool of threads, each with its
own HTTP connection. Only 127.0.0.1 is ever contacted. Prints p50/p99 latency and requests/s and
writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_api_support import STANDIN_GPU, Server, tune_into  # noqa: E402

JOBS = [
    ("naive", (1024, 1024, 1024)),
    ("blocktile2d", (1024, 1024, 1024)),
    ("warptile", (4096, 4096, 4096)),
    ("vectorized", (256, 256, 16384)),
    ("splitk", (256, 256, 16384)),
    ("blocktile1d", (16384, 128, 1024)),
]


def queries(count: int, seed: int = 0) -> list[dict[str, object]]:
    """A fixed mix: tuned shapes (exact), shapes near them (nearest), some with a family filter."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        family, (m, n, k) = rng.choice(JOBS)
        q: dict[str, object] = {"gpu": STANDIN_GPU, "m": m, "n": n, "k": k}
        roll = rng.random()
        if roll < 0.4:
            q.update(m=max(1, m + rng.randint(-200, 200)), n=max(1, n + rng.randint(-64, 64)))
        elif roll < 0.6:
            q["kernel"] = family
        out.append(q)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="total requests (default %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16, help="client threads (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=60.0, help="stop firing after this long (default %(default)s)")
    ap.add_argument("--trials", type=int, default=25, help="trials per tuning run when filling (default %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_load.json")
    args = ap.parse_args()
    if not (1 <= args.requests <= 100_000 and 1 <= args.concurrency <= 256 and 0 < args.seconds <= 600):
        ap.error("--requests must be 1..100000, --concurrency 1..256, --seconds in (0, 600]")

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.sqlite"
        t0 = time.perf_counter()
        tuned = tune_into(url, JOBS, trials=args.trials)
        fill_s = time.perf_counter() - t0
        server = Server(url)
        try:
            result = fire(server.base, queries(args.requests), args.concurrency, args.seconds)
        finally:
            server.stop()

    result.update(
        endpoint="/api/best", concurrency=args.concurrency, runs_in_db=len(tuned.run_ids),
        trials_per_run=args.trials, fill_seconds=round(fill_s, 2), server="uvicorn (python -m api), 1 worker",
        database="SQLite file", host=platform.node(), python=platform.python_version(),
        cpus=__import__("os").cpu_count(), when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"/api/best: {result['completed']} requests ({result['errors']} errors) in {result['wall_seconds']:.2f} s, "
        f"concurrency {args.concurrency}: {result['requests_per_second']:.0f} req/s, "
        f"p50 {result['latency_ms']['p50']:.1f} ms, p99 {result['latency_ms']['p99']:.1f} ms"
    )
    print(f"wrote {args.out}")


def fire(base: str, qs: list[dict[str, object]], concurrency: int, seconds: float) -> dict:
    assert base.startswith("http://127.0.0.1:"), base  # loopback only
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    local = threading.local()

    def one(q: dict[str, object]) -> None:
        if time.monotonic() > deadline:
            return
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=base, timeout=30)
        start = time.perf_counter()
        try:
            code = local.http.get("/api/best", params=q).status_code
        except httpx.HTTPError:
            code = -1
        took = time.perf_counter() - start
        with lock:
            latencies.append(took)
            statuses[code] = statuses.get(code, 0) + 1

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, qs))
    wall = time.perf_counter() - start
    ms = sorted(1000 * x for x in latencies)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))]

    return {
        "requested": len(qs), "completed": len(ms), "errors": sum(n for c, n in statuses.items() if c != 200),
        "status_counts": {str(c): n for c, n in sorted(statuses.items())}, "wall_seconds": round(wall, 3),
        "requests_per_second": round(len(ms) / wall, 1),
        "latency_ms": {"p50": round(pct(50), 2), "p90": round(pct(90), 2), "p99": round(pct(99), 2),
                       "max": round(ms[-1], 2), "mean": round(statistics.fmean(ms), 2)},
    }  # fmt: skip


if __name__ == "__main__":
    main()
