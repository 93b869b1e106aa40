"""Storage writes off the main thread: one writer thread per study run.

Each finished trial costs the Optuna RDB storage a transaction and the results database an
insert (~90-105 ms of CPU on a small box); the study loop hands them to ``StoreWriter`` and
goes on asking and feeding the GPU child. Jobs run one at a time in the order submitted, so
the storage numbers trials and the results database records them exactly as a synchronous
loop would. The main thread ``flush``es before it reads the storage or ends the run.

A failed job stops the writer: later jobs are not run (their writes would follow a gap) and
the error is raised on the main thread at the next ``submit`` or ``flush``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
_Job = tuple[Callable[[], object], "Future[object]"]


class WriterFailed(RuntimeError):
    """A job that was not run because an earlier one failed."""


def done(value: T) -> Future[T]:
    """A future that already holds ``value`` (e.g. a number read back from the storage)."""
    future: Future[T] = Future()
    future.set_result(value)
    return future


class StoreWriter:
    """Runs submitted jobs in order on one daemon thread, started on the first job.
    ``background=False`` runs each job inline (the synchronous path, kept for comparison)."""

    def __init__(self, name: str = "gemmtune-store", background: bool = True) -> None:
        self.name, self.background = name, background
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()  # the two counters below, read by the main thread
        self._seconds = 0.0  # time spent in jobs since the last ``take_seconds``
        self._jobs = 0

    def submit(self, job: Callable[[], T]) -> Future[T]:
        self._raise()
        future: Future[T] = Future()
        if not self.background:
            self._run_one(job, future)  # type: ignore[arg-type]
            self._raise()
            return future
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put((job, future))  # type: ignore[arg-type]
        return future

    def flush(self) -> None:
        """Wait until every job submitted so far has run; raise a job's error, if any."""
        if self._thread is not None:
            self._queue.join()
        self._raise()

    def close(self) -> BaseException | None:
        """Run what is queued, end the thread; returns (does not raise) a job's error, so that
        a caller already handling another exception does not lose it."""
        if self._thread is not None:
            self._queue.join()
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        return self._error

    def take_seconds(self) -> tuple[float, int]:
        """Seconds spent in jobs, and jobs run, since the last call."""
        with self._lock:
            taken = (self._seconds, self._jobs)
            self._seconds, self._jobs = 0.0, 0
        return taken

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._run_one(*item)
            finally:
                self._queue.task_done()

    def _run_one(self, job: Callable[[], object], future: Future[object]) -> None:
        if self._error is not None:
            future.set_exception(WriterFailed("an earlier storage write failed"))
            return
        start = time.perf_counter()
        try:
            future.set_result(job())
        except BaseException as error:  # noqa: BLE001  handed to the main thread
            log.error("storage write failed: %s", error)
            self._error = error
            future.set_exception(error)
        finally:
            with self._lock:
                self._seconds += time.perf_counter() - start
                self._jobs += 1
