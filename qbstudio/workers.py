"""Cooperative background jobs: a function run in a QThread with progress events, cancel and results as signals.

The function receives ``callback=`` and ``cancel_token=`` keyword arguments, the same pair every
``compiler_core`` API takes, so a compile or a parse reports progress and stops between steps.
The :class:`Worker` object stays in the GUI thread and only its ``run`` executes in a
:class:`JobThread`: signals emitted from the job thread are then queued to the GUI thread for
every receiver, including lambdas (a worker moved to the job thread would call lambdas there).
Progress is throttled (stage changes and the last unit always pass) so a fast stage cannot flood
the GUI thread with queued signals.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from compiler_core.errors import CancelledError
from compiler_core.progress import CancelToken, ProgressEvent

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.05


class Worker(QObject):
    """Runs ``function(*args, callback=..., cancel_token=..., **kwargs)`` once, in whatever thread it lives in.

    Signals:
        progress(object): a :class:`~compiler_core.progress.ProgressEvent`.
        succeeded(object): the function's return value.
        failed(object): the exception it raised (not for a cancel).
        cancelled(): it stopped because :meth:`cancel` was called.
        finished(): after any of the three outcomes.
    """

    progress = Signal(object)
    succeeded = Signal(object)
    failed = Signal(object)
    cancelled = Signal()
    finished = Signal()

    def __init__(self, name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.name = name
        self.token = CancelToken()
        self._function, self._args, self._kwargs = function, args, kwargs
        self._last_emit = 0.0
        self._last_stage = ""
        self.started_at = 0.0

    def cancel(self) -> None:
        """Ask the function to stop at its next check (thread-safe)."""
        logger.info("%s: cancel requested", self.name)
        self.token.cancel()

    @Slot()
    def run(self) -> None:
        """Call the function and emit the outcome."""
        self.started_at = time.perf_counter()
        try:
            result = self._function(*self._args, callback=self._report, cancel_token=self.token, **self._kwargs)
        except CancelledError:
            logger.info("%s: cancelled", self.name)
            self.cancelled.emit()
        except Exception as error:  # noqa: BLE001 - every failure is shown to the user
            if self.token.cancelled:
                self.cancelled.emit()
            else:
                logger.info("%s failed: %s", self.name, error, exc_info=not hasattr(error, "code"))
                self.failed.emit(error)
        else:
            self.succeeded.emit(result)
        finally:
            self.finished.emit()

    def _report(self, event: ProgressEvent) -> None:
        now = time.perf_counter()
        boundary = event.stage != self._last_stage or (event.total and event.done >= event.total)
        if boundary or now - self._last_emit >= PROGRESS_INTERVAL_S:
            self._last_emit, self._last_stage = now, event.stage
            self.progress.emit(event)


class JobThread(QThread):
    """A thread that runs one :class:`Worker` (which stays owned by the GUI thread)."""

    def __init__(self, worker: Worker, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.worker = worker

    def run(self) -> None:  # noqa: D102 (QThread override)
        self.worker.run()


class JobRunner(QObject):
    """Owns at most one running :class:`Worker` per slot and its thread; cleans both up afterwards.

    Signals:
        busy_changed(str, bool): a slot started or finished a job.
    """

    busy_changed = Signal(str, bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._jobs: dict[str, tuple[Worker, QThread]] = {}

    def start(self, slot: str, worker: Worker) -> Worker:
        """Run ``worker`` in a new thread under ``slot``.

        Raises:
            RuntimeError: a job is already running in ``slot``.
        """
        if self.is_busy(slot):
            raise RuntimeError(f"A {slot} job is already running.")
        worker.setParent(self)  # Qt-owned: deleted by deleteLater in this thread, never by the GC elsewhere
        thread = JobThread(worker, self)
        thread.setObjectName(f"qbstudio-{slot}")
        worker.finished.connect(self._on_worker_finished)  # queued after the outcome signal's slots
        thread.finished.connect(thread.deleteLater)
        self._jobs[slot] = (worker, thread)
        thread.start()
        self.busy_changed.emit(slot, True)
        return worker

    def is_busy(self, slot: str) -> bool:
        """Whether a job runs in ``slot``."""
        return slot in self._jobs

    def worker(self, slot: str) -> Worker | None:
        """The running worker of ``slot``, if any."""
        job = self._jobs.get(slot)
        return job[0] if job else None

    def cancel(self, slot: str) -> None:
        """Cancel the job in ``slot`` (no-op when idle)."""
        job = self._jobs.get(slot)
        if job:
            job[0].cancel()

    def shutdown(self, timeout_ms: int = 30_000) -> None:
        """Cancel every job and wait for the threads to end (application exit)."""
        for slot, (worker, thread) in list(self._jobs.items()):
            if not thread.isRunning():
                continue
            worker.cancel()
            if not thread.wait(timeout_ms):
                logger.warning("%s job did not stop within %d ms", slot, timeout_ms)

    @Slot()
    def _on_worker_finished(self) -> None:
        worker = self.sender()
        for slot, (job_worker, _thread) in list(self._jobs.items()):
            if job_worker is worker:
                del self._jobs[slot]
                job_worker.deleteLater()
                self.busy_changed.emit(slot, False)


def import_modules(names: tuple[str, ...]) -> None:
    """Import ``names`` ahead of their use (a warm-up step of the deferred start-up).

    A failure is logged here; the code that needs the module imports it again and reports the error.
    """
    started = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported where the module is needed
            logger.exception("preloading %s failed", name)
    logger.debug("preloaded %s in %.2f s", ", ".join(names), time.perf_counter() - started)
