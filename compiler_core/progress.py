"""Progress events and cancellation shared by every stage, the CLI's JSONL channel and the GUI."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from compiler_core.errors import CancelledError


@dataclass(frozen=True)
class ProgressEvent:
    """One progress report: ``done`` of ``total`` units of ``stage`` (``total`` 0 = unknown)."""

    stage: str
    done: int
    total: int
    message: str = ""

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


ProgressCallback = Callable[[ProgressEvent], None]


class CancelToken:
    """Thread-safe cancellation flag; stages call :meth:`raise_if_cancelled` between units of work.

    Args:
        event: The flag to hold, any object with ``set()`` and ``is_set()``; a new
            ``threading.Event`` if ``None``. A ``multiprocessing`` event lets one token cancel work
            in worker processes (the sweep's process pool does this).
    """

    def __init__(self, event: Any = None) -> None:
        self._event = event if event is not None else threading.Event()

    def cancel(self) -> None:
        """Ask every stage holding this token to stop at its next check."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._event.is_set()

    def raise_if_cancelled(self, stage: str = "") -> None:
        """Raise :class:`CancelledError` if cancellation was requested."""
        if self._event.is_set():
            raise CancelledError("Cancelled by the user; nothing was written.", stage=stage or None)


class Reporter:
    """Bundles the progress callback and the cancel token that a pipeline passes to its stages.

    Args:
        callback: Receives every :class:`ProgressEvent`; ``None`` discards them.
        cancel_token: Checked by :meth:`check` and on every :meth:`advance`.
    """

    def __init__(self, callback: ProgressCallback | None = None, cancel_token: CancelToken | None = None):
        self.callback = callback
        self.cancel_token = cancel_token or CancelToken()
        self._stage = ""
        self._total = 0
        self._done = 0

    def check(self) -> None:
        """Raise :class:`CancelledError` if cancellation was requested."""
        self.cancel_token.raise_if_cancelled(self._stage)

    def emit(self, stage: str, done: int, total: int, message: str = "") -> None:
        """Send one event to the callback (callback errors never break the pipeline)."""
        if self.callback is not None:
            self.callback(ProgressEvent(stage, done, total, message))

    @contextmanager
    def stage(self, name: str, total: int = 0, message: str = "") -> Iterator[Reporter]:
        """Report the start and the end of stage ``name`` with ``total`` units of work."""
        self.check()
        previous = (self._stage, self._total, self._done)
        self._stage, self._total, self._done = name, total, 0
        started = time.perf_counter()
        self.emit(name, 0, total, message or f"{name} started")
        yield self
        self.check()
        elapsed = time.perf_counter() - started
        self.emit(name, total or 1, total or 1, f"{name} finished in {elapsed:.2f} s")
        self._stage, self._total, self._done = previous

    def advance(self, units: int = 1, message: str = "") -> None:
        """Mark ``units`` more units of the current stage done, then check for cancellation."""
        self._done += units
        self.emit(self._stage, self._done, self._total, message)
        self.check()


def as_reporter(callback: ProgressCallback | Reporter | None = None,
                cancel_token: CancelToken | None = None) -> Reporter:
    """Normalise the ``callback`` / ``cancel_token`` pair every public API accepts."""
    if isinstance(callback, Reporter):
        return callback
    return Reporter(callback, cancel_token)
