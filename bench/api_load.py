"""Load on GET /api/best: a real uvicorn server on 127.0.0.1, the load generator in its own processes.

    python bench/api_load.py [--rate 500] [--seconds 10] [--workers 1] [--clients 2]
                             [--ceiling-workers 1 2] [--out bench/results/api_load.json]

Fills a fresh SQLite database through the tuner's own search loop (stand-in evaluator, no GPU),
starts `python -m api --workers N` on a free loopback port, then:

- open loop at a fixed rate (--rate req/s for --seconds): `--clients` processes, each with a few
  threads on keep-alive connections (http.client, the lightest client in the standard library),
  request i sent at t0 + i/rate; latency counts from the scheduled send time, so a server that
  falls behind shows it (no coordinated omission);
- the ceiling: closed loop (each connection sends its next request when the previous answer is
  in) for --ceiling-seconds with 1 and several server workers: the highest req/s it reaches.

The query mix is fixed (seeded): tuned shapes (exact), shapes near them (nearest), some with a
family filter, some with precision=ffma. Only 127.0.0.1 is contacted. Prints and writes JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_api_support import STANDIN_GPU, free_port, tune_into  # noqa: E402

JOBS = [
    ("naive", (1024, 1024, 1024)),
    ("blocktile2d", (1024, 1024, 1024)),
    ("warptile", (4096, 4096, 4096)),
    ("vectorized", (256, 256, 16384)),
    ("splitk", (256, 256, 16384)),
    ("blocktile1d", (16384, 128, 1024)),
]
THREADS_PER_CLIENT = 8


def queries(count: int, seed: int = 0) -> list[str]:
    """Request paths: 40% near a tuned shape (nearest), 20% with a family, 10% precision=ffma."""
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
        elif roll < 0.7:
            q["precision"] = "ffma"
        out.append("/api/best?" + urllib.parse.urlencode(q))
    return out


# --- the load generator (runs in child processes) ------------------------------------------------------


def _client(port: int, paths: list[str], interval: float, offset: int, stride: int, seconds: float | None,
            ready: mp.Queue, go: mp.Event, t0: mp.Value, out: mp.Queue) -> None:
    """One load process. Open loop: slots offset, offset+stride, … at t0 + slot*interval.
    Closed loop (seconds set): each thread sends back to back until t0 + seconds. t0 is set by
    the parent once every process has started (a spawned process takes a second or two to
    import), so no request is late before the run begins."""
    ready.put(offset)
    go.wait()
    start = t0.value
    closed_until = None if seconds is None else start + seconds
    lock = threading.Lock()
    slots = iter(range(offset, len(paths), stride))
    results: list[tuple[float, int]] = []

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[tuple[float, int]] = []
        i = 0
        while True:
            if closed_until is None:
                with lock:
                    slot = next(slots, None)
                if slot is None:
                    break
                due = start + slot * interval
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                path = paths[slot]
            else:
                due = time.perf_counter()
                if due >= closed_until:
                    break
                path = paths[(offset + i * stride) % len(paths)]
                i += 1
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                status = -1
            mine.append((time.perf_counter() - due, status))
        conn.close()
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(THREADS_PER_CLIENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(results)


def fire(port: int, paths: list[str], *, clients: int, rate: float | None, seconds: float) -> dict:
    """Open loop at `rate` req/s (paths sent in order), or closed loop for `seconds` (rate None)."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    ready: mp.Queue = ctx.Queue()
    go = ctx.Event()
    t0 = ctx.Value("d", 0.0)
    interval = 1.0 / rate if rate else 0.0
    procs = [ctx.Process(target=_client, args=(port, paths, interval, i, clients, None if rate else seconds,
                                               ready, go, t0, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    start = t0.value = time.perf_counter() + 0.2  # CLOCK_MONOTONIC: the same clock in every process
    go.set()
    results = [r for _ in procs for r in out.get()]
    for p in procs:
        p.join()
    wall = (time.perf_counter() - start) if rate is None else (len(paths) * interval)
    ms = sorted(1000 * lat for lat, _ in results)
    statuses: dict[int, int] = {}
    for _, status in results:
        statuses[status] = statuses.get(status, 0) + 1

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))]

    return {
        "mode": "open loop" if rate else "closed loop", "target_rate": rate, "clients": clients,
        "connections": clients * THREADS_PER_CLIENT, "completed": len(ms),
        "errors": sum(n for c, n in statuses.items() if c != 200),
        "status_counts": {str(c): n for c, n in sorted(statuses.items())},
        "requests_per_second": round(len(ms) / wall, 1) if rate is None else round(rate, 1),
        "latency_ms": {"p50": round(pct(50), 2), "p90": round(pct(90), 2), "p99": round(pct(99), 2),
                       "max": round(ms[-1], 2), "mean": round(statistics.fmean(ms), 2)},
    }  # fmt: skip


class ApiServer:
    """`python -m api --workers N` on a free loopback port."""

    def __init__(self, url: str, workers: int) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "api", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--db", url, "--workers", str(workers), "--log-level", "warning"], cwd=ROOT)
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", queries(1)[0])
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("api server did not come up")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=500.0, help="open-loop requests/s (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=10.0, help="open-loop duration (default %(default)s)")
    ap.add_argument("--workers", type=int, default=1, help="server workers for the open-loop run (default %(default)s)")
    ap.add_argument("--clients", type=int, default=2, help="load-generator processes (default %(default)s)")
    ap.add_argument("--ceiling-workers", type=int, nargs="*", default=[1, 2],
                    help="server worker counts for the closed-loop ceiling runs (default: 1 2; none: skip)")
    ap.add_argument("--ceiling-seconds", type=float, default=8.0)
    ap.add_argument("--trials", type=int, default=25, help="trials per tuning run when filling (default %(default)s)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_load.json")
    ap.add_argument("--db", type=Path, default=None,
                    help="reuse this SQLite file (filled on first use) instead of a fresh one per run")
    args = ap.parse_args()
    if not (1 <= args.rate <= 20_000 and 0 < args.seconds <= 600 and 1 <= args.clients <= 16
            and 1 <= args.workers <= 16 and all(1 <= w <= 16 for w in args.ceiling_workers)):
        ap.error("--rate 1..20000, --seconds (0, 600], --clients 1..16, --workers and --ceiling-workers 1..16")

    load_before = [round(x, 2) for x in os.getloadavg()]  # the 2 cores may be shared: say how busy they were
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "bench.sqlite"
        url = f"sqlite:///{path.absolute()}"
        t0 = time.perf_counter()
        reused = path.exists()
        n_runs = len(JOBS) if reused else len(tune_into(url, JOBS, trials=args.trials).run_ids)
        fill_s = time.perf_counter() - t0
        runs = []
        server = ApiServer(url, args.workers)
        try:
            fire(server.port, queries(200, seed=1), clients=1, rate=200.0, seconds=1)  # warm-up
            paths = queries(int(args.rate * args.seconds), seed=0)
            run = fire(server.port, paths, clients=args.clients, rate=args.rate, seconds=args.seconds)
            runs.append(run | {"server_workers": args.workers})
        finally:
            server.stop()
        for workers in args.ceiling_workers:
            server = ApiServer(url, workers)
            try:
                fire(server.port, queries(200, seed=1), clients=1, rate=200.0, seconds=1)
                run = fire(server.port, queries(20_000, seed=2), clients=args.clients, rate=None,
                           seconds=args.ceiling_seconds)
                runs.append(run | {"server_workers": workers})
            finally:
                server.stop()

    result = dict(
        endpoint="/api/best", runs=runs, runs_in_db=n_runs, trials_per_run=args.trials,
        fill_seconds=round(fill_s, 2), server="uvicorn (python -m api --workers N)", database="SQLite file",
        client="http.client keep-alive, threads in separate processes", host=platform.node(),
        python=platform.python_version(), cpus=os.cpu_count(), load_average_before=load_before,
        uvicorn_http="httptools" if _has("httptools") else "h11", uvicorn_loop="uvloop" if _has("uvloop") else "asyncio",
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for r in runs:
        lat = r["latency_ms"]
        print(f"{r['mode']:<11} workers {r['server_workers']}: {r['requests_per_second']:>7.0f} req/s "
              f"({r['completed']} requests, {r['errors']} errors, {r['connections']} connections)  "
              f"p50 {lat['p50']:.2f} ms  p90 {lat['p90']:.2f} ms  p99 {lat['p99']:.2f} ms  max {lat['max']:.1f} ms")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
