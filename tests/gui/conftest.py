"""GUI test set-up: QtWebEngine is imported and the ``qbnetron`` scheme registered before the QApplication.

pytest-qt creates the QApplication lazily in its ``qapp`` fixture, so registering here, in
``pytest_configure``, is early enough (also in each pytest-xdist worker). The headless Chromium
flags are set by ``tests/conftest.py`` at import time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys

_LEAKY_SHIBOKEN = ("6.12.0",)


def _immortalise_booleans() -> None:
    """Work around shiboken6 6.12.0, whose ``SignalInstance.emit`` drops a reference to ``True``.

    Each Python-side ``emit`` decrements ``True``'s reference count without a matching increment,
    so after a few thousand emits (or at interpreter exit) CPython aborts with "bool_dealloc:
    deallocating True or False". Python 3.12+ makes the booleans immortal; on 3.11 give them a
    reference count no test run can exhaust. Harmless: the booleans are never freed anyway.
    """
    import shiboken6

    if sys.version_info >= (3, 12) or shiboken6.__version__ not in _LEAKY_SHIBOKEN:
        return
    for boolean in (True, False):
        ctypes.c_ssize_t.from_address(id(boolean)).value += 1 << 40


def pytest_configure(config) -> None:
    if importlib.util.find_spec("PySide6") is None:
        return
    try:
        from PySide6 import QtWebEngineWidgets  # noqa: F401  (must be imported before the QApplication)
    except ImportError:
        return
    from qbstudio.netron.scheme import register_scheme

    _immortalise_booleans()
    register_scheme()
