"""Where sweep points run: the executor interface, a local process pool (the default), in-process runs and Ray.

An executor takes :class:`PointTask` objects and yields one outcome dict per task as it finishes
(in completion order). Each point is one ``mxq_compile_from_mblt`` call with the point's config
file, so a point compiled here and the point's reproducing ``qbcompiler compile`` command go
through the same code with the same arguments. Progress events of a point reach the caller's
``on_event(index, event)``; cancellation reaches every running point through a shared flag and
stops it at its next check (a point already written stays).

:class:`RayExecutor` runs the same ``compile_point`` as Ray tasks (the optional ``ray`` extra) on a
local Ray instance or an existing cluster (``address``). On a cluster every node must see the
MBLT, the point configs, the calibration data and the output folder at the same paths (a shared
file system), as with any compile; points report when they finish (no per-stage events).
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
    return {"index": task.index, "status": "ok", "seconds": time.perf_counter() - started,
            "result": {**result.to_dict(), "int16_layers": result.quantize.model.int16_layers()}}


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


class RayExecutor:
    """Runs points as Ray tasks, at most ``max_workers`` at once, each with BLAS on one thread.

    Args:
        max_workers: Points compiled at once (default 2); also the CPUs of a local Ray instance started here.
        address: Ray cluster address (``auto``, ``ray://host:10001`` ...); ``None`` starts a local
            Ray instance for the sweep (and stops it after) unless Ray is already initialised.

    Raises:
        ArgumentError: bad ``max_workers``.
    """

    def __init__(self, max_workers: int = DEFAULT_MAX_WORKERS, address: str | None = None) -> None:
        if max_workers < 1:
            raise ArgumentError(f"max_workers must be at least 1, got {max_workers}.", hint="Pass --workers 1 or more.")
        self.max_workers = max_workers
        self.address = address

    def run(self, tasks: Sequence[PointTask], *, on_event: EventCallback,
            cancel_token: CancelToken) -> Iterator[dict[str, Any]]:
        """See :class:`SweepExecutor`."""
        ray = _import_ray()
        started_here = not ray.is_initialized()
        if started_here:
            _init_ray(ray, self.address, self.max_workers)
        try:
            yield from self._run(ray, tasks, on_event, cancel_token)
        finally:
            if started_here:
                ray.shutdown()

    def _run(self, ray, tasks: Sequence[PointTask], on_event: EventCallback,
             cancel_token: CancelToken) -> Iterator[dict[str, Any]]:
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_point)
        waiting = list(tasks)
        running: dict[Any, PointTask] = {}
        while waiting or running:
            while waiting and len(running) < self.max_workers and not cancel_token.cancelled:
                task = waiting.pop(0)
                on_event(task.index, ProgressEvent("queued", 0, 1, f"{task.name} sent to Ray"))
                running[remote.remote(task)] = task
            if cancel_token.cancelled:
                yield from self._cancel(ray, running, waiting)
                return
            done, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_SECONDS)
            for ref in done:
                yield _ray_outcome(ray, ref, running.pop(ref))

    @staticmethod
    def _cancel(ray, running: dict[Any, PointTask], waiting: list[PointTask]) -> Iterator[dict[str, Any]]:
        for ref in running:
            ray.cancel(ref, force=True)
        for ref, task in running.items():
            outcome = _ray_outcome(ray, ref, task)
            yield outcome if outcome["status"] == "ok" else _failure(task, "cancelled",
                                                                        CancelledError("Cancelled."), time.perf_counter())
        for task in waiting:
            yield _failure(task, "cancelled", CancelledError("Cancelled before it started."), time.perf_counter())


def _import_ray():
    try:
        import ray
    except ImportError as error:
        raise ArgumentError("The Ray executor needs the optional 'ray' package.",
                            hint="Install it with `pip install qbstudio[ray]` (or `pip install ray`), "
                                 "or use --executor local.") from error
    return ray


def _init_ray(ray, address: str | None, max_workers: int) -> None:
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None:
        options["num_cpus"] = max_workers
    try:
        ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ArgumentError(f"Cannot start or reach Ray{f' at {address}' if address else ''}: {error}",
                            hint="Check --ray-address, or leave it out to start a local Ray instance.") from error


def _ray_point(task: PointTask) -> dict[str, Any]:
    """Body of one Ray task: compile the point with BLAS on one thread; no progress events or cancel flag."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return compile_point(task, Reporter(lambda event: None, CancelToken()))


def _ray_outcome(ray, ref, task: PointTask) -> dict[str, Any]:
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return _failure(task, "cancelled", CancelledError("Cancelled."), time.perf_counter())
    except ray.exceptions.RayError as error:  # the worker died or Ray lost the task
        return _failure(task, "failed", InternalError(f"Ray could not run {task.name}: {type(error).__name__}: {error}.",
                                                      hint="Check the Ray cluster's logs; try --executor local."),
                        time.perf_counter())


EXECUTORS = ("local", "inprocess", "ray")


def make_executor(name: str = "local", max_workers: int = DEFAULT_MAX_WORKERS,
                  ray_address: str | None = None) -> SweepExecutor:
    """The executor called ``name``: ``local`` (process pool), ``inprocess`` or ``ray``.

    ``ray_address`` is the Ray cluster for ``ray`` (``None``: a local Ray instance).

    Raises:
        ArgumentError: unknown name.
    """
    if name == "local":
        return LocalProcessExecutor(max_workers)
    if name == "inprocess":
        return InProcessExecutor()
    if name == "ray":
        return RayExecutor(max_workers, ray_address)
    raise ArgumentError(f"Unknown sweep executor '{name}'.", hint="Use local, inprocess or ray.")
