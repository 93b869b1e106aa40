"""How long tuner processes live.

The command stops between trials, not in the middle of one, on Ctrl-C or SIGTERM
(``StopRequest``). Its children (the compile pool's processes, the GPU child) leave Ctrl-C to
it and end when it dies, however it dies, SIGKILL included (``child_init``): a worker host
restarted with ``kill -9`` must not collect orphans. multiprocessing's resource tracker then
ends by itself, once every process that held its pipe is gone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)


class StopRequest:
    """The first SIGINT or SIGTERM (``docker stop``) sets ``requested``: the loop finishes the
    trial in hand, records it and stops. A second one raises KeyboardInterrupt. Outside the main
    thread (where Python cannot install handlers) it only serves as a flag."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}
        self._installed = False

    def request(self) -> None:
        self.requested = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("%s: stopping after the current trial (once more to abort at once)",
                    signal.Signals(signum).name)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._installed:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)  # type: ignore[arg-type]
            self._installed = False


def ignore_sigint() -> None:
    """For child processes: Ctrl-C reaches the whole process group, but only the parent decides."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---------------------------------------------------------------- children

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_CHECK_S = 1.0  # the portable fallback's look at the parent


def child_init(parent_pid: int) -> None:
    """Run first in every child process of the tuner (compile pool initializer, GPU child):
    Ctrl-C is the parent's to act on, and the child ends when its parent dies."""
    ignore_sigint()
    die_with_parent(parent_pid)


def die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` (its parent) dies, however it dies (SIGKILL too).

    On Linux the kernel sends SIGKILL (``prctl(PR_SET_PDEATHSIG)``), even into a child stuck in
    C code (NVRTC, a hung CUDA kernel). The signal is tied to the parent *thread* that started
    the child, so children must be started from a thread that lives as long as the parent (the
    tuner starts them from its main thread). Elsewhere, or if prctl fails, a daemon thread
    looks at the parent every PARENT_CHECK_S seconds. A parent that died before this ran is
    noticed at once: the child has been reparented."""
    if not (sys.platform.startswith("linux") and _set_parent_death_signal()):
        threading.Thread(target=_watch_parent, args=(parent_pid,), name="gemmtune-parent-watch",
                         daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _set_parent_death_signal() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def kill_pool(executor: Any) -> None:
    """End a ProcessPoolExecutor at once: kill its processes (a compile half done is of no use,
    and waiting for one held up the command's end by up to a second on the H100:
    docs/measurement.md, "Compile pool"), then shut it down. A killed compile leaves no cache
    entry (entries are written atomically, and its lock is released with the process)."""
    # (Python 3.14 has executor.terminate_workers(); before it, its processes' handles)
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        process.kill()
    executor.shutdown(wait=True, cancel_futures=True)
