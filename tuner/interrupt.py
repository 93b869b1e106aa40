"""Ctrl-C that stops the tuner between trials instead of in the middle of one."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

log = logging.getLogger(__name__)


class StopRequest:
    """The first SIGINT sets ``requested`` (the loop finishes the trial in hand, records it and
    stops); a second one raises KeyboardInterrupt as usual. Outside the main thread (where
    Python cannot install handlers) it only serves as a flag."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None
        self._installed = False

    def request(self) -> None:
        self.requested = True

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("Ctrl-C: stopping after the current trial (press again to abort at once)")

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False


def ignore_sigint() -> None:
    """For child processes: Ctrl-C reaches the whole process group, but only the parent decides."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
