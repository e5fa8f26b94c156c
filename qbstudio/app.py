"""Entry point: ``qbstudio [PROJECT_OR_MODEL]`` / ``python -m qbstudio``.

Order matters here: display check, Chromium flags (``--no-sandbox`` as root), logging, the
QtWebEngine import and the ``qbnetron`` scheme registration all happen before the QApplication.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from logging.handlers import RotatingFileHandler
from pathlib import Path

from qbstudio.state.preferences import AppDirs

logger = logging.getLogger(__name__)

CHROMIUM_FLAGS = "QTWEBENGINE_CHROMIUM_FLAGS"
NO_DISPLAY_MESSAGE = ("qbstudio: no display found (DISPLAY and WAYLAND_DISPLAY are unset). "
                      "Run it on a desktop, or headless with QT_QPA_PLATFORM=offscreen (or under xvfb-run).\n")
_STARTED = time.perf_counter()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line arguments."""
    from compiler_core import __version__

    parser = argparse.ArgumentParser(prog="qbstudio", description="qb Studio: the qb Compiler workbench.")
    parser.add_argument("--version", action="version", version=f"qbstudio {__version__}")
    parser.add_argument("path", nargs="?", help="a .qbproj project or a model file to open")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--smoke-exit-after-ready", action="store_true",
                        help="exit once the window is shown, or once PATH's model and graph are ready "
                             "(start-up timing, CI)")
    parser.add_argument("--check-setup", action="store_true",
                        help="print versions, components and folders, compile the sample as a test, and exit")
    parser.add_argument("--check-setup-output", metavar="DIR", help="keep the --check-setup test compile in DIR")
    return parser.parse_args(argv)


def has_display(environ: dict[str, str] | os._Environ = os.environ, platform: str = sys.platform) -> bool:
    """Whether Qt can open a window: a platform plugin is forced, or an X11/Wayland display exists."""
    if not platform.startswith("linux") or environ.get("QT_QPA_PLATFORM"):
        return True
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def chromium_flags(current: str, is_root: bool) -> str:
    """Chromium's flags with ``--no-sandbox`` added when running as root (Chromium refuses otherwise)."""
    flags = current.split()
    if is_root and "--no-sandbox" not in flags:
        flags.append("--no-sandbox")
    return " ".join(flags)


def configure_logging(dirs: AppDirs, level: str) -> Path:
    """Log to the user log folder (rotating) and to stderr for warnings; returns the log file."""
    dirs.log.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.setLevel(level)
    file_handler = RotatingFileHandler(dirs.log_file, maxBytes=2_000_000, backupCount=3, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    root.addHandler(file_handler)
    root.addHandler(console)
    return dirs.log_file


def install_exception_hooks(window) -> None:
    """Unexpected exceptions: log them, save the project, and show a dialog; the app keeps running."""
    from PySide6.QtCore import QTimer

    from qbstudio import dialogs

    def hook(kind, error, trace) -> None:
        logger.critical("unexpected error", exc_info=(kind, error, trace))
        window.emergency_save()
        if issubclass(kind, KeyboardInterrupt):
            window.close()
            return
        dialogs.show_error(window, "Unexpected error", error.with_traceback(trace))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        QTimer.singleShot(0, lambda: hook(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = hook
    threading.excepthook = thread_hook


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workbench; returns the exit status."""
    args = parse_args(argv)
    if args.check_setup:  # no window: works without a display
        from qbstudio.widgets.setup_check import run_check

        return run_check(AppDirs.default(), args.check_setup_output)
    if not has_display():
        sys.stderr.write(NO_DISPLAY_MESSAGE)
        return 2
    os.environ[CHROMIUM_FLAGS] = chromium_flags(os.environ.get(CHROMIUM_FLAGS, ""),
                                                hasattr(os, "geteuid") and os.geteuid() == 0)
    dirs = AppDirs.default()
    log_file = configure_logging(dirs, args.log_level)
    logger.info("qb Studio starting; log file %s", log_file)
    return _run(args, dirs)


def _run(args: argparse.Namespace, dirs: AppDirs) -> int:
    from qbstudio._compat import guard_none_refcount, skip_feature_source_scan
    from qbstudio.deferred_imports import defer_sympy

    guard_none_refcount()
    defer_sympy()  # before onnx-ir is imported: SymPy loads on the first symbolic shape expression only
    from PySide6 import QtWebEngineWidgets  # noqa: F401  (must be imported before the QApplication)

    skip_feature_source_scan()
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from qbstudio.netron import register_scheme

    register_scheme()
    app = QApplication(sys.argv[:1])
    app.setApplicationName("qb Studio")
    app.setOrganizationName("qbstudio")
    from qbstudio.main_window import MainWindow

    window = MainWindow(dirs, defer_workbench=True)  # the panels (onnx, pyqtgraph) are built after the first show
    install_exception_hooks(window)
    window.show()
    if args.path:
        window.workbench_built.connect(lambda: window.open_path(args.path))
    if args.smoke_exit_after_ready and args.path:  # ready = the model parsed and its graph rendered
        window.model_ready.connect(lambda: _when_graph_ready(
            window, lambda: QTimer.singleShot(0, lambda: _smoke_exit(window, app))))
    elif args.smoke_exit_after_ready:
        window.workbench_built.connect(lambda: _smoke_exit(window, app))
    status = app.exec()
    # The project is saved and the web engine released: let the interpreter's final garbage
    # collections skip the start-up heap (onnx, sympy, pydantic ...), about 1 s of CPU on exit.
    gc.freeze()
    return status


def _when_graph_ready(window, action) -> None:
    if window.graph.is_ready:
        action()
    else:
        window.graph.ready.connect(action)


def _smoke_exit(window, app) -> None:
    elapsed = time.perf_counter() - _STARTED
    shown = (window.shown_at or time.perf_counter()) - _STARTED
    from qbstudio.deferred_imports import DEFERRED, is_deferred

    deferred = ", ".join(name for name in DEFERRED if is_deferred(name)) or "none"
    sys.stdout.write(f"qbstudio window shown after {shown:.2f} s\n"
                     f"qbstudio ready: window shown={window.isVisible()} after {elapsed:.2f} s in-process\n"
                     f"qbstudio modules not imported yet: {deferred}\n")
    sys.stdout.flush()
    window.close()
    app.quit()
