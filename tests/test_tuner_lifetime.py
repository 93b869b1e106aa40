"""Children die with their parent: ``kill -9`` of a running ``python -m tuner`` (or ``--worker``)
leaves none of its processes behind — not the compile pool, not the GPU child, not
multiprocessing's resource tracker (tuner.lifetime). On CPU: the GPU child runs the stand-in
bench (GEMMTUNE_GPU_BACKEND=tuner.testing), compiles are real NVRTC. Linux only (/proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import db
import pytest

from tuner.measure.testing import StandInEvaluator

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (96, 64, 32)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live process below ``root``: pid → start time (a reused pid is not the same one)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[0] != "Z":
            parents.setdefault(stat[1], []).append(int(entry.name))
            starts[int(entry.name)] = stat[2]
    found: dict[int, int] = {}
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = starts[pid]
        todo += parents.get(pid, [])
    return found


def alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == start


def _command(tmp_path: Path, mode: str) -> list[str]:
    results = tmp_path / "results.sqlite"
    common = ["--workers", "2", "--trials", "40", "--db", str(results), "-v"]
    if mode == "tune":
        return ["--kernel", "naive", "--shape", "x".join(map(str, SHAPE)), *common]
    # --worker: one queued job for the stand-in's GPU model
    info = StandInEvaluator().info()
    with db.open_database(str(results)) as database:
        database.ensure_gpu(db.GpuInfo(**info))
        database.enqueue_job(info["name"], *SHAPE, families=["naive"], budget={"trials": 40})
    return ["--worker", "--once", *common]


@pytest.mark.parametrize("mode", ["tune", "worker"])
def test_sigkill_of_the_tuner_leaves_no_process_behind(tmp_path, mode):
    env = {**os.environ, "GEMMTUNE_GPU_BACKEND": "tuner.testing", "PYTHONUNBUFFERED": "1",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "GEMMTUNE_CACHE": "",
           "GEMMTUNE_STORAGE": ""}
    process = subprocess.Popen([sys.executable, "-m", "tuner", *_command(tmp_path, mode)],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    children: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        for line in process.stderr:  # type: ignore[union-attr]
            if " ok " in line and "trial " in line:  # measuring: pool and GPU child are up
                children = descendants(process.pid)
                break
            assert time.monotonic() < deadline, "no trial measured within 120 s"
        # keep reading, so a full pipe never blocks the tuner
        threading.Thread(target=process.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        assert process.poll() is None, "the tuner ended before it could be killed"
        # two compile processes, the GPU child and the resource tracker
        assert len(children) >= 3, children
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        deadline = time.monotonic() + 20
        while (left := [pid for pid, start in children.items() if alive(pid, start)]) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"still alive after their parent was killed: {left}"
    finally:
        if process.poll() is None:
            process.kill()
        for pid, start in children.items():  # do not leak them into the test run either
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)


# A parent that starts one child and waits: the child takes the portable way (no prctl), as
# on a system other than Linux, and must notice the parent's death by itself.
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(__import__("os").getpid())])
print(child.pid, flush=True)
time.sleep(120)
"""
_CHILD = """
import sys, time
sys.platform = "elsewhere"  # not Linux: the parent is watched by a thread
from tuner.lifetime import die_with_parent
die_with_parent(int(sys.argv[1]))
time.sleep(120)
"""


def test_without_prctl_a_child_notices_its_parent_is_gone():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())  # type: ignore[union-attr]
    start = _stat(child)[2]  # type: ignore[index]
    try:
        time.sleep(0.5)
        assert alive(child, start), "the child should live while its parent does"
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child, start) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child, start)
    finally:
        parent.kill()
        if alive(child, start):
            os.kill(child, signal.SIGKILL)


def test_closing_the_evaluator_ends_compiles_in_flight_instead_of_waiting(tmp_path):
    """What a command still needed it has collected: closing the compile pool kills the
    compiles in flight (they held the command's end up to a second on the H100) and caches
    nothing half done."""
    import multiprocessing as mp

    import kernels
    from kernels.compiler import cached_config
    from tuner.measure.live import LiveEvaluator

    # Two of the slowest compiles (0.75-0.85 s each on the 2-core machine with NVRTC loaded; a
    # warptile sample took 0.3 s, which a 0.3 s wait let finish on an idle machine).
    pipelined = kernels.get_family("pipelined")
    configs = [dict(BM=256, BN=32, BK=32, WM=64, WN=32, WNITER=1, TM=8, TN=4, THREADS=128, PADA=0, RASTER=8, STAGES=2),
               dict(BM=128, BN=128, BK=32, WM=64, WN=32, WNITER=2, TM=4, TN=8, THREADS=256, PADA=4, RASTER=16,
                    STAGES=4)]
    assert all(pipelined.accepts(c, "sm_90") for c in configs)
    with LiveEvaluator(0, cache_dir=tmp_path, workers=2, backend="tuner.testing") as evaluator:
        evaluator.wait_started()  # the workers up, so the compiles begin at once
        evaluator.pool.arch = evaluator.arch()
        compiles = [evaluator.pool.submit(pipelined, config) for config in configs]
        time.sleep(0.1)  # both begun, neither done
    assert all(future.done() for future in compiles)
    assert not any(cached_config(pipelined, c, "sm_90", tmp_path) for c in configs)
    assert not [p for p in mp.active_children() if p.is_alive()]
