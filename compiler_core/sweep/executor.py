"""Where sweep points run: the executor interface, a local process pool (the default) and in-process runs.

An executor takes :class:`PointTask` objects and yields one outcome dict per task as it finishes
(in completion order). Each point is one ``mxq_compile_from_mblt`` call with the point's config
file, so a point compiled here and the point's reproducing ``qbcompiler compile`` command go
through the same code with the same arguments. Progress events of a point reach the caller's
``on_event(index, event)``; cancellation reaches every running point through a shared flag and
stops it at its next check (a point already written stays).
"""

from __future__ import annotations

import logging
import multiprocessing
import queue as queue_module
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

from compiler_core.errors import ArgumentError, CancelledError, InternalError, QBCompilerError
from compiler_core.progress import CancelToken, ProgressEvent, Reporter

logger = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 2
_POLL_SECONDS = 0.1

EventCallback = Callable[[int, ProgressEvent], None]


@dataclass(frozen=True)
class PointTask:
    """One compile of a sweep: the arguments of its ``mxq_compile_from_mblt`` call.

    Attributes:
        index: the point's index in the sweep.
        name: the point's name (``point-03``).
        mblt: absolute path of the MBLT every point compiles.
        config_path: the point's resolved config file.
        calib_data_path: calibration data paths (``None`` with random calibration).
        save_path: the point's MXQ.
    """

    index: int
    name: str
    mblt: str
    config_path: str
    calib_data_path: tuple[str, ...] | None
    save_path: str


class SweepExecutor(Protocol):
    """Runs sweep points; yields one outcome (see :func:`compile_point`) per task as each finishes."""

    def run(self, tasks: Sequence[PointTask], *, on_event: EventCallback,
            cancel_token: CancelToken) -> Iterator[dict[str, Any]]:
        """Run ``tasks``; stop starting new ones and stop running ones once ``cancel_token`` is set."""
        ...


def compile_point(task: PointTask, reporter: Reporter) -> dict[str, Any]:
    """Compile one point; never raises: failures come back as ``status`` ``failed`` or ``cancelled``.

    Returns:
        ``{"index", "status", "seconds", "result"}`` with the compile's ``to_dict()`` and
        ``int16_layers`` on success, or ``{"index", "status", "seconds", "error"}`` on failure.
    """
    from compiler_core.api import mxq_compile_from_mblt

    started = time.perf_counter()
    try:
        reporter.check()
        result = mxq_compile_from_mblt(task.mblt, calib_data_path=list(task.calib_data_path or []) or None,
                                       save_path=task.save_path, compile_config=task.config_path,
                                       callback=reporter)
    except CancelledError as error:
        return _failure(task, "cancelled", error, started)
    except QBCompilerError as error:
        return _failure(task, "failed", error, started)
    except Exception as error:  # a compiler bug on one point must not end the other points
        logger.debug("sweep point %s crashed", task.name, exc_info=True)
        return _failure(task, "failed", InternalError(f"Unexpected {type(error).__name__}: {error}."), started)
    int16_layers = sum(1 for row in result.quantize.model.layer_table() if row["output_bits"] == 16)
    return {"index": task.index, "status": "ok", "seconds": time.perf_counter() - started,
            "result": {**result.to_dict(), "int16_layers": int16_layers}}


def _failure(task: PointTask, status: str, error: QBCompilerError, started: float) -> dict[str, Any]:
    return {"index": task.index, "status": status, "seconds": time.perf_counter() - started,
            "error": error.to_dict()}


class InProcessExecutor:
    """Runs the points one after another in this process (debugging, or when processes are unwanted)."""

    def run(self, tasks: Sequence[PointTask], *, on_event: EventCallback,
            cancel_token: CancelToken) -> Iterator[dict[str, Any]]:
        """See :class:`SweepExecutor`."""
        for task in tasks:
            reporter = Reporter(lambda event, index=task.index: on_event(index, event), cancel_token)
            yield compile_point(task, reporter)


class LocalProcessExecutor:
    """Runs points in a pool of ``max_workers`` worker processes (spawned: no state inherited from the caller).

    Each worker limits numpy's BLAS to one thread (the workers already share the cores).

    Args:
        max_workers: Points compiled at once (default 2).
    """

    def __init__(self, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        if max_workers < 1:
            raise ArgumentError(f"max_workers must be at least 1, got {max_workers}.", hint="Pass --workers 1 or more.")
        self.max_workers = max_workers

    def run(self, tasks: Sequence[PointTask], *, on_event: EventCallback,
            cancel_token: CancelToken) -> Iterator[dict[str, Any]]:
        """See :class:`SweepExecutor`."""
        context = multiprocessing.get_context("spawn")
        events, cancel_flag = context.Queue(), context.Event()
        workers = min(self.max_workers, max(1, len(tasks)))
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                 initargs=(events, cancel_flag)) as pool:
            futures = {pool.submit(_worker_point, task): task for task in tasks}
            pending: set[Future] = set(futures)
            while pending:
                done, pending = wait(pending, timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
                _drain(events, on_event)
                if cancel_token.cancelled and not cancel_flag.is_set():
                    cancel_flag.set()
                    for future in pending:
                        future.cancel()
                for future in done:
                    yield _outcome(future, futures[future])
            _drain(events, on_event)


def _outcome(future: Future, task: PointTask) -> dict[str, Any]:
    if future.cancelled():
        return _failure(task, "cancelled", CancelledError("Cancelled before it started."), time.perf_counter())
    try:
        return future.result()
    except BrokenProcessPool as error:  # a worker died (out of memory, killed)
        return _failure(task, "failed", InternalError(f"The worker process compiling {task.name} died: {error}.",
                                                      hint="Use fewer workers (--workers 1) if memory is short."),
                        time.perf_counter())


def _drain(events, on_event: EventCallback) -> None:
    while True:
        try:
            index, event = events.get_nowait()
        except queue_module.Empty:
            return
        on_event(index, ProgressEvent(**event))


_WORKER: dict[str, Any] = {}


def _init_worker(events, cancel_flag) -> None:
    from threadpoolctl import threadpool_limits

    # The pool already runs one point per core: a multi-threaded BLAS in every worker only contends
    # (a 1-D float64 dot of 800k elements took 5x longer with OpenBLAS's default threads on a busy 2-core host).
    _WORKER.update(events=events, cancel=CancelToken(cancel_flag), blas=threadpool_limits(1))


def _worker_point(task: PointTask) -> dict[str, Any]:
    events = _WORKER["events"]
    reporter = Reporter(lambda event: events.put((task.index, event.to_dict())), _WORKER["cancel"])
    return compile_point(task, reporter)


def make_executor(name: str = "local", max_workers: int = DEFAULT_MAX_WORKERS) -> SweepExecutor:
    """The executor called ``name``: ``local`` (process pool) or ``inprocess``.

    Raises:
        ArgumentError: unknown name.
    """
    if name == "local":
        return LocalProcessExecutor(max_workers)
    if name == "inprocess":
        return InProcessExecutor()
    raise ArgumentError(f"Unknown sweep executor '{name}'.", hint="Use local or inprocess.")
