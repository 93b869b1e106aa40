"""Ctrl-C that stops the tuner between trials instead of in the middle of one."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType

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
