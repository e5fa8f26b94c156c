"""Run a job function in a child process, with the same ``callback`` / ``cancel_token`` contract as in-thread.

A compile holds Python's GIL for most of its time; run in a thread of the GUI process it stalls the
event loop for hundreds of milliseconds. :func:`run_in_process` starts the function in a child
(``forkserver``: forked from a clean server process, never from the multithreaded GUI), relays its
progress events and log records, forwards cancellation, and returns its result or re-raises its
error in the calling thread. The child runs at a lower CPU priority so the GUI wins on a busy machine.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import queue
import threading
from logging.handlers import QueueHandler
from typing import Any

from compiler_core.errors import ERROR_CODES, CancelledError, InternalError, QBCompilerError
from compiler_core.progress import CancelToken, ProgressEvent

logger = logging.getLogger(__name__)

POLL_S = 0.05
KILL_AFTER_CANCEL_S = 15.0
CHILD_NICENESS = 5
_PRELOAD = ["qbstudio.tasks"]
_context: Any = None


def _mp_context():
    global _context
    if _context is None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        _context = multiprocessing.get_context(method)
        if method == "forkserver":
            _context.set_forkserver_preload(_PRELOAD)
    return _context


def warm_up() -> None:
    """Start the forkserver now (it imports the compiler once), so the first compile starts at once."""
    if _mp_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def run_in_process(target: str, *args: Any, callback=None, cancel_token: CancelToken | None = None,
                   **kwargs: Any) -> Any:
    """Call ``module:function`` (``target``) with ``args``/``kwargs`` in a child process.

    Raises:
        CancelledError: the job was cancelled.
        QBCompilerError: the child raised one (same class, message, hint and fields).
        InternalError: the child raised anything else or died.
    """
    token = cancel_token or CancelToken()
    context = _mp_context()
    messages, cancel = context.Queue(), context.Event()
    child = context.Process(target=_child_main, args=(target, args, kwargs, messages, cancel), daemon=True,
                            name=f"qbstudio-{target.rsplit(':', 1)[-1]}")
    child.start()
    try:
        return _relay(child, messages, cancel, token, callback)
    finally:
        _stop(child)


def _relay(child, messages, cancel, token: CancelToken, callback) -> Any:
    cancel_deadline = None
    while True:
        if token.cancelled and cancel_deadline is None:
            cancel.set()
            cancel_deadline = _now() + KILL_AFTER_CANCEL_S
        try:
            kind, payload = messages.get(timeout=POLL_S)
        except queue.Empty:
            if cancel_deadline is not None and _now() > cancel_deadline:
                raise CancelledError("Cancelled by the user; nothing was written.") from None
            if not child.is_alive() and messages.empty():
                raise InternalError(f"The compiler process ended unexpectedly (exit code {child.exitcode}).",
                                    hint="See the log; please report it.") from None
            continue
        if kind == "progress" and callback is not None:
            callback(ProgressEvent(**payload))
        elif kind == "log":
            logging.getLogger(payload.name).handle(payload)
        elif kind == "result":
            return payload
        elif kind == "error":
            raise _rebuild_error(payload)


def _now() -> float:
    import time

    return time.monotonic()


def _stop(child) -> None:
    child.join(timeout=2)
    if child.is_alive():
        logger.warning("terminating compiler process %s", child.pid)
        child.terminate()
        child.join(timeout=5)


def _rebuild_error(payload: dict[str, Any]) -> Exception:
    data = dict(payload)
    code = data.pop("code", None)
    kind = ERROR_CODES.get(code)
    if kind is None:
        return InternalError(data.get("message", "unknown error"), hint=data.get("hint", ""),
                             details=data.get("traceback", ""))
    message, hint = data.pop("message", ""), data.pop("hint", "")
    return kind(message, hint=hint, **data)


# ---------------------------------------------------------------- child side


def _child_main(target: str, args: tuple, kwargs: dict, messages, cancel) -> None:
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICENESS)
    _forward_logging(messages)
    token = CancelToken()
    threading.Thread(target=lambda: (cancel.wait(), token.cancel()), daemon=True).start()
    threading.Thread(target=_cancel_when_parent_dies, args=(token,), daemon=True).start()
    module, name = target.split(":")
    function = getattr(importlib.import_module(module), name)
    try:
        result = function(*args, callback=lambda event: messages.put(("progress", event.to_dict())),
                          cancel_token=token, **kwargs)
    except QBCompilerError as error:
        messages.put(("error", {**error.to_dict(), "code": error.code}))
    except BaseException as error:  # noqa: BLE001 - everything goes back to the GUI
        import traceback

        messages.put(("error", {"message": f"{type(error).__name__}: {error}",
                                "traceback": "".join(traceback.format_exception(error))}))
    else:
        messages.put(("result", result))
    messages.close()
    messages.join_thread()


def _cancel_when_parent_dies(token: CancelToken) -> None:
    """Cancel the job if the workbench dies (kill -9, a crash): the child compiled to the end for nobody and wrote
    an MXQ into a run folder no project records. Cancelling leaves no file, as a Cancel does."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()  # returns when the parent's end of the child's pipe closes, that is when it exits
    logger.warning("the workbench is gone: cancelling %s", multiprocessing.current_process().name)
    token.cancel()


def _forward_logging(messages) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(QueueHandler(_LogQueue(messages)))
    root.setLevel(logging.INFO)


class _LogQueue:
    """Adapts the message queue to what QueueHandler expects (``put_nowait`` of a record)."""

    def __init__(self, messages) -> None:
        self._messages = messages

    def put_nowait(self, record: logging.LogRecord) -> None:
        self._messages.put(("log", record))
